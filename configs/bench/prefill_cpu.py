"""CPU benchmark of the chunked prefill: the exact position scan against `decode.chunked_prefill`
on a 512-token prompt at d2_c256 and the paper sizes d5_c1120 and d1_c2048 (random weights),
per chunk size (16, 32, 64, 128, 256) and pass count (1, 2, 3, 4, 8), plus the tolerance mode
(max |c_new - c| <= 1e-4, at most 16 passes, which is exact for chunk 16):

  python -m ctr_jax.bench --config=configs/bench/prefill_cpu.py

Writes the 'prefill_cpu' section of docs/benchmarks.md (tens of minutes on 2 cores; run it on
a quiet machine). With trained weights, where the contraction decides the passes, add the
workdir of a training run, e.g. the quickstart's:

  python -m ctr_jax.main --config=configs/quickstart.py --workdir=/tmp/ctr_quickstart
  python -m ctr_jax.bench --config=configs/bench/prefill_cpu.py \\
      --config.chunked.checkpoint=/tmp/ctr_quickstart

(its rows use that run's model, with the prompt cut to its max_len). Subsets, as tuples:
--config.chunked.sizes="('d5_c1120',)" --config.chunked.chunks='(32, 64)'.
`:runlocal` (accepted by every config) runs tiny.py's toy sizes of this section, printed only.
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs

COMMAND = 'python -m ctr_jax.bench --config=configs/bench/prefill_cpu.py'


def get_config(arg=None):
  if config_lib.parse_arg(arg, runlocal=False).runlocal:  # a CPU smoke run: tiny.py's sizes
    c = bench_configs.tiny()
    c.sections = 'chunked'
    return c
  c = bench_configs.get_base('prefill_cpu', COMMAND)
  c.output = 'docs/benchmarks.md'
  c.sections = 'chunked'
  c.warmup = 1
  c.repeats = 3
  c.peer.enabled = False
  return c
