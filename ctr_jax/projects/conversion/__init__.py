"""A pretrained transformer converted to a context-ready model and fine-tuned against the
original (`python -m ctr_jax.projects.conversion`).
"""
