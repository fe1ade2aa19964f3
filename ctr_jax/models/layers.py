"""Building blocks shared by every model (notation: ctr_jax/notation.py): dense layers and their
weight layouts, initialisers, norms, activations and the feed-forward networks.

Attention and RoPE live in `ctr_jax.models.attention`, the block families built from both in
`ctr_jax.models.blocks`.
"""

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.models.config import ModelSpec


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
    return linear(x, weight, bias, self.dtype)


def linear(x, weight, bias, dtype, weight_axis: int = 1):
  """x W^T + b (weight [out, in], `weight_axis` 1) or x K + b (kernel [in, out], 0), with Flax's
  dtype promotion: the arithmetic of `Linear` and `nn.Dense`, for callers holding the arrays."""
  x, weight, bias = nn.dtypes.promote_dtype(x, weight, bias, dtype=dtype)
  y = jax.lax.dot_general(x, weight, (((x.ndim - 1,), (weight_axis,)), ((), ())))
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


def _family(spec: ModelSpec):
  """The block class of `spec.block`, whose class attributes are the family's traits.

  Imported at call time: ctr_jax.models.blocks is built from this module.
  """
  from ctr_jax.models import blocks  # pylint: disable=g-import-not-at-top
  return blocks.block_class(spec)


def norm(spec: ModelSpec, name: str | None = None) -> nn.Module:
  """The family's normalisation layer (its `norm_kind`): LayerNorm or an RMSNorm."""
  kind = _family(spec).norm_kind
  if kind == 'layer':
    return layer_norm(spec, name=name)
  return RMSNorm(spec, offset=kind == 'rms_offset', name=name)


ACTIVATIONS: dict[str, Callable] = {
    'gelu': functools.partial(nn.gelu, approximate=False),
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'silu': nn.silu,
    'relu': nn.relu,
}


def activation_name(spec: ModelSpec) -> str:
  """The MLP nonlinearity: `spec.activation`, else the family's ('gelu' is the exact erf form)."""
  return spec.activation or _family(spec).default_activation


def embed_scale(spec: ModelSpec) -> float:
  """Factor on the token embeddings: `spec.embed_scale`, else sqrt(C) for a family with
  `scale_embeddings` (Gemma) and 1 otherwise."""
  if spec.embed_scale:
    return float(spec.embed_scale)
  return math.sqrt(spec.width) if _family(spec).scale_embeddings else 1.0


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
