"""CPU benchmark: CPU-size training (C = 256 and 512, T = 256), the paper's decode pairs, the
PyTorch peer, a 512-token prefill and the scaling exponents.

  python -m ctr_jax.bench --config=configs/bench/cpu.py

Writes the 'cpu' section of docs/benchmarks.md (about 15 minutes on 2 cores). Install the peer
first: pip install -e ".[bench]". Subsets: --config.sections=train,decode. `:runlocal` (accepted
by every config) runs tiny.py's toy sizes instead, printed only.
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs


def get_config(arg=None):
  if config_lib.parse_arg(arg, runlocal=False).runlocal:  # a CPU smoke run: tiny.py's sizes
    return bench_configs.tiny()
  c = bench_configs.get_base('cpu', 'python -m ctr_jax.bench --config=configs/bench/cpu.py')
  c.output = 'docs/benchmarks.md'
  c.repeats = 3
  rows = []
  for width, heads in ((256, 4), (512, 8)):
    common = {'width': width, 'num_heads': heads, 'vocab_size': 4096, 'max_len': 1024}
    rows.append({'label': f't6_c{width}', 'k': 0, 'seq_len': 256, 'batch': 8,
                 'model': {'kind': 'transformer', 'depth': 6, **common}})
    for k in (2, 4):
      rows.append({'label': f'd2_c{width}', 'k': k, 'seq_len': 256, 'batch': 8,
                   'model': {'kind': 'context_ready', 'depth': 2, 'k_unroll': k, **common}})
  # What K and m (backpropagating through the last m of K iterations) cost: d2_c256.
  common = {'width': 256, 'num_heads': 4, 'vocab_size': 4096, 'max_len': 1024}
  for k, m in ((8, 0), (8, 2), (8, 1), (4, 1)):
    rows.append({'label': 'd2_c256', 'k': k, 'm': m, 'seq_len': 256, 'batch': 8,
                 'model': {'kind': 'context_ready', 'depth': 2, 'k_unroll': k, **common}})
  rows.append({'label': 't6_c512 (peer shape)', 'k': 0, 'seq_len': 256, 'batch': 8,
               'model': bench_configs.peer_shape()})
  c.train = rows
  return c
