"""Transformer building blocks shared by every model (notation: ctr_jax/notation.py).

One `__call__` signature everywhere: `(x [B, T, C], positions [B, T] or [T], cache, cache_index,
deterministic) -> (y, new_cache)`. With `cache=None` a layer attends causally within `x`; with a
cache it writes its keys/values at `cache_index` and attends over the whole cache (step decode,
chunked prefill). Block families are selected by `spec.block`; each family is one small class
registered in `BLOCK_FAMILIES`.
"""

import functools
import math
from typing import Any, Callable

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


def rope(x: jax.Array, positions: jax.Array, base: float, factor: float = 1.0) -> jax.Array:
  """Rotates pairs (i, i + Dh/2) of x [B, T, H, Dh] by angle position * base^(-2i/Dh) / factor.

  `factor` is linear RoPE scaling. Angles are float32 (float64 for a float64 model).
  """
  dtype = accumulation_dtype(x.dtype)
  half = x.shape[-1] // 2
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
  """q [B, Tq, H, Dh], k/v [B, Tk, G, Dh], mask broadcastable to [B, Tq, Tk] -> [B, Tq, H, Dh]."""
  b, tq, h, dh = q.shape
  g = k.shape[2]
  q = q.reshape(b, tq, g, h // g, dh)
  acc = accumulation_dtype(q.dtype)
  logits = jnp.einsum('bqgrd,bkgd->bgrqk', q, k, preferred_element_type=acc) * scale
  if mask.ndim == 2:
    mask = mask[None]
  logits = jnp.where(mask[:, None, None], logits, jnp.finfo(acc).min)
  weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  out = jnp.einsum('bgrqk,bkgd->bqgrd', weights, v)
  return out.reshape(b, tq, h, dh)


class Attention(nn.Module):
  """Multi-head (or grouped/multi-query) causal self-attention with RoPE.

  Query head h reads key/value head h // (H / G), the grouping of Hugging Face's repeat_kv.
  `rope_base` 0 means spec.rope_base; `scale` 0 means Dh^-0.5; `qk_norm` 'gemma' or 'llama'
  normalises each query and key head (RMSNorm over Dh) before the rotation. No rotation at all
  with spec.positions == 'learned'.
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
    if s.positions == 'rope':
      base = self.rope_base or s.rope_base
      q = rope(q, positions, base, self.rope_factor)
      k = rope(k, positions, base, self.rope_factor)
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
    out = dot_product_attention(q, k, v, mask, self.scale or s.head_dim ** -0.5)
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
    if s.init == 'torch':
      init = lambda fan_in: _torch_uniform_stacked(fan_in)
    else:
      init = lambda fan_in: nn.initializers.normal(0.02)
    gates = moe_gates(dense(s, e, use_bias=False, name='router')(z), s.experts_per_token)
    pdt, dtype = param_dtype(s), compute_dtype(s)
    w_gate = self.param('gate', init(c), (e, c, f), pdt).astype(dtype)
    w_up = self.param('up', init(c), (e, c, f), pdt).astype(dtype)
    w_down = self.param('down', init(f), (e, f, c), pdt).astype(dtype)
    return moe_combine(z.astype(dtype), gates, w_gate, w_up, w_down, activation_name(s))


def moe_experts(z, w_gate, w_up, w_down, activation: str):
  """Every expert's gated hidden a [.., E, F] and output y [.., E, C] for z [.., C]."""
  a = ACTIVATIONS[activation](jnp.einsum('...c,ecf->...ef', z, w_gate))
  a = a * jnp.einsum('...c,ecf->...ef', z, w_up)
  return a, jnp.einsum('...ef,efc->...ec', a, w_down)


def moe_combine(z, gates, w_gate, w_up, w_down, activation: str):
  _, y = moe_experts(z, w_gate, w_up, w_down, activation)
  return jnp.einsum('...e,...ec->...c', gates.astype(y.dtype), y)


def _torch_uniform_stacked(fan_in: int):
  def init(key, shape, dtype=jnp.float32):
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


# ------------------------------------------------------------------------------------------------
# Block families.
# ------------------------------------------------------------------------------------------------


class GptBlock(nn.Module):
  """Pre-LN block of the paper's "roformer": h += Attn(LN(h)); h += FFN(LN(h)); with biases."""
  spec: ModelSpec
  layer_index: int = 0

  def setup(self):
    self.ln_attn = layer_norm(self.spec)
    self.attn = Attention(self.spec)
    self.ln_mlp = layer_norm(self.spec)
    self.mlp = Mlp(self.spec, activation=activation_name(self.spec))
    self.drop = nn.Dropout(self.spec.dropout)

  def __call__(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.ln_attn(x), positions, cache, cache_index)
    x = x + self.drop(a, deterministic=deterministic)
    x = x + self.drop(self.mlp(self.ln_mlp(x)), deterministic=deterministic)
    return x, new_cache

  # The three stages every family exposes (ctr_jax/implicit patches between them):
  # v = attend(x) is the residual after the attention sub-layer, z = mlp_input(x, v) the
  # normalised MLP input, and the block output is v + mlp_branch(z).

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.ln_attn(x), positions, cache, cache_index)
    return x + self.drop(a, deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del x
    return self.ln_mlp(v)

  def mlp_branch(self, z):
    return self.mlp(z)


def layer_attention(spec: ModelSpec, layer_index: int, **kwargs) -> Attention:
  """The attention of layer `layer_index`: window and RoPE base from `spec.layer_types`.

  Sliding layers use `sliding_window` and `rope_local_base` (unscaled); full layers are global
  and use `rope_base` with linear scaling `rope_scaling_factor`. Without `layer_types` every
  layer uses `sliding_window` (0 = global) and `rope_base`.
  """
  kind = spec.layer_types[layer_index] if spec.layer_types else ''
  if kind == 'sliding_attention':
    window, base, factor = spec.sliding_window, spec.rope_local_base or spec.rope_base, 1.0
  elif kind == 'full_attention':
    window, base, factor = 0, spec.rope_base, spec.rope_scaling_factor
  else:
    window, base, factor = spec.sliding_window, spec.rope_base, spec.rope_scaling_factor
  return Attention(spec, window=window, rope_base=base, rope_factor=factor, **kwargs)


class _FamilyBlock(nn.Module):
  """Shared `__call__` of the non-gpt families; subclasses define the three stages."""
  spec: ModelSpec
  layer_index: int = 0

  def __call__(self, x, positions, cache=None, cache_index=None, deterministic=True):
    v, new_cache = self.attend(x, positions, cache, cache_index, deterministic)
    y = self.mlp_branch(self.mlp_input(x, v))
    return v + self.drop(y, deterministic=deterministic), new_cache

  def attention_scale(self) -> float:
    s = self.spec
    return (s.query_pre_attn_scalar or s.head_dim) ** -0.5


class GemmaBlock(_FamilyBlock):
  """Gemma 2/3: RMSNorm (1 + w) before and after attention and MLP, GeGLU-tanh, no biases.

  v = x + PostAttnNorm(Attn(PreAttnNorm(x)));  out = v + PostMlpNorm(Mlp(PreMlpNorm(v))).
  """

  def setup(self):
    s = self.spec
    self.attn_norm = RMSNorm(s, offset=True)
    self.attn = layer_attention(s, self.layer_index, use_bias=False,
                                qk_norm='gemma' if s.qk_norm else '',
                                scale=self.attention_scale())
    self.post_attn_norm = RMSNorm(s, offset=True)
    self.mlp_norm = RMSNorm(s, offset=True)
    self.mlp = GatedMlp(s)
    self.post_mlp_norm = RMSNorm(s, offset=True)
    self.drop = nn.Dropout(s.dropout)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.attn_norm(x), positions, cache, cache_index)
    return x + self.drop(self.post_attn_norm(a), deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del x
    return self.mlp_norm(v)

  def mlp_branch(self, z):
    return self.post_mlp_norm(self.mlp(z))


class LlamaBlock(_FamilyBlock):
  """Llama/Mistral/Qwen2: pre-RMSNorm only, SwiGLU, no biases (optional QK-norm as Qwen3)."""

  def setup(self):
    s = self.spec
    self.attn_norm = RMSNorm(s)
    self.attn = layer_attention(s, self.layer_index, use_bias=False,
                                qk_norm='llama' if s.qk_norm else '',
                                scale=self.attention_scale())
    self.mlp_norm = RMSNorm(s)
    self.mlp = self.make_mlp()
    self.drop = nn.Dropout(s.dropout)

  def make_mlp(self):
    return GatedMlp(self.spec)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.attn_norm(x), positions, cache, cache_index)
    return x + self.drop(a, deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del x
    return self.mlp_norm(v)

  def mlp_branch(self, z):
    return self.mlp(z)


class MoeBlock(LlamaBlock):
  """Mixtral: the Llama block with its MLP replaced by top-k routed SwiGLU experts."""

  def make_mlp(self):
    return MoeMlp(self.spec)


class FalconBlock(_FamilyBlock):
  """Falcon/GPT-J parallel block: out = x + Attn(LN(x)) + Mlp(LN'(x)); the MLP never sees v.

  LN' is the same LayerNorm (parallel_norms=1, Falcon-7B) or its own (2, Falcon-40B).
  """

  def setup(self):
    s = self.spec
    self.attn_norm = layer_norm(s)
    if s.parallel_norms == 2:
      self.mlp_norm = layer_norm(s)
    self.attn = layer_attention(s, self.layer_index, use_bias=s.use_bias,
                                scale=self.attention_scale())
    self.mlp = Mlp(s, activation=activation_name(s), use_bias=s.use_bias)
    self.drop = nn.Dropout(s.dropout)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.attn_norm(x), positions, cache, cache_index)
    return x + self.drop(a, deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del v
    return (self.mlp_norm if self.spec.parallel_norms == 2 else self.attn_norm)(x)

  def mlp_branch(self, z):
    return self.mlp(z)


BLOCK_FAMILIES: dict[str, Any] = {'gpt': GptBlock, 'gemma': GemmaBlock, 'llama': LlamaBlock,
                                  'falcon': FalconBlock, 'moe': MoeBlock}


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
    self.layers = [cls(self.spec, layer_index=i, name=f'block_{i}')
                   for i in range(self.spec.depth)]

  def __call__(self, x, positions, caches=None, cache_index=None, deterministic=True):
    """x [B, T, C] -> ([B, T, C], per-layer caches or None)."""
    new_caches = []
    for i, layer in enumerate(self.layers):
      x = nn.with_logical_constraint(x, ('act_batch', 'act_length', 'act_embed'))
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
