"""Transformer building blocks shared by every model (notation: ctr_jax/notation.py).

One `__call__` signature everywhere: `(x [B, T, C], positions [B, T] or [T], cache, cache_index,
deterministic) -> (y, new_cache)`. With `cache=None` a layer attends causally within `x`; with a
cache it writes its keys/values at `cache_index` and attends over the whole cache (step decode,
chunked prefill). Block families are selected by `spec.block`; each family is one small class
registered in `BLOCK_FAMILIES`.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.models.config import ModelSpec

Cache = dict[str, jax.Array]  # {'k': [B, S, G, Dh], 'v': [B, S, G, Dh]}


def compute_dtype(spec: ModelSpec):
  return jnp.dtype(spec.dtype)


def param_dtype(spec: ModelSpec):
  return jnp.dtype(spec.param_dtype)


# ------------------------------------------------------------------------------------------------
# Initialisers. 'torch' mirrors the PyTorch defaults the paper's author trained with; the
# reference notes (section 11) found 0.02-std embeddings make the context-ready model learn far
# more slowly, because a 4C-wide correction output swamps tiny embeddings.
# ------------------------------------------------------------------------------------------------


def _torch_uniform(fan_in_axis: int = 0):
  def init(key, shape, dtype=jnp.float32):
    bound = 1.0 / jnp.sqrt(shape[fan_in_axis])
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


def dense(spec: ModelSpec, features: int, *, use_bias: bool = True, name: str | None = None,
          fan_in: int | None = None) -> nn.Dense:
  """A Dense layer with the spec's dtypes and initialiser."""
  if spec.init == 'torch':
    kernel_init = _torch_uniform(0)
    # PyTorch draws the bias from the same U(±1/sqrt(fan_in)); fan_in is known only at call time,
    # so it is passed in by the caller.
    bound = 1.0 / (fan_in ** 0.5) if fan_in else 0.0
    bias_init = lambda key, shape, dtype=jnp.float32: jax.random.uniform(
        key, shape, dtype, -bound, bound)
  else:
    kernel_init = nn.initializers.normal(0.02)
    bias_init = nn.initializers.zeros
  return nn.Dense(features, use_bias=use_bias, kernel_init=kernel_init, bias_init=bias_init,
                  dtype=compute_dtype(spec), param_dtype=param_dtype(spec), name=name)


def embedding_init(spec: ModelSpec):
  return nn.initializers.normal(1.0 if spec.init == 'torch' else 0.02)


def layer_norm(spec: ModelSpec, name: str | None = None) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=spec.layer_norm_eps, dtype=compute_dtype(spec),
                      param_dtype=param_dtype(spec), name=name)


# ------------------------------------------------------------------------------------------------
# Rotary position embedding.
# ------------------------------------------------------------------------------------------------


def rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """Rotates pairs (i, i + Dh/2) of x [B, T, H, Dh] by angle position * base^(-2i/Dh)."""
  half = x.shape[-1] // 2
  inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2] or [T, Dh/2]
  if angles.ndim == 2:
    angles = angles[None]
  sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


# ------------------------------------------------------------------------------------------------
# Attention with an optional KV cache.
# ------------------------------------------------------------------------------------------------


def attention_mask(query_pos: jax.Array, key_pos: jax.Array, window: int = 0) -> jax.Array:
  """Causal (and optionally sliding-window) mask [.., Tq, Tk] from absolute positions."""
  allowed = key_pos[..., None, :] <= query_pos[..., :, None]
  if window:
    allowed &= key_pos[..., None, :] > query_pos[..., :, None] - window
  return allowed


