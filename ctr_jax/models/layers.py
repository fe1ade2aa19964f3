"""Transformer building blocks shared by every model (notation: ctr_jax/notation.py).

One `__call__` signature everywhere: `(x [B, T, C], positions [B, T] or [T], cache, cache_index,
deterministic) -> (y, new_cache)`. With `cache=None` a layer attends causally within `x`; with a
cache it writes its keys/values at `cache_index` and attends over the whole cache (step decode,
chunked prefill). The block families built from these layers live in `ctr_jax.models.blocks`.
"""

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.models.config import ModelSpec

# Laid out as the two attention products read them (scores q [Dh] x k [Dh, S], output
# p [S] x v [S, Dh]), with batch and key/value heads merged into one axis N = B*G. A
# position-major cache was transposed, i.e. copied whole, by every layer at every step; a
# separate batch axis of size 1 made XLA copy every cache at every step as well (the in-place
# write and the attention read a reshaped view of it). See docs/benchmarks.md.
Cache = dict[str, jax.Array]  # {'k': [B*G, Dh, S], 'v': [B*G, S, Dh]}


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
          fan_in: int | None = None) -> nn.Module:
  """A dense layer with the spec's dtypes, initialiser and weight layout (`Linear`/`nn.Dense`)."""
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
  cls = Linear if spec.kernel_layout == 'out_in' else nn.Dense
  return cls(features, use_bias=use_bias, kernel_init=kernel_init, bias_init=bias_init,
             dtype=compute_dtype(spec), param_dtype=param_dtype(spec), name=name)


class Linear(nn.Module):
  """`nn.Dense` with its weight stored [out, in] under the name 'weight' (PyTorch's layout).

  XLA:CPU runs y = x W^T with W [out, in] markedly faster than x K with K [in, out]: a
  batch-1 decode step is a chain of matrix-vector products, and reading W row by row (a dot
  product per output) streams memory faster than the column updates K needs; training steps
  gain too (docs/benchmarks.md). The weight starts as the transpose of the kernel `nn.Dense`
  would draw from the same key, so both layouts initialise the same function, and the distinct
  name keeps a checkpoint of one layout from loading silently into the other.
  """
  features: int
  use_bias: bool = True
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    def weight_init(key, shape, dtype):
      return self.kernel_init(key, shape[::-1], dtype).T
    weight = self.param('weight', weight_init, (self.features, x.shape[-1]), self.param_dtype)
    bias = self.param('bias', self.bias_init, (self.features,), self.param_dtype) \
        if self.use_bias else None
    x, weight, bias = nn.dtypes.promote_dtype(x, weight, bias, dtype=self.dtype)
    y = jax.lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())))
    return y if bias is None else y + bias


def rename_dense_leaves(tree, layout: str, convert):
  """Walks a params-shaped tree and moves each dense layer's matrix leaf to `layout`'s name
  ('weight' for 'out_in', 'kernel' for 'in_out') as `convert(leaf)`; a leaf for which `convert`
  returns None (not a dense layer's matrix) stays where it is."""
  source, target = ('kernel', 'weight') if layout == 'out_in' else ('weight', 'kernel')

  def walk(node):
    if not isinstance(node, dict):
      return node
    out = {k: walk(v) for k, v in node.items()}
    if source in out:
      converted = convert(out[source])
      if converted is not None:
        del out[source]
        out[target] = converted
    return out
  return walk(tree)


def to_kernel_layout(params, layout: str):
  """`params` with every dense layer's weight in `layout` ('out_in': {'weight': [out, in]},
  'in_out': {'kernel': [in, out]}); everything else (embeddings, norms, stacked experts) as is.
  """
  return rename_dense_leaves(  # numpy or jax arrays, dtype kept
      params, layout, lambda x: x.swapaxes(0, 1) if getattr(x, 'ndim', 0) == 2 else None)


def embedding_init(spec: ModelSpec):
  return nn.initializers.normal(1.0 if spec.init == 'torch' else 0.02)


def layer_norm(spec: ModelSpec, name: str | None = None) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=spec.layer_norm_eps, dtype=compute_dtype(spec),
                      param_dtype=param_dtype(spec), name=name)


