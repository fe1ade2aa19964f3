"""Paper model t12_c768: baseline RoPE transformer ("roformer") of N=12 layers, width C=768, on OpenWebText.

  python -m ctr_jax.main --config=configs/t12_c768.py --workdir=$WORKDIR \
      --config.data.manual_dir=/path/to/openwebtext

Recipe (reference section 6.1): vocabulary 32,000, block 256, batch 64, 100K steps, lr 2e-4,
16 heads; context-ready models use K = 5 with k_min = 2 and lambda = 0.1.
A CPU smoke run of the same config in minutes on the embedded corpus:

  python -m ctr_jax.main --config=configs/t12_c768.py:runlocal --workdir=/tmp/t12_c768_local
"""

from ctr_jax import config_lib


def get_config(arg=None):
  return config_lib.paper_config('t12_c768', arg)
