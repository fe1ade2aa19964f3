"""CPU benchmark in bfloat16 mixed precision, both sides: training and `generate` at the peer's
shape, our side with `dtype='bfloat16'` (float32 parameters and AdamW), the PyTorch peer under
`torch.autocast('cpu', torch.bfloat16)`.

  python -m ctr_jax.bench --config=configs/bench/cpu_bf16.py

Writes the 'cpu_bf16' section of docs/benchmarks.md (about 5 minutes on 2 cores). Meaningful on
a CPU whose matrix units take bfloat16 (AMX, AVX-512 BF16): there the products run several times
faster than in float32; elsewhere bfloat16 is slower than float32 and the run says so. Issue 20's
goals are judged in float32 (configs/bench/cpu.py); this is the same comparison at the other
precision both stacks offer. `:runlocal` runs tiny.py's toy sizes instead, printed only.
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs


def get_config(arg=None):
  if config_lib.parse_arg(arg, runlocal=False).runlocal:
    c = bench_configs.tiny()
    c.dtype = 'bfloat16'
    return c
  c = bench_configs.get_base('cpu_bf16', 'python -m ctr_jax.bench --config=configs/bench/cpu_bf16.py')
  c.output = 'docs/benchmarks.md'
  c.dtype = 'bfloat16'
  c.repeats = 3
  c.sections = 'train,generate'
  common = {'width': 512, 'num_heads': 8, 'vocab_size': 4096, 'max_len': 1024}
  c.train = [
      {'label': 'd2_c512', 'k': 2, 'seq_len': 256, 'batch': 8,
       'model': {'kind': 'context_ready', 'depth': 2, 'k_unroll': 2, **common}},
      {'label': 't6_c512 (peer shape)', 'k': 0, 'seq_len': 256, 'batch': 8,
       'model': bench_configs.peer_shape()},
  ]
  return c