def accumulation_dtype(dtype):
  """The dtype reductions run in: float32, or float64 for a float64 model."""
  return jnp.promote_types(dtype, jnp.float32)


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
  """N(x) = x / sqrt(mean(x^2) + eps) over the last axis, in at least float32."""
  x = x.astype(accumulation_dtype(x.dtype))
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


class RMSNorm(nn.Module):
  """RMSNorm with a learned scale; `offset` is Gemma's storage of the scale as w in (1 + w).

  The two conventions also round differently in low precision, as their reference code does:
  Gemma multiplies N(x) by (1 + w) in float32 and casts the product, Llama casts N(x) to the
  compute dtype first and multiplies by w there.
  """
  spec: ModelSpec
  offset: bool = False

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros if self.offset else nn.initializers.ones
    scale = self.param('scale', init, (x.shape[-1],), param_dtype(self.spec))
    dtype = compute_dtype(self.spec)
    normed = rms_normalize(x, self.spec.layer_norm_eps)
    if self.offset:
      return (normed * (1 + scale.astype(normed.dtype))).astype(dtype)
    return normed.astype(dtype) * scale.astype(dtype)


def norm(spec: ModelSpec, name: str | None = None) -> nn.Module:
  """The family's normalisation layer: LayerNorm (gpt, falcon) or RMSNorm (the others)."""
  if spec.block in ('gpt', 'falcon'):
    return layer_norm(spec, name=name)
  return RMSNorm(spec, offset=spec.block == 'gemma', name=name)


ACTIVATIONS: dict[str, Callable] = {
    'gelu': functools.partial(nn.gelu, approximate=False),
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'silu': nn.silu,
    'relu': nn.relu,
}
_DEFAULT_ACTIVATION = {'gpt': 'gelu', 'gemma': 'gelu_tanh', 'llama': 'silu', 'moe': 'silu',
                       'falcon': 'gelu'}


def activation_name(spec: ModelSpec) -> str:
  """The MLP nonlinearity of the spec's block family ('gelu' is the exact erf form)."""
  return spec.activation or _DEFAULT_ACTIVATION[spec.block]


def embed_scale(spec: ModelSpec) -> float:
  """Factor on the token embeddings: sqrt(C) for Gemma unless `embed_scale` says otherwise."""
  if spec.embed_scale:
    return float(spec.embed_scale)
  return math.sqrt(spec.width) if spec.block == 'gemma' else 1.0


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
  sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
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


