"""The attention kernel's hand-written backward pass against autodiff of the plain formula, and the
accelerator implementations (jax.nn.dot_product_attention) against the CPU kernel."""

import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax import models
from ctr_jax.models import attention
from ctr_jax.ops import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plain_attention(q, k, v, mask, scale):
  b, tq, h, dh = q.shape
  g = k.shape[2]
  k = jnp.repeat(k, h // g, axis=2)
  v = jnp.repeat(v, h // g, axis=2)
  logits = jnp.einsum('bqhd,bkhd->bhqk', q.astype(jnp.float32), k.astype(jnp.float32)) * scale
  logits = jnp.where(mask[:, None], logits, -1e30)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, v.astype(jnp.float32))


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_attention_values_and_gradients_match_autodiff(seed, dtype):
  r = np.random.default_rng(seed)
  b, tq, dh = int(r.integers(1, 3)), int(r.integers(1, 9)), int(r.choice([4, 8]))
  g = int(r.choice([1, 2]))
  h = g * int(r.choice([1, 2, 3]))
  tk = tq + int(r.integers(0, 4))  # a cache longer than the queries (decode / chunked prefill)
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (b, tq, h, dh), dtype)
  k = jax.random.normal(keys[1], (b, tk, g, dh), dtype)
  v = jax.random.normal(keys[2], (b, tk, g, dh), dtype)
  cotangent = jax.random.normal(keys[3], (b, tq, h, dh), jnp.float32)
  offset = tk - tq
  mask = attention.attention_mask(jnp.arange(tq)[None] + offset, jnp.arange(tk)[None],
                               window=int(r.choice([0, 3])))
  scale = dh ** -0.5

  def loss(fn, *qkv):
    return jnp.sum(fn(*qkv, mask, scale).astype(jnp.float32) * cotangent)

  ours, ours_grads = jax.value_and_grad(
      lambda *a: loss(attention.dot_product_attention, *a), argnums=(0, 1, 2))(q, k, v)
  ref, ref_grads = jax.value_and_grad(
      lambda *a: loss(plain_attention, *a), argnums=(0, 1, 2))(
          *(x.astype(jnp.float32) for x in (q, k, v)))
  tol = 1e-4 if dtype == 'float32' else 5e-2
  np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol * 10)
  for a, e in zip(ours_grads, ref_grads):
    assert a.dtype == jnp.dtype(dtype)
    scale_e = float(jnp.max(jnp.abs(e))) + 1e-6
    assert float(jnp.max(jnp.abs(a.astype(jnp.float32) - e))) <= tol * scale_e


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_causal_blocks_skip_only_masked_tiles(seed, dtype):
  """Self-attention cut into query blocks that read only the keys up to their own end equals the
  plain formula over every key, values and gradients, for block counts that do and do not divide
  T, grouped heads and sliding windows."""
  r = np.random.default_rng(100 + seed)
  b, t, dh = int(r.integers(1, 3)), int(r.integers(2, 23)), int(r.choice([4, 8]))
  g = int(r.choice([1, 2]))
  h = g * int(r.choice([1, 2]))
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (b, t, h, dh), dtype)
  k = jax.random.normal(keys[1], (b, t, g, dh), dtype)
  v = jax.random.normal(keys[2], (b, t, g, dh), dtype)
  cotangent = jax.random.normal(keys[3], (b, t, h, dh), jnp.float32)
  positions = jnp.arange(t)[None] + int(r.integers(0, 5))  # offset positions still increase
  mask = attention.attention_mask(positions, positions, window=int(r.choice([0, 3])))
  scale = dh ** -0.5

  def loss(fn, *qkv):
    return jnp.sum(fn(*qkv, mask, scale).astype(jnp.float32) * cotangent)

  ref, ref_grads = jax.value_and_grad(lambda *a: loss(plain_attention, *a), argnums=(0, 1, 2))(
      *(x.astype(jnp.float32) for x in (q, k, v)))
  tol = 1e-4 if dtype == 'float32' else 5e-2
  for blocks in (1, 2, 3, 4):
    fn = lambda *a, blocks=blocks: attention.dot_product_attention(*a, causal_blocks=blocks)
    ours, ours_grads = jax.value_and_grad(lambda *a, fn=fn: loss(fn, *a), argnums=(0, 1, 2))(
        q, k, v)
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol * 10)
    for a, e in zip(ours_grads, ref_grads):
      scale_e = float(jnp.max(jnp.abs(e))) + 1e-6
      assert float(jnp.max(jnp.abs(a.astype(jnp.float32) - e))) <= tol * scale_e, blocks


