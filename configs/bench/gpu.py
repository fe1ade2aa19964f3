"""GPU benchmark: the paper's decode pairs in bfloat16 at batch 1 and 8, paper-size training
throughput (T = 1024) and a 512-token parallel prefill; well under 10 minutes on one GPU.

  python -m ctr_jax.bench --config=configs/bench/gpu.py

(launch/bench_gpu.sh runs exactly this.) Writes the 'gpu' section of docs/benchmarks.md. The
PyTorch peer is off: the `bench` extra pins the CPU build of torch. `:runlocal` (accepted by
every config) runs tiny.py's toy sizes on a CPU instead, printed only.
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs


def get_config(arg=None):
  if config_lib.parse_arg(arg, runlocal=False).runlocal:  # a CPU smoke run: tiny.py's sizes
    return bench_configs.tiny()
  c = bench_configs.get_base('gpu', 'python -m ctr_jax.bench --config=configs/bench/gpu.py')
  c.output = 'docs/benchmarks.md'
  c.sections = 'train,decode,prefill'
  c.dtype = 'bfloat16'
  c.warmup = 3
  c.repeats = 10
  c.peak_size = 8192
  c.bandwidth_mb = 2048
  c.peer.enabled = False
  c.decode.new_tokens = 128
  c.decode.matched_model = {}
  rows = []
  for name, k in (('d5_c1120', 5), ('t12_c768', 0), ('d1_c2048', 5), ('t6_c1088', 0)):
    rows.append({'label': name, 'k': k, 'seq_len': 1024, 'batch': 8,
                 'model': {'name': name, 'vocab_size': 32000, 'max_len': 1024,
                           **({'k_unroll': k} if k else {})}})
  c.train = rows
  c.prefill.model = {'name': 'd5_c1120', 'vocab_size': 32000, 'max_len': 1024}
  return c
