"""Data layer: TFDS builders, a byte-level BPE tokenizer and the grain input pipeline.

Submodules are imported explicitly (e.g. `from ctr_jax.data import pipeline`) so that
importing this package stays cheap; nothing here imports TensorFlow.
"""
