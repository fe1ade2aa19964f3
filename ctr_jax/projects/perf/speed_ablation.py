"""What the speed work measured: the peer-shape baseline with each choice switched back, one at
a time (medians after warm-up; the tables in docs/benchmarks.md).

  python -m ctr_jax.projects.perf.speed_ablation            # training step
  python -m ctr_jax.projects.perf.speed_ablation --decode   # greedy decode, ms per token at batch 1 and 8
  python -m ctr_jax.projects.perf.speed_ablation --compare current,rope_tables_fused 21   # chosen rows only

Training rows: the current code; [in, out] dense kernels (the previous layout); the previous
hand-written attention kernel (5-D [B, G, R, T, Dh] grouped einsums, manual softmax); attention by
autodiff of the plain einsum formula (the kernel before that); causal query blocks
(`attention_blocks=4`); exact-erf GELU instead of GPT-2's tanh form; the RoPE sin/cos tables
left to XLA:CPU's fusion (recomputed per head and batch row; `kernels.rotation_table`); Flax's
LayerNorm instead of `ctr_jax.models.layer_norm`; XLA:CPU without YNNPACK dot fusions. The training rows share one process and are timed in turn, one step of each per round
(paired: this machine drifts by 10-15% over minutes), except the XLA-flag row, which needs its
own process and is timed beside a fresh 'current code' row. Decode rows: the current code;
[in, out] kernels; three query/key/value products per layer instead of the one
`attention.fuse_qkv` prepares; each in a fresh process.
"""

import contextlib
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.bench import configs as bench_configs
from ctr_jax.bench import suite
from ctr_jax.models import attention, layers
from ctr_jax.ops import kernels
from ctr_jax.projects import paths
from ctr_jax.reporting import timing

ROOT = paths.REPO_ROOT


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