def dot_product_attention(q, k, v, mask, scale: float) -> jax.Array:
  """q [B, Tq, H, Dh], k/v [B, Tk, G, Dh], mask broadcastable to [B, Tq, Tk] -> [B, Tq, H, Dh].

  Heads are moved in front of the positions once, so the four batched matmuls of the forward
  and backward pass run on contiguous [T, Dh] tiles; the hand-written backward pass reuses the
  saved probabilities and takes the softmax correction from rowsum(dO * O) (a [T] vector per
  head) instead of a pass over the [Tq, Tk] scores. Both were measured faster than autodiff of
  the plain formula on CPU (docs/benchmarks.md). Scores and softmax are float32 for low-precision
  inputs.
  """
  b, tq, h, dh = q.shape
  g = k.shape[2]
  if mask.ndim == 2:
    mask = mask[None]
  q = jnp.moveaxis(q.reshape(b, tq, g, h // g, dh), 1, 3)  # [B, G, R, Tq, Dh]
  k, v = jnp.moveaxis(k, 1, 2), jnp.moveaxis(v, 1, 2)    # [B, G, Tk, Dh]
  out = _attention(q, k, v, jnp.broadcast_to(mask, (b,) + mask.shape[1:]), scale)
  return jnp.moveaxis(out, 3, 1).reshape(b, tq, h, dh)


def cached_attention(q, k, v, mask, scale: float) -> jax.Array:
  """Attention of q [B, Tq, H, Dh] over a KV cache: k [B*G, Dh, S], v [B*G, S, Dh] (`Cache`),
  mask [B, Tq, S] -> [B, Tq, H, Dh]. Scores and softmax in float32 for low-precision inputs."""
  b, tq, h, dh = q.shape
  g = k.shape[0] // b
  r = h // g
  acc = accumulation_dtype(q.dtype)
  qh = jnp.transpose(q.reshape(b, tq, g, r, dh), (0, 2, 3, 1, 4)).reshape(b * g, r * tq, dh)
  logits = jnp.einsum('nqd,nds->nqs', qh, k, preferred_element_type=acc) * scale
  mask = jnp.broadcast_to(mask[:, None, None], (b, g, r) + mask.shape[1:])
  logits = jnp.where(mask.reshape(logits.shape), logits, jnp.finfo(acc).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('nqs,nsd->nqd', probs, v, preferred_element_type=acc).astype(q.dtype)
  return jnp.transpose(out.reshape(b, g, r, tq, dh), (0, 3, 1, 2, 4)).reshape(b, tq, h, dh)


def _attention_probs(q, k, mask, scale):
  acc = accumulation_dtype(q.dtype)
  logits = jnp.einsum('bgrqd,bgkd->bgrqk', q, k, preferred_element_type=acc) * scale
  # finfo.min, not -inf: a fully masked row then averages instead of producing NaN.
  logits = jnp.where(mask[:, None, None], logits, jnp.finfo(acc).min)
  unnormalised = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  return unnormalised * (1.0 / jnp.sum(unnormalised, axis=-1, keepdims=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, mask, scale):
  return _attention_forward(q, k, v, mask, scale)[0]


def _attention_forward(q, k, v, mask, scale):
  probs = _attention_probs(q, k, mask, scale)
  out = jnp.einsum('bgrqk,bgkd->bgrqd', probs.astype(v.dtype), v,
                   preferred_element_type=probs.dtype).astype(q.dtype)
  return out, (q, k, v, mask, probs, out)


def _attention_backward(scale, residuals, d_out):
  q, k, v, mask, probs, out = residuals
  acc = probs.dtype
  d_out_acc = d_out.astype(acc)
  dv = jnp.einsum('bgrqk,bgrqd->bgkd', probs, d_out_acc)
  d_probs = jnp.einsum('bgrqd,bgkd->bgrqk', d_out, v, preferred_element_type=acc)
  # Softmax backward: rowsum(dP * P) == rowsum(dO * O) per query.
  delta = jnp.sum(d_out_acc * out.astype(acc), axis=-1, keepdims=True)
  d_logits = probs * (d_probs - delta) * scale
  dq = jnp.einsum('bgrqk,bgkd->bgrqd', d_logits, k.astype(acc))
  dk = jnp.einsum('bgrqk,bgrqd->bgkd', d_logits, q.astype(acc))
  d_mask = np.zeros(mask.shape, jax.dtypes.float0)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), d_mask


_attention.defvjp(_attention_forward, _attention_backward)


class Attention(nn.Module):
  """Multi-head (or grouped/multi-query) causal self-attention with RoPE.

  Query head h reads key/value head h // (H / G), the grouping of Hugging Face's repeat_kv.
  `rope_base` 0 means spec.rope_base; `scale` 0 means Dh^-0.5; `qk_norm` 'gemma' or 'llama'
  normalises each query and key head (RMSNorm over Dh) before the rotation. No rotation at all
  with spec.positions == 'learned'; 'rope_integer' uses the author's integer angles.
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
    q = dense(s, s.num_heads * s.head_dim, use_bias=self.use_bias, name='query', fan_in=c)(x)
    k = dense(s, s.num_kv_heads * s.head_dim, use_bias=self.use_bias, name='key', fan_in=c)(x)
    v = dense(s, s.num_kv_heads * s.head_dim, use_bias=self.use_bias, name='value', fan_in=c)(x)
    q = q.reshape(b, t, s.num_heads, s.head_dim)
    k = k.reshape(b, t, s.num_kv_heads, s.head_dim)
    v = v.reshape(b, t, s.num_kv_heads, s.head_dim)
    if self.qk_norm:
      gemma_style = self.qk_norm == 'gemma'
      q = RMSNorm(s, offset=gemma_style, name='q_norm')(q)
      k = RMSNorm(s, offset=gemma_style, name='k_norm')(k)
    if s.positions != 'learned':
      base, integer = self.rope_base or s.rope_base, s.positions == 'rope_integer'
      q = rope(q, positions, base, self.rope_factor, integer)
      k = rope(k, positions, base, self.rope_factor, integer)
    query_pos = jnp.broadcast_to(positions, (b, t))
    scale = self.scale or s.head_dim ** -0.5
    if cache is None:
      mask = attention_mask(query_pos, query_pos, self.window)
      out = dot_product_attention(q, k, v, mask, scale)
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
    out = dense(s, c, use_bias=self.use_bias, name='out', fan_in=s.num_heads * s.head_dim)(out)
    return out, new_cache


class Mlp(nn.Module):
  """C -> F -> C feed-forward network with GELU (exact erf form, as torch.nn.GELU) by default."""
  spec: ModelSpec
  out_features: int | None = None
  activation: str = 'gelu'
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    s = self.spec
    h = dense(s, s.mlp_dim, use_bias=self.use_bias, name='fc_in', fan_in=x.shape[-1])(x)
    h = ACTIVATIONS[self.activation](h)
    return dense(s, self.out_features or s.width, use_bias=self.use_bias, name='fc_out',
                 fan_in=s.mlp_dim)(h)


class GatedMlp(nn.Module):
  """down(act(gate z) * up z) without biases: GeGLU (Gemma) or SwiGLU (Llama)."""
  spec: ModelSpec

  @nn.compact
  def __call__(self, z):
    s = self.spec
    gate = dense(s, s.mlp_dim, use_bias=False, name='gate')(z)
    up = dense(s, s.mlp_dim, use_bias=False, name='up')(z)
    a = ACTIVATIONS[activation_name(s)](gate) * up
    return dense(s, s.width, use_bias=False, name='down')(a)


def moe_gates(router_logits: jax.Array, k: int) -> jax.Array:
  """Mixtral routing [.., E] -> [.., E]: softmax, keep the top k, renormalise them to sum 1.

  Unselected experts get an exact zero. The result is float32 (float64 for a float64 model).
  """
  probs = jax.nn.softmax(router_logits.astype(accumulation_dtype(router_logits.dtype)), axis=-1)
  top, index = jax.lax.top_k(probs, k)
  top = top / jnp.sum(top, axis=-1, keepdims=True)
  one_hot = jax.nn.one_hot(index, probs.shape[-1], dtype=top.dtype)  # [.., k, E]
  return jnp.einsum('...k,...ke->...e', top, one_hot)


class MoeMlp(nn.Module):
  """Top-k routed SwiGLU experts (Mixtral): sum_j s_j down_j(act(gate_j z) * up_j z).

  Every expert is evaluated (dense dispatch): exact and simple at the sizes this code targets.
  Expert kernels are stacked: gate/up [E, C, F], down [E, F, C].
  """
  spec: ModelSpec

  @nn.compact
  def __call__(self, z):
    s = self.spec
    e, c, f = s.num_experts, s.width, s.mlp_dim
    init = _torch_uniform_stacked if s.init == 'torch' else (
        lambda fan_in: nn.initializers.normal(0.02))
    gates = moe_gates(dense(s, e, use_bias=False, name='router')(z), s.experts_per_token)
    pdt, dtype = param_dtype(s), compute_dtype(s)
    w_gate = self.param('gate', init(c), (e, c, f), pdt).astype(dtype)
    w_up = self.param('up', init(c), (e, c, f), pdt).astype(dtype)
    w_down = self.param('down', init(f), (e, f, c), pdt).astype(dtype)
    return moe_combine(z.astype(dtype), gates, w_gate, w_up, w_down, activation_name(s))


def moe_combine(z, gates, w_gate, w_up, w_down, activation: str):
  """sum_j gates_j * expert_j(z) for z [.., C], gates [.., E] and stacked expert kernels."""
  a = ACTIVATIONS[activation](jnp.einsum('...c,ecf->...ef', z, w_gate))
  a = a * jnp.einsum('...c,ecf->...ef', z, w_up)
  y = jnp.einsum('...ef,efc->...ec', a, w_down)
  return jnp.einsum('...e,...ec->...c', gates.astype(y.dtype), y)


def _torch_uniform_stacked(fan_in: int):
  def init(key, shape, dtype=jnp.float32):
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init
