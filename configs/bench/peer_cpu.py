"""Issue 20's two CPU goals alone, in float32: training and `generate` at the peer's shape against
the PyTorch peer, paired, without the rest of the cpu section (decode pairs, prefill, scaling).

  python -m ctr_jax.bench --config=configs/bench/peer_cpu.py

Writes the 'peer_cpu' section of docs/benchmarks.md (about 5 minutes on 2 cores): a quick check
of the goals after a change, on whatever machine this is, beside the full `cpu` section. Install
the peer first: pip install -e ".[bench]". `:runlocal` runs tiny.py's toy sizes, printed only.
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs


def get_config(arg=None):
  if config_lib.parse_arg(arg, runlocal=False).runlocal:
    return bench_configs.tiny()
  c = bench_configs.get_base('peer_cpu', 'python -m ctr_jax.bench --config=configs/bench/peer_cpu.py')
  c.output = 'docs/benchmarks.md'
  c.repeats = 3
  c.sections = 'train,generate'
  c.train = [{'label': 't6_c512 (peer shape)', 'k': 0, 'seq_len': 256, 'batch': 8,
              'model': bench_configs.peer_shape()}]
  return c
