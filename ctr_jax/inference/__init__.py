"""Inference with trained models: the exact decode scan, BPTT through it, and diagnostics.

    from ctr_jax.inference import decode
    logits = decode.sequential_logits(model, variables, tokens)   # exact position scan
    out = decode.generate(model, variables, prompt, 8, jax.random.key(0))

`decode`: prefill (exact, chunked fixed point), step decode and sampling with KV caches and the
cached z; `bptt`: the exact sequential forward with a linear-memory custom VJP (training through
it is `config.train.mode='bptt'`); `diagnostics`: how fast the K-unroll contracts.
"""
