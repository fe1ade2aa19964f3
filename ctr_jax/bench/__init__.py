"""Benchmarks: training throughput and MFU, decode latency, parallel prefill, scaling, and a
PyTorch peer measured in the same run.

    python -m ctr_jax.bench --config=configs/bench/cpu.py      # writes docs/benchmarks.md rows

Benchmarks are not tests: the test suite only runs `configs/bench/tiny.py`. Every figure is the
median of `repeats` timed runs after `warmup` untimed ones (compilation happens in warm-up).
"""
