"""Performance studies behind docs/benchmarks.md: matmul dtypes, decode breakdowns, training
profiles, speed ablations and prefill experiments (`python -m ctr_jax.projects.perf.NAME`).
"""