# ------------------------------------------------------------------------------------------------
# The accelerator implementations (jax.nn.dot_product_attention) against the CPU kernel.
# ------------------------------------------------------------------------------------------------


def _random_mask(r, n, q, s):
  """Causal masks over offset positions, some windowed, and random masks with fully masked rows
  (no model caller makes one: each query sees its own position)."""
  kind = r.choice(['causal', 'window', 'random'])
  if kind == 'random':
    mask = r.random((n, q, s)) < 0.5
    mask[:, r.integers(0, q)] = False  # a fully masked row
    return jnp.asarray(mask)
  offset = s - q
  return jnp.broadcast_to(attention.attention_mask(jnp.arange(q) + offset, jnp.arange(s),
                                                   window=3 if kind == 'window' else 0),
                          (n, q, s))


@pytest.mark.parametrize('seed', range(6))
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_library_attention_equals_the_cpu_kernel(seed, dtype):
  """jax.nn.dot_product_attention (XLA; with the head dim zero-padded as for cuDNN) gives the CPU
  kernel's values and gradients: float32 tightly, bfloat16 to its rounding."""
  r = np.random.default_rng(200 + seed)
  n, q_len, dh = int(r.integers(1, 4)), int(r.integers(1, 12)), int(r.choice([4, 6, 8, 10]))
  s_len = q_len + int(r.integers(0, 4))
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (n, q_len, dh), dtype)
  k = jax.random.normal(keys[1], (n, s_len, dh), dtype)
  v = jax.random.normal(keys[2], (n, s_len, dh), dtype)
  mask = _random_mask(r, n, q_len, s_len)
  # A fully masked row averages v uniformly in both; its gradient differs (the CPU kernel's
  # hand-written backward passes one through the uniform row, autodiff of the masked scores
  # none), so the cotangent leaves such rows out.
  live = jnp.any(mask, axis=-1, keepdims=True)
  cotangent = jax.random.normal(keys[3], (n, q_len, dh), jnp.float32) * live
  scale = dh ** -0.5

  def loss(fn, *qkv):
    out = fn(*qkv, mask, scale)
    return jnp.sum(out.astype(jnp.float32) * cotangent), out

  grad = lambda fn: jax.jit(jax.value_and_grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2),
                                               has_aux=True))(q, k, v)
  (_, ref), ref_grads = grad(kernels.softmax_attention)
  tol = 2e-6 if dtype == 'float32' else 2e-2
  for multiple in (1, 8):
    fn = functools.partial(_library, multiple=multiple)
    (_, out), grads = grad(fn)
    assert out.dtype == jnp.dtype(dtype) and out.shape == ref.shape
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32),
                               rtol=tol, atol=tol)
    for a, e in zip(grads, ref_grads):
      assert a.dtype == jnp.dtype(dtype)
      e = np.asarray(e, np.float32)
      assert np.max(np.abs(np.asarray(a, np.float32) - e)) <= tol * (np.max(np.abs(e)) + 1e-6)
  dead = ~np.asarray(live[..., 0])
  if dead.any():  # the uniform average of v, as the CPU kernel's finfo.min scores give
    mean_v = np.broadcast_to(np.asarray(v, np.float32).mean(axis=1, keepdims=True), ref.shape)
    np.testing.assert_allclose(np.asarray(out, np.float32)[dead], mean_v[dead], atol=tol * 10)


def _library(q, k, v, mask, scale, multiple):
  return kernels.library_attention(q, k, v, mask, scale, 'xla', head_dim_multiple=multiple)


