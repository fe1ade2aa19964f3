"""One notation legend for the shapes used across ctr_jax.

Docstrings and comments write shapes as `[B, T, C]` with these letters:

  B  batch size (per process unless stated)
  T  sequence length (positions in a training window / prompt)
  S  KV-cache length (maximum positions a decode state can hold)
  C  model width (embedding / residual stream)
  F  MLP hidden width (4C for the paper models)
  H  attention (query) heads;  G  key/value heads (G divides H)
  Dh head dimension (C / H)
  V  vocabulary size
  D  layers in the context-ready unit (the "block")
  N  layers of a plain transformer
  K  fixed-point unroll steps of the context-ready model
  L  layers of a generic stack (D or N)

Vectors named in the paper: e_t token embedding, c_t correction, u_t = e_t + c_t block input,
z_t block output, all [C] per position.
"""
