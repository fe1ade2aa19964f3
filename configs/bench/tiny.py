"""Every bench section at toy sizes, in about a minute on a CPU: the test suite's smoke run
(launch/bench_gpu.sh has its own, `--smoke`). `:runlocal` (accepted by every config) changes
nothing.

  python -m ctr_jax.bench --config=configs/bench/tiny.py --output=/tmp/ctr_bench/benchmarks.md
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs


def get_config(arg=None):
  config_lib.parse_arg(arg, runlocal=False)  # runlocal: already toy sizes, no change
  return bench_configs.tiny()
