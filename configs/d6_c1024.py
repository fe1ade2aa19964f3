"""Paper model d6_c1024: context-ready unit of D=6 layers, width C=1024, on OpenWebText.

  python -m ctr_jax.main --config=configs/d6_c1024.py --workdir=$WORKDIR \
      --config.data.manual_dir=/path/to/openwebtext

Recipe (reference section 6.1): vocabulary 32,000, block 256, batch 64, 100K steps, lr 2e-4,
16 heads; context-ready models use K = 5 with k_min = 2 and lambda = 0.1.
A CPU smoke run of the same config in minutes on the embedded corpus:

  python -m ctr_jax.main --config=configs/d6_c1024.py:runlocal --workdir=/tmp/d6_c1024_local
"""

from ctr_jax import config_lib


def get_config(arg=None):
  return config_lib.paper_config('d6_c1024', arg)
