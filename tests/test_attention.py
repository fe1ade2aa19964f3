"""The attention kernel's hand-written backward pass against autodiff of the plain formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax.models import attention


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