def grouped_5d_attention(q, k, v, mask, scale, causal_blocks=1):
  """The previous hand-written kernel: 5-D grouped einsums, manual softmax, same backward."""
  del causal_blocks
  b, tq, h, dh = q.shape
  g = k.shape[2]
  mask = jnp.broadcast_to(mask if mask.ndim == 3 else mask[None], (b,) + mask.shape[-2:])
  q = jnp.moveaxis(q.reshape(b, tq, g, h // g, dh), 1, 3)
  k, v = jnp.moveaxis(k, 1, 2), jnp.moveaxis(v, 1, 2)

  @jax.custom_vjp
  def core(q, k, v):
    return forward(q, k, v)[0]

  def forward(q, k, v):
    logits = jnp.einsum('bgrqd,bgkd->bgrqk', q, k) * scale
    logits = jnp.where(mask[:, None, None], logits, jnp.finfo(logits.dtype).min)
    e = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    p = e * (1.0 / jnp.sum(e, axis=-1, keepdims=True))
    out = jnp.einsum('bgrqk,bgkd->bgrqd', p, v)
    return out, (q, k, v, p, out)

  def backward(res, d_out):
    q, k, v, p, out = res
    dv = jnp.einsum('bgrqk,bgrqd->bgkd', p, d_out)
    dp = jnp.einsum('bgrqd,bgkd->bgrqk', d_out, v)
    dl = p * (dp - jnp.sum(d_out * out, axis=-1, keepdims=True)) * scale
    return (jnp.einsum('bgrqk,bgkd->bgrqd', dl, k), jnp.einsum('bgrqk,bgrqd->bgkd', dl, q), dv)

  core.defvjp(forward, backward)
  return jnp.moveaxis(core(q, k, v), 3, 1).reshape(b, tq, h, dh)


def paired_step_ms(rows, rounds=7, ratios=False) -> dict:
  """{row: median step ms}, every row's step traced under its own patch, then timed in turn;
  with `ratios`, {row: (median step ms, median over rounds of its time / the first row's)}."""
  runners = {}
  for row in rows:
    with patched(row):
      run = suite.train_step_runner(bench_configs.peer_shape(**OVERRIDES.get(row, {})), seq_len=256,
                                    batch=8, k_unroll=0)[0]
      jax.block_until_ready(run())  # traced and compiled under the patch
    runners[row] = run
  times = timing.interleaved_seconds(runners, warmup=1, repeats=rounds)
  medians = {row: 1e3 * sorted(t)[len(t) // 2] for row, t in times.items()}
  if not ratios:
    return medians
  first = times[rows[0]]
  return {row: (medians[row], timing.median_ratio(t, first)) for row, t in times.items()}


def step_ms(**model_overrides) -> float:
  return suite.train_throughput(bench_configs.peer_shape(**model_overrides), seq_len=256, batch=8,
                                k_unroll=0, warmup=2, repeats=5)['step_ms']


def decode_ms(batch: int, **model_overrides) -> float:
  return suite.decode_latency(bench_configs.peer_shape(**model_overrides), batch=batch, prompt_len=16,
                              new_tokens=64, warmup=2, repeats=5)['ms_per_token']


OVERRIDES = {'in_out': {'kernel_layout': 'in_out'}, 'exact_gelu': {'activation': 'gelu'},
             'causal_blocks': {'attention_blocks': 4}}
def flax_layer_norm(spec, name=None):
  """Flax's LayerNorm (autodiff backward), the norm before `ctr_jax.models.layer_norm`."""
  return nn.LayerNorm(
      epsilon=spec.layer_norm_eps, dtype=layers.compute_dtype(spec),
      param_dtype=layers.param_dtype(spec), name=name)


# row -> (module, attribute, what replaces it while the row is traced)
PATCHES = {'autodiff_attention': (attention, 'dot_product_attention',
                                  lambda q, k, v, mask, scale, causal_blocks=1:
                                  autodiff_attention(q, k, v, mask, scale)),
           'grouped_5d': (attention, 'dot_product_attention', grouped_5d_attention),
           'rope_tables_fused': (kernels, 'rotation_table', lambda table: table),
           'flax_layer_norm': (layers, 'layer_norm', flax_layer_norm)}


@contextlib.contextmanager
def patched(row: str):
  if row not in PATCHES:
    yield
    return
  module, name, replacement = PATCHES[row]
  original = getattr(module, name)
  setattr(module, name, replacement)
  try:
    yield
  finally:
    setattr(module, name, original)


def child(what: str, row: str):
  if row in PATCHES:
    module, name, replacement = PATCHES[row]
    setattr(module, name, replacement)
  if row == 'unfused_qkv':
    attention.fuse_qkv = lambda variables: variables
  overrides = OVERRIDES.get(row, {})
  if what == 'train':
    print(f'{step_ms(**overrides):.1f}')
  else:
    print(f'{decode_ms(1, **overrides):.3f} {decode_ms(8, **overrides):.3f}')


def run_row(what, row, xla_flags=''):
  env = {**os.environ, 'XLA_FLAGS': xla_flags}
  out = subprocess.run([sys.executable, '-m', 'ctr_jax.projects.perf.speed_ablation', '--child', what, row], env=env,
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
  rows = [('current code', 'current'), ('[in, out] kernels (previous layout)', 'in_out'),
          ('5-D grouped attention kernel (previous)', 'grouped_5d'),
          ('attention by autodiff (the kernel before)', 'autodiff_attention'),
          ('causal query blocks (`attention_blocks=4`)', 'causal_blocks'),
          ('exact-erf GELU', 'exact_gelu'),
          ('RoPE sin/cos fused into the rotation (previous)', 'rope_tables_fused'),
          ("Flax's LayerNorm, autodiff backward (previous)", 'flax_layer_norm')]
  if sys.argv[1:2] == ['--compare']:
    # --compare ROW,ROW,... [ROUNDS]: only these rows, paired, each against the first.
    chosen = sys.argv[2].split(',')
    labels = dict((r, label) for label, r in rows)
    unknown = [r for r in chosen if r not in labels]
    if unknown:
      sys.exit(f'--compare: unknown rows {unknown}; allowed: {",".join(labels)}')
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    print(f'| variant of t6_c512 (peer shape), T = 256, B = 8 | step ms | time / first row\'s '
          f'(median of {rounds} paired rounds) |')
    print('|---|---|---|')
    for row, (ms, ratio) in paired_step_ms(chosen, rounds, ratios=True).items():
      print(f'| {labels[row]} | {ms:.0f} | {ratio:.3f} |', flush=True)
    return
  if sys.argv[1:2] == ['--paired_child']:
    for row, ms in paired_step_ms([r for _, r in rows]).items():
      print(f'{row} {ms:.1f}')
    return
  out = subprocess.run([sys.executable, '-m', 'ctr_jax.projects.perf.speed_ablation', '--paired_child'], capture_output=True,
                       text=True, check=True).stdout.split('\n')
  paired = dict(line.split() for line in out if line.strip() and len(line.split()) == 2)
  print('| variant of t6_c512 (peer shape), T = 256, B = 8 | step ms | tokens/s |')
  print('|---|---|---|')
  for label, row in rows:
    ms = float(paired[row])
    print(f'| {label} | {ms:.0f} | {8 * 256 / ms * 1e3:.0f} |', flush=True)
  (current,) = run_row('train', 'current')
  (no_ynn,) = run_row('train', 'current', '--xla_cpu_experimental_ynn_fusion_type=')
  print(f'| no YNNPACK dot fusions (own process; current code there: {current:.0f} ms) | '
        f'{no_ynn:.0f} | {8 * 256 / no_ynn * 1e3:.0f} |', flush=True)


if __name__ == '__main__':
  main()
