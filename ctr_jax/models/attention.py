"""Attention with an optional KV cache, and the rotary position embedding it applies
(notation: ctr_jax/notation.py).

`Attention.__call__(x [B, T, C], positions, cache, cache_index) -> (y, new_cache)`: without a
cache it attends causally within x (training, the K-unroll); with one it writes its keys and
values at `cache_index` and attends over the whole cache (step decode, chunked prefill).
"""

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.models import layers
from ctr_jax.models.config import ModelSpec
from ctr_jax.models.layers import RMSNorm, compute_dtype, dense
from ctr_jax.ops import kernels
from ctr_jax.ops.kernels import accumulation_dtype

# Laid out as the two attention products read them (scores q [Dh] x k [Dh, S], output
# p [S] x v [S, Dh]), with batch and key/value heads merged into one axis N = B*G: a
# position-major cache would be transposed (copied whole) by every layer at every step, and a
# separate batch axis of size 1 makes XLA copy every cache per step too (docs/benchmarks.md).
Cache = dict[str, jax.Array]  # {'k': [B*G, Dh, S], 'v': [B*G, S, Dh]}


# ------------------------------------------------------------------------------------------------
# Rotary position embedding.
# ------------------------------------------------------------------------------------------------


def rope(x: jax.Array, positions: jax.Array, base: float, factor: float = 1.0,
         integer: bool = False) -> jax.Array:
  """Rotates pairs (i, i + Dh/2) of x [B, T, H, Dh] by angle position * base^(-2i/Dh) / factor.

  `factor` is linear RoPE scaling. `integer` uses angle position * i instead (base unused): the
  author's code (reference 1.5), whose pairs spin at 0, 1, 2, ... radians per position; which
  dimensions form a pair does not matter to the model, so only the frequencies differ.
  Angles are float32 (float64 for a float64 model).
  """
  dtype = accumulation_dtype(x.dtype)
  half = x.shape[-1] // 2
  if integer:
    inv_freq = jnp.arange(half, dtype=dtype)
  else:
    inv_freq = base ** (-jnp.arange(half, dtype=dtype) / half)
  if factor != 1.0:
    inv_freq = inv_freq / factor
  angles = positions.astype(dtype)[..., None] * inv_freq  # [B, T, Dh/2] or [T, Dh/2]
  if angles.ndim == 2:
    angles = angles[None]
  sin, cos = kernels.rotation_table(jnp.sin(angles)), kernels.rotation_table(jnp.cos(angles))
  sin, cos = sin[:, :, None, :], cos[:, :, None, :]
  x1, x2 = x[..., :half].astype(dtype), x[..., half:].astype(dtype)
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


def dot_product_attention(q, k, v, mask, scale: float, causal_blocks: int = 1) -> jax.Array:
  """q [B, Tq, H, Dh], k/v [B, Tk, G, Dh], mask broadcastable to [B, Tq, Tk] -> [B, Tq, H, Dh].

  Batch and key/value heads are merged into one axis N = B*G and the R = H/G query heads that
  share a key/value head are stacked along the query axis, so every product is a 3-D batched
  matmul on contiguous tiles ([R*Tq, Dh] x [Dh, Tk]), computed by `kernels.attention` (faster
  than the 5-D grouped layout on CPU, docs/benchmarks.md). Scores and softmax are float32 for
  low-precision inputs.

  causal_blocks > 1 (self-attention, Tq == Tk) cuts the queries into that many blocks and lets
  block i read only the keys up to its own end, skipping the score tiles above the diagonal
  (10 of 16 tiles remain at 4 blocks). That is exact when the mask is false above the block
  diagonal: a causal mask over positions that increase along the sequence, as in every caller
  here (training, the K-unroll, `iterate`, offset positions of the implicit-update code).
  """
  b, tq, h, dh = q.shape
  tk, g = k.shape[1], k.shape[2]
  r = h // g
  if mask.ndim == 2:
    mask = mask[None]
  mask = jnp.broadcast_to(mask, (b, tq, tk))
  blocks = causal_blocks if causal_blocks > 1 and tq == tk and tq >= 2 * causal_blocks else 1
  bounds = [round(i * tq / blocks) for i in range(blocks + 1)]
  qh = jnp.transpose(q.reshape(b, tq, g, r, dh), (0, 2, 3, 1, 4))  # [B, G, R, Tq, Dh]
  kh = jnp.swapaxes(k, 1, 2).reshape(b * g, tk, dh)
  vh = jnp.swapaxes(v, 1, 2).reshape(b * g, tk, dh)
  outs = []
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    end = hi if blocks > 1 else tk
    rows = hi - lo
    block_mask = jnp.broadcast_to(mask[:, None, None, lo:hi, :end], (b, g, r, rows, end))
    out = kernels.attention(qh[:, :, :, lo:hi].reshape(b * g, r * rows, dh), kh[:, :end], vh[:, :end],
                     block_mask.reshape(b * g, r * rows, end), scale)
    outs.append(out.reshape(b, g, r, rows, dh))
  out = outs[0] if blocks == 1 else jnp.concatenate(outs, axis=3)
  return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, tq, h, dh)