def dot_product_attention(q, k, v, mask, scale: float) -> jax.Array:
  """q [B, Tq, H, Dh], k/v [B, Tk, G, Dh], mask broadcastable to [B, Tq, Tk] -> [B, Tq, H, Dh]."""
  b, tq, h, dh = q.shape
  g = k.shape[2]
  q = q.reshape(b, tq, g, h // g, dh)
  logits = jnp.einsum('bqgrd,bkgd->bgrqk', q, k, preferred_element_type=jnp.float32) * scale
  if mask.ndim == 2:
    mask = mask[None]
  logits = jnp.where(mask[:, None, None], logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('bgrqk,bkgd->bqgrd', weights, v)
  return out.reshape(b, tq, h, dh)


class Attention(nn.Module):
  """Multi-head (or grouped/multi-query) causal self-attention with RoPE."""
  spec: ModelSpec
  use_bias: bool = True
  window: int = 0

  @nn.compact
  def __call__(self, x, positions, cache: Cache | None = None, cache_index=None):
    s = self.spec
    c = x.shape[-1]
    b, t = x.shape[:2]
    q = dense(s, s.num_heads * s.head_dim, use_bias=self.use_bias, name='query', fan_in=c)(x)
    k = dense(s, s.num_kv_heads * s.head_dim, use_bias=self.use_bias, name='key', fan_in=c)(x)
    v = dense(s, s.num_kv_heads * s.head_dim, use_bias=self.use_bias, name='value', fan_in=c)(x)
    q = q.reshape(b, t, s.num_heads, s.head_dim)
    k = k.reshape(b, t, s.num_kv_heads, s.head_dim)
    v = v.reshape(b, t, s.num_kv_heads, s.head_dim)
    q, k = rope(q, positions, s.rope_base), rope(k, positions, s.rope_base)
    query_pos = jnp.broadcast_to(positions, (b, t))
    if cache is None:
      mask = attention_mask(query_pos, query_pos, self.window)
      new_cache = None
    else:
      k_all = jax.lax.dynamic_update_slice(cache['k'], k.astype(cache['k'].dtype),
                                           (0, cache_index, 0, 0))
      v_all = jax.lax.dynamic_update_slice(cache['v'], v.astype(cache['v'].dtype),
                                           (0, cache_index, 0, 0))
      new_cache = {'k': k_all, 'v': v_all}
      key_pos = jnp.arange(k_all.shape[1])
      # Slots past the newest token hold zeros; the causal mask already excludes them.
      mask = attention_mask(query_pos, key_pos[None], self.window)
      k, v = k_all.astype(q.dtype), v_all.astype(q.dtype)
    out = dot_product_attention(q, k, v, mask, s.head_dim ** -0.5)
    out = out.reshape(b, t, s.num_heads * s.head_dim)
    out = dense(s, c, use_bias=self.use_bias, name='out', fan_in=s.num_heads * s.head_dim)(out)
    return out, new_cache


class Mlp(nn.Module):
  """C -> F -> C feed-forward network with GELU (exact erf form, as torch.nn.GELU)."""
  spec: ModelSpec
  out_features: int | None = None

  @nn.compact
  def __call__(self, x):
    s = self.spec
    h = dense(s, s.mlp_dim, name='fc_in', fan_in=x.shape[-1])(x)
    h = nn.gelu(h, approximate=False)
    return dense(s, self.out_features or s.width, name='fc_out', fan_in=s.mlp_dim)(h)


# ------------------------------------------------------------------------------------------------
# Block families.
# ------------------------------------------------------------------------------------------------


class GptBlock(nn.Module):
  """Pre-LN block of the paper's "roformer": h += Attn(LN(h)); h += FFN(LN(h)); with biases."""
  spec: ModelSpec

  def setup(self):
    self.ln_attn = layer_norm(self.spec)
    self.attn = Attention(self.spec)
    self.ln_mlp = layer_norm(self.spec)
    self.mlp = Mlp(self.spec)
    self.drop = nn.Dropout(self.spec.dropout)

  def __call__(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.ln_attn(x), positions, cache, cache_index)
    x = x + self.drop(a, deterministic=deterministic)
    x = x + self.drop(self.mlp(self.ln_mlp(x)), deterministic=deterministic)
    return x, new_cache


BLOCK_FAMILIES: dict[str, Any] = {'gpt': GptBlock}


def block_class(spec: ModelSpec):
  if spec.block not in BLOCK_FAMILIES:
    raise ValueError(f'model.block={spec.block!r} is not implemented yet; available: '
                     f'{sorted(BLOCK_FAMILIES)}')
  return BLOCK_FAMILIES[spec.block]


class BlockStack(nn.Module):
  """`spec.depth` blocks with separate weights (the context-ready unit, or a whole transformer)."""
  spec: ModelSpec

  def setup(self):
    cls = block_class(self.spec)
    self.layers = [cls(self.spec, name=f'block_{i}') for i in range(self.spec.depth)]

  def __call__(self, x, positions, caches=None, cache_index=None, deterministic=True):
    """x [B, T, C] -> ([B, T, C], per-layer caches or None)."""
    new_caches = []
    for i, layer in enumerate(self.layers):
      x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
      x, cache = layer(x, positions, None if caches is None else caches[i], cache_index,
                       deterministic)
      new_caches.append(cache)
    return x, (None if caches is None else tuple(new_caches))


def init_cache(spec: ModelSpec, batch_size: int, length: int, dtype=None) -> tuple[Cache, ...]:
  """Zeroed per-layer KV caches for `length` positions."""
  dtype = dtype or compute_dtype(spec)
  shape = (batch_size, length, spec.num_kv_heads, spec.head_dim)
  return tuple({'k': jnp.zeros(shape, dtype), 'v': jnp.zeros(shape, dtype)}
               for _ in range(spec.depth))
