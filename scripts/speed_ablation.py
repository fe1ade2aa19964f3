"""What the speed work measured: the peer-shape baseline with each choice switched back, one at
a time (medians after warm-up; the tables in docs/benchmarks.md).

  python scripts/speed_ablation.py            # training step
  python scripts/speed_ablation.py --decode   # greedy decode, ms per token at batch 1 and 8

Training rows: the current code; [in, out] dense kernels (the previous layout); attention by
autodiff of the plain einsum formula (the previous kernel); exact-erf GELU instead of GPT-2's tanh
form; XLA:CPU without YNNPACK dot fusions. Decode rows: the current code; [in, out] kernels;
three query/key/value products per layer instead of the one `attention.fuse_qkv` prepares.
Each row runs in a fresh process, so XLA flags and monkeypatches do not leak between rows.
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
from ctr_jax.models import attention  # pylint: disable=g-import-not-at-top,wrong-import-position
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


def decode_ms(batch: int, **model_overrides) -> float:
  return suite.decode_latency(base.peer_shape(**model_overrides), batch=batch, prompt_len=16,
                              new_tokens=64, warmup=2, repeats=5)['ms_per_token']


OVERRIDES = {'in_out': {'kernel_layout': 'in_out'}, 'exact_gelu': {'activation': 'gelu'}}


def child(what: str, row: str):
  if row == 'autodiff_attention':
    attention.dot_product_attention = autodiff_attention
  if row == 'unfused_qkv':
    attention.fuse_qkv = lambda variables: variables
  overrides = OVERRIDES.get(row, {})
  if what == 'train':
    print(f'{step_ms(**overrides):.1f}')
  else:
    print(f'{decode_ms(1, **overrides):.3f} {decode_ms(8, **overrides):.3f}')


def run_row(what, row, xla_flags=''):
  env = {**os.environ, 'XLA_FLAGS': xla_flags}
  out = subprocess.run([sys.executable, __file__, '--child', what, row], env=env,
                       capture_output=True, text=True, check=True).stdout.split('\n')
  return [float(x) for x in [line for line in out if line.strip()][-1].split()]


def main():
  if sys.argv[1:2] == ['--child']:
    child(*sys.argv[2:4])
    return
  if '--decode' in sys.argv[1:]:
    print('| variant of t6_c512 (peer shape), greedy decode | B = 1 ms/token | B = 8 ms/token |')
    print('|---|---|---|')
    for label, row in [('current code', 'current'), ('[in, out] kernels', 'in_out'),
                       ('separate q/k/v products (no `fuse_qkv`)', 'unfused_qkv')]:
      b1, b8 = run_row('decode', row)
      print(f'| {label} | {b1:.2f} | {b8:.2f} |', flush=True)
    return
  rows = [('current code', 'current', ''),
          ('[in, out] kernels (previous layout)', 'in_out', ''),
          ('attention by autodiff (previous kernel)', 'autodiff_attention', ''),
          ('exact-erf GELU', 'exact_gelu', ''),
          ('no YNNPACK dot fusions', 'current', '--xla_cpu_experimental_ynn_fusion_type=')]
  print('| variant of t6_c512 (peer shape), T = 256, B = 8 | step ms | tokens/s |')
  print('|---|---|---|')
  for label, row, xla_flags in rows:
    (ms,) = run_row('train', row, xla_flags)
    print(f'| {label} | {ms:.0f} | {8 * 256 / ms * 1e3:.0f} |', flush=True)


if __name__ == '__main__':
  main()