def cached_attention(q, k, v, mask, scale: float) -> jax.Array:
  """Attention of q [B, Tq, H, Dh] over a KV cache: k [B*G, Dh, S], v [B*G, S, Dh] (`Cache`),
  mask [B, Tq, S] -> [B, Tq, H, Dh]. Scores and softmax in float32 for low-precision inputs."""
  b, tq, h, dh = q.shape
  g = k.shape[0] // b
  r = h // g
  acc = accumulation_dtype(q.dtype)
  qh = jnp.transpose(q.reshape(b, tq, g, r, dh), (0, 2, 3, 1, 4)).reshape(b * g, r * tq, dh)
  qh = qh * jnp.asarray(scale, qh.dtype)  # scaled as `dot_product_attention` does
  logits = jnp.einsum('nqd,nds->nqs', qh, k, preferred_element_type=acc)
  mask = jnp.broadcast_to(mask[:, None, None], (b, g, r) + mask.shape[1:])
  logits = jnp.where(mask.reshape(logits.shape), logits, jnp.finfo(acc).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('nqs,nsd->nqd', probs, v, preferred_element_type=acc).astype(q.dtype)
  return jnp.transpose(out.reshape(b, g, r, tq, dh), (0, 3, 1, 2, 4)).reshape(b, tq, h, dh)


class Attention(nn.Module):
  """Multi-head (or grouped/multi-query) causal self-attention with RoPE.

  Query head h reads key/value head h // (H / G), the grouping of Hugging Face's repeat_kv.
  `rope_base` 0 means spec.rope_base; `scale` 0 means Dh^-0.5; `qk_norm` 'gemma' or 'llama'
  normalises each query and key head (RMSNorm over Dh) before the rotation. No rotation at all
  with spec.positions 'learned' or 'none'; 'rope_integer' uses the author's integer angles.
  """
  spec: ModelSpec
  use_bias: bool = True
  window: int = 0
  rope_base: float = 0.0
  rope_factor: float = 1.0
  qk_norm: str = ''
  scale: float = 0.0

  @nn.compact
  def __call__(self, x, positions, cache: Cache | None = None, cache_index=None):
    s = self.spec
    c = x.shape[-1]
    b, t = x.shape[:2]
    if self.has_variable(FUSED, 'qkv'):
      q, k, v = self.fused_projections(x, self.get_variable(FUSED, 'qkv'))
    else:
      q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
      q = dense(s, q_size, ('embed', 'heads'), use_bias=self.use_bias, name='query',
                fan_in=c)(x)
      k = dense(s, kv_size, ('embed', 'kv_heads'), use_bias=self.use_bias, name='key',
                fan_in=c)(x)
      v = dense(s, kv_size, ('embed', 'kv_heads'), use_bias=self.use_bias, name='value',
                fan_in=c)(x)
    q = q.reshape(b, t, s.num_heads, s.head_dim)
    k = k.reshape(b, t, s.num_kv_heads, s.head_dim)
    v = v.reshape(b, t, s.num_kv_heads, s.head_dim)
    if self.qk_norm:
      gemma_style = self.qk_norm == 'gemma'
      q = RMSNorm(s, offset=gemma_style, axis='head_dim', name='q_norm')(q)
      k = RMSNorm(s, offset=gemma_style, axis='head_dim', name='k_norm')(k)
    if s.positions not in ('learned', 'none'):
      base, integer = self.rope_base or s.rope_base, s.positions == 'rope_integer'
      q = rope(q, positions, base, self.rope_factor, integer)
      k = rope(k, positions, base, self.rope_factor, integer)
    query_pos = jnp.broadcast_to(positions, (b, t))
    scale = self.scale or s.head_dim ** -0.5
    if cache is None:
      mask = attention_mask(query_pos, query_pos, self.window)
      out = dot_product_attention(q, k, v, mask, scale, s.attention_blocks)
      new_cache = None
    else:
      g, dh = s.num_kv_heads, s.head_dim
      k_new = jnp.transpose(k, (0, 2, 3, 1)).reshape(b * g, dh, t)
      v_new = jnp.swapaxes(v, 1, 2).reshape(b * g, t, dh)
      k_all = jax.lax.dynamic_update_slice(cache['k'], k_new.astype(cache['k'].dtype),
                                           (0, 0, cache_index))
      v_all = jax.lax.dynamic_update_slice(cache['v'], v_new.astype(cache['v'].dtype),
                                           (0, cache_index, 0))
      new_cache = {'k': k_all, 'v': v_all}
      key_pos = jnp.arange(v_all.shape[1])
      # Slots past the newest token hold zeros; the causal mask already excludes them.
      mask = attention_mask(query_pos, key_pos[None], self.window)
      out = cached_attention(q, k_all.astype(q.dtype), v_all.astype(q.dtype), mask, scale)
    out = out.reshape(b, t, s.num_heads * s.head_dim)
    out = dense(s, c, ('heads', 'embed'), use_bias=self.use_bias, name='out',
                fan_in=s.num_heads * s.head_dim)(out)
    return out, new_cache

  def fused_projections(self, x, fused):
    """q, k, v from the one concatenated dense layer `fuse_qkv` made; the same arithmetic per
    output as the three dense layers (their dtype promotion, their weight layout)."""
    s = self.spec
    y = layers.linear(x, fused, compute_dtype(s))
    q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    return y[..., :q_size], y[..., q_size:q_size + kv_size], y[..., q_size + kv_size:]


# ------------------------------------------------------------------------------------------------
# Decode-time fusion of the query, key and value projections.
# ------------------------------------------------------------------------------------------------

FUSED = 'fused'  # the variable collection `fuse_qkv` adds; never trained, never saved
_QKV = ('query', 'key', 'value')


def fuse_qkv(variables: Mapping) -> dict:
  """`variables` plus a 'fused' collection holding, for every attention layer, its query, key and
  value weights (and biases) concatenated along the output axis; `Attention` then runs one
  projection instead of three.

  A batch-1 decode step is a chain of matrix-vector products, and XLA:CPU runs one large product
  on more cores than three small ones (docs/benchmarks.md). The parameters keep their separate
  layers, the tree the HF loader, checkpoints and the implicit-update code read; the decode entry
  points call this once per call, outside their loop over positions (concatenating inside the
  loop would copy the weights at every step). Variables that already hold the
  collection pass through unchanged, so a caller decoding one token per call can fuse once.
  """
  if FUSED in variables:
    return variables
  def walk(node):
    if not isinstance(node, Mapping):
      return None
    out = {}
    for name, child in node.items():
      fused = walk(child)
      if fused:
        out[name] = fused
    parts = [node.get(name) for name in _QKV]
    if all(isinstance(p, Mapping) for p in parts):
      out['qkv'] = layers.concat_outputs(parts)
    return out
  return {**variables, FUSED: walk(variables['params']) or {}}
