"""What the training-speed work measured: the peer-shape baseline's train step with each choice
switched back, one at a time (medians after warm-up; the table in docs/benchmarks.md).

  python scripts/attention_ablation.py

Rows: the current code; attention by autodiff of the plain einsum formula (the previous kernel);
exact-erf GELU instead of GPT-2's tanh form; XLA:CPU without YNNPACK dot fusions.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from configs.bench import base  # pylint: disable=g-import-not-at-top,wrong-import-position
from ctr_jax.bench import suite  # pylint: disable=g-import-not-at-top,wrong-import-position
from ctr_jax.models import layers  # pylint: disable=g-import-not-at-top,wrong-import-position


def autodiff_attention(q, k, v, mask, scale):
  """The formula differentiated by JAX (no custom backward), heads grouped in place."""
  b, tq, h, dh = q.shape
  g = k.shape[2]
  q = q.reshape(b, tq, g, h // g, dh)
  acc = layers.accumulation_dtype(q.dtype)
  logits = jnp.einsum('bqgrd,bkgd->bgrqk', q, k, preferred_element_type=acc) * scale
  if mask.ndim == 2:
    mask = mask[None]
  logits = jnp.where(mask[:, None, None], logits, jnp.finfo(acc).min)
  weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum('bgrqk,bkgd->bqgrd', weights, v).reshape(b, tq, h, dh)


def step_ms(**model_overrides) -> float:
  return suite.train_throughput(base.peer_shape(**model_overrides), seq_len=256, batch=8,
                                k_unroll=0, warmup=2, repeats=5)['step_ms']


def main():
  if len(sys.argv) > 1:  # child process: one row
    row = sys.argv[1]
    if row == 'autodiff_attention':
      layers.dot_product_attention = autodiff_attention
    overrides = {'activation': 'gelu'} if row == 'exact_gelu' else {}
    print(f'{step_ms(**overrides):.1f}')
    return
  rows = [('current code', 'current', ''),
          ('attention by autodiff (previous kernel)', 'autodiff_attention', ''),
          ('exact-erf GELU', 'exact_gelu', ''),
          ('no YNNPACK dot fusions', 'current', '--xla_cpu_experimental_ynn_fusion_type=')]
  print('| variant of t6_c512 (peer shape), T = 256, B = 8 | step ms | tokens/s |')
  print('|---|---|---|')
  for label, row, xla_flags in rows:
    env = {**os.environ, 'XLA_FLAGS': xla_flags}
    out = subprocess.run([sys.executable, __file__, row], env=env, capture_output=True,
                         text=True, check=True).stdout.split()[-1]
    ms = float(out)
    print(f'| {label} | {ms:.0f} | {8 * 256 / ms * 1e3:.0f} |', flush=True)


if __name__ == '__main__':
  main()