@pytest.mark.parametrize('dtype', ['float32', pytest.param('bfloat16', marks=pytest.mark.slow)])
def test_forced_accelerator_attention_trains_the_same_model(dtype, monkeypatch):
  """The whole model with the accelerator choice forced on CPU (grouped heads, a sliding window,
  causal query blocks): the same logits and parameter gradients as the CPU kernel."""
  cfg = models.model_config(kind='context_ready', vocab_size=31, width=32, depth=1, num_heads=4,
                            num_kv_heads=2, max_len=16, k_unroll=2, dtype=dtype,
                            attention_blocks=2, sliding_window=3)
  model = models.build(cfg)
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 31)
  params = model.init(jax.random.key(0), tokens)['params']

  def run():
    def loss(p):
      logits = model.apply({'params': p}, tokens).astype(jnp.float32)
      return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  assert kernels.attention_implementation(jnp.zeros((1, 2, 8)), jnp.zeros((1, 2, 8))) == 'cpu'
  (_, ref), ref_grads = run()
  monkeypatch.setattr(kernels, 'on_cpu', lambda: False)  # no CUDA here: the XLA implementation
  assert kernels.attention_implementation(jnp.zeros((1, 2, 8)), jnp.zeros((1, 2, 8))) == 'xla'
  (_, out), grads = run()
  tol = 1e-5 if dtype == 'float32' else 3e-2
  np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
  for a, e in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    e = np.asarray(e, np.float32)
    assert np.max(np.abs(np.asarray(a, np.float32) - e)) <= tol * (np.max(np.abs(e)) + 1e-6)


def test_cudnn_is_chosen_only_where_jax_allows_it(monkeypatch):
  """On a CUDA GPU: bfloat16/float16, the head dim (padded to a multiple of 8) within 128 before
  Hopper and 256 from it, even lengths; float32 and the rest get XLA."""
  monkeypatch.setattr(kernels, 'on_cpu', lambda: False)
  choose = lambda dtype, dh, q_len=256, s_len=256: kernels.attention_implementation(
      jnp.zeros((1, q_len, dh), dtype), jnp.zeros((1, s_len, dh), dtype))
  monkeypatch.setattr(kernels, '_cuda_capability', lambda: None)  # TPU, ROCm
  assert choose('bfloat16', 64) == 'xla'
  monkeypatch.setattr(kernels, '_cuda_capability', lambda: '9.0')
  assert [choose('bfloat16', dh) for dh in (64, 70, 118, 250, 256, 258)] == ['cudnn'] * 5 + ['xla']
  assert choose('float16', 70) == 'cudnn' and choose('float32', 64) == 'xla'
  assert choose('bfloat16', 64, q_len=255) == 'xla' and choose('bfloat16', 64, s_len=7) == 'xla'
  monkeypatch.setattr(kernels, '_cuda_capability', lambda: '8.0')
  assert [choose('bfloat16', dh) for dh in (118, 128, 130)] == ['cudnn', 'cudnn', 'xla']
  with pytest.raises(ValueError, match='allowed'):
    kernels.attention(*(jnp.zeros((1, 2, 8)),) * 3, jnp.ones((1, 2, 2), bool), 1.0, 'flash')


def test_the_head_dim_table_in_accelerators_md_is_the_size_table():
  """docs/accelerators.md's paper-size rows: Dh = C/16, whether it is a multiple of 8, and
  attention's share of the step's model FLOPs at T = 256, K = 5, as computed now."""
  text = open(os.path.join(ROOT, 'docs', 'accelerators.md')).read()
  rows = re.findall(r'^\| ([dt]\d+_c\d+) \| (\d+) \| (\d+) \| (yes|no) \| ([\d.]+)% \|$', text,
                    re.M)
  paper = {name for name, (_, _, width, _) in models.SIZES.items() if width >= 768}
  assert {row[0] for row in rows} == paper
  for name, width, head_dim, multiple, share in rows:
    cfg = models.model_config(name=name, vocab_size=32000, max_len=1024, k_unroll=5)
    spec = models.spec_of(cfg)
    assert (int(width), int(head_dim)) == (spec.width, spec.head_dim)
    assert (multiple == 'yes') == (spec.head_dim % kernels.CUDNN_HEAD_DIM_MULTIPLE == 0)
    full = models.training_flops_per_token(cfg, 256, 5)
    assert float(share) == round(100 * (1 - models.training_flops_per_token(cfg, 0, 5) / full), 1)


def test_the_cpu_path_is_the_hand_written_kernel_unchanged():
  """On XLA:CPU `attention` traces to exactly the hand-written kernel, forward and backward, so
  its measured speed is kept."""
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 6, 8)) for i in range(3))
  mask = jnp.tril(jnp.ones((6, 6), bool))[None].repeat(2, 0)
  trace = lambda fn: str(jax.make_jaxpr(jax.value_and_grad(
      lambda q, k, v: jnp.sum(fn(q, k, v, mask, 0.35)), argnums=(0, 1, 2)))(q, k, v))
  assert trace(kernels.attention) == trace(kernels.softmax_attention)
  assert trace(kernels.attention) != trace(functools.partial(kernels.attention,
                                                             implementation='xla'))
