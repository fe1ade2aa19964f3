"""Paper model D=1, C=2048 with K=10 at block size 1024 (the abstract's single-layer result).

  python -m ctr_jax.main --config=configs/d1_c2048_k10.py --workdir=$WORKDIR \
      --config.data.manual_dir=/path/to/openwebtext

Overrides of the paper recipe (reference section 6.5): K = 10 fixed (k_min = 0), block 1024,
batch 16 (the author's memory limit). CPU smoke run:

  python -m ctr_jax.main --config=configs/d1_c2048_k10.py:runlocal --workdir=/tmp/d1_k10_local
"""

from ctr_jax import config_lib


def get_config(arg=None):
  c = config_lib.paper_config('d1_c2048', None, k_unroll=10, k_min=0,
                              remat=config_lib.PAPER_REMAT['d1_c2048_k10'])
  c.data.seq_len = 1024
  c.batch_size = 16
  if config_lib.parse_arg(arg, runlocal=False).runlocal:
    config_lib.shrink_for_cpu(c)
  return c
