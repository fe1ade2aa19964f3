"""Context as parameter updates, on generation: the patched model against the model with its
context, token by token (`python -m ctr_jax.projects.implicit_generation`).
"""
