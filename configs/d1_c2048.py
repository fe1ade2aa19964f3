"""Paper model d1_c2048: context-ready unit of D=1 layer, width C=2048 (K = 5, block 256), on OpenWebText.

  python -m ctr_jax.main --config=configs/d1_c2048.py --workdir=$WORKDIR \
      --config.data.manual_dir=/path/to/openwebtext

Recipe (reference section 6.1): vocabulary 32,000, block 256, batch 64, 100K steps, lr 2e-4,
16 heads; context-ready models use K = 5 with k_min = 2 and lambda = 0.1.
A CPU smoke run of the same config in minutes on the embedded corpus:

  python -m ctr_jax.main --config=configs/d1_c2048.py:runlocal --workdir=/tmp/d1_c2048_local
"""

from ctr_jax import config_lib


def get_config(arg=None):
  return config_lib.paper_config('d1_c2048', arg)
