"""Building blocks shared by every model (notation: ctr_jax/notation.py): dense layers and their
weight layouts, initialisers, norms, activations and the feed-forward networks.

Every parameter is created with its logical axis names (`nn.with_logical_partitioning`):
'embed' (C), 'mlp' (F), 'heads' / 'kv_heads' (H*Dh / G*Dh), 'head_dim' (Dh), 'vocab' (V),
'position' (the learned position table's rows), 'experts' (E). `ctr_jax.training.sharding` maps them to
the mesh with the config's rules.

Attention and RoPE live in `ctr_jax.models.attention`, the block families built from both in
`ctr_jax.models.blocks`.
"""

from collections.abc import Mapping
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.models import families
from ctr_jax.models.config import ModelSpec
from ctr_jax.models.layer_norm import LayerNorm
from ctr_jax.ops import kernels
from ctr_jax.ops.kernels import accumulation_dtype


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


def dense(spec: ModelSpec, features: int, axes: tuple, *, use_bias: bool = True,
          name: str | None = None, fan_in: int | None = None) -> nn.Module:
  """A dense layer with the spec's dtypes, initialiser and weight layout (`Linear`).

  `axes` are the logical axis names of its [in, out] matrix (e.g. ('embed', 'mlp')); the layer
  annotates its parameters with them where it creates them (see `ctr_jax.training.sharding`).
  """
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
  return Linear(features, use_bias=use_bias, layout=spec.kernel_layout, axes=tuple(axes),
                kernel_init=kernel_init, bias_init=bias_init, dtype=compute_dtype(spec),
                param_dtype=param_dtype(spec), name=name)


# ------------------------------------------------------------------------------------------------
# Dense layers and their two weight layouts. Everything that knows the layout lives here: a dense
# layer's parameters are a node {'weight': [out, in]} ('out_in', PyTorch's layout, faster on
# XLA:CPU, see docs/benchmarks.md) or {'kernel': [in, out]} ('in_out', Flax's `nn.Dense`), plus
# an optional 'bias' [out]. Code that holds the arrays (fused decode projections, the implicit
# patches) reads them through `linear` and `dense_matrix` instead of branching on the name.
# ------------------------------------------------------------------------------------------------

MATRIX_NAMES = {'out_in': 'weight', 'in_out': 'kernel'}


class Linear(nn.Module):
  """A dense layer y = x W^T + b with W [out, in] under 'weight' (layout 'out_in'), or
  `nn.Dense`'s y = x K + b with K [in, out] under 'kernel' ('in_out'); Flax's dtype promotion.

  The weight starts as the transpose of the kernel `nn.Dense` would draw from the same key, so
  both layouts initialise the same function, and the distinct name keeps a checkpoint of one
  layout from loading silently into the other. `axes` names the [in, out] matrix's logical axes.
  """
  features: int
  use_bias: bool = True
  layout: str = 'out_in'
  axes: tuple = (None, None)
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros
  dtype: Any = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    shape = (x.shape[-1], self.features)  # [in, out]
    if self.layout == 'out_in':
      def weight_init(key, shape, dtype):
        return self.kernel_init(key, shape[::-1], dtype).T
      node = {'weight': self.param('weight', nn.with_logical_partitioning(
          weight_init, self.axes[::-1]), shape[::-1], self.param_dtype)}
    else:
      node = {'kernel': self.param('kernel', nn.with_logical_partitioning(
          self.kernel_init, self.axes), shape, self.param_dtype)}
    if self.use_bias:
      node['bias'] = self.param('bias', nn.with_logical_partitioning(
          self.bias_init, self.axes[-1:]), (self.features,), self.param_dtype)
    return linear(x, node, self.dtype)


def matrix_name(node: Mapping) -> str:
  """'weight' or 'kernel': the name of a dense layer's matrix in its parameter node."""
  return 'weight' if 'weight' in node else 'kernel'


def dense_matrix(node: Mapping) -> jax.Array:
  """The [in, out] view of a dense layer's matrix (a transpose of an [out, in] 'weight')."""
  return node['weight'].T if 'weight' in node else node['kernel']


def linear(x, node: Mapping, dtype):
  """x W^T + b or x K + b for a dense layer's parameter node (either layout), with Flax's dtype
  promotion: the arithmetic of `Linear`, for callers holding the arrays."""
  name = matrix_name(node)
  x, matrix, bias = nn.dtypes.promote_dtype(x, node[name], node.get('bias'), dtype=dtype)
  y = kernels.dense_product(x, matrix, contract=1 if name == 'weight' else 0)
  return y if bias is None else y + bias


def concat_outputs(nodes) -> dict:
  """One dense layer computing the outputs of all `nodes` (same input, same layout), the matrices
  (and biases, if every node has one) concatenated along the output axis."""
  name = matrix_name(nodes[0])
  out = {name: jnp.concatenate([n[name] for n in nodes], axis=0 if name == 'weight' else -1)}
  if all('bias' in n for n in nodes):
    out['bias'] = jnp.concatenate([n['bias'] for n in nodes], axis=-1)
  return out


def to_kernel_layout(params, layout: str):
  """`params` with every dense layer's matrix in `layout` ('out_in': {'weight': [out, in]},
  'in_out': {'kernel': [in, out]}); everything else (embeddings, norms, stacked experts) as is.
  Numpy or jax arrays, dtype kept.
  """
  target = MATRIX_NAMES[layout]
  source = MATRIX_NAMES['in_out' if layout == 'out_in' else 'out_in']

  def walk(node):
    if not isinstance(node, Mapping):
      return node
    out = {k: walk(v) for k, v in node.items()}
    if getattr(out.get(source), 'ndim', 0) == 2:
      out[target] = out.pop(source).swapaxes(0, 1)
    return out
  return walk(params)


def embedding_init(spec: ModelSpec):
  return nn.initializers.normal(1.0 if spec.init == 'torch' else 0.02)


def layer_norm(spec: ModelSpec, name: str | None = None) -> nn.Module:
  """LayerNorm with Flax's parameters and maths and a backward pass that suits XLA:CPU
  (`ctr_jax.models.layer_norm`)."""
  return LayerNorm(spec, dtype=compute_dtype(spec), param_dtype=param_dtype(spec), name=name)


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
  """N(x) = x / sqrt(mean(x^2) + eps) over the last axis, in at least float32."""
  x = x.astype(accumulation_dtype(x.dtype))
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


class RMSNorm(nn.Module):
  """RMSNorm with a learned scale; `offset` is Gemma's storage of the scale as w in (1 + w).

  The two conventions also round differently in low precision, as their reference code does:
  Gemma multiplies N(x) by (1 + w) in float32 and casts the product, Llama casts N(x) to the
  compute dtype first and multiplies by w there. `axis` is the logical name of the normalised
  axis: 'embed' (C), or 'head_dim' for the per-head QK-norm.
  """
  spec: ModelSpec
  offset: bool = False
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.zeros if self.offset else nn.initializers.ones
    scale = self.param('scale', nn.with_logical_partitioning(init, (self.axis,)),
                       (x.shape[-1],), param_dtype(self.spec))
    dtype = compute_dtype(self.spec)
    normed = rms_normalize(x, self.spec.layer_norm_eps)
    if self.offset:
      return (normed * (1 + scale.astype(normed.dtype))).astype(dtype)
    return normed.astype(dtype) * scale.astype(dtype)


def _family(spec: ModelSpec) -> families.Traits:
  """The traits of `spec.block`'s family."""
  return families.traits(spec.block)


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
    h = dense(s, s.mlp_dim, ('embed', 'mlp'), use_bias=self.use_bias, name='fc_in',
              fan_in=x.shape[-1])(x)
    h = ACTIVATIONS[self.activation](h)
    return dense(s, self.out_features or s.width, ('mlp', 'embed'), use_bias=self.use_bias,
                 name='fc_out', fan_in=s.mlp_dim)(h)


class GatedMlp(nn.Module):
  """down(act(gate z) * up z) without biases: GeGLU (Gemma) or SwiGLU (Llama)."""
  spec: ModelSpec

  @nn.compact
  def __call__(self, z):
    s = self.spec
    gate = dense(s, s.mlp_dim, ('embed', 'mlp'), use_bias=False, name='gate')(z)
    up = dense(s, s.mlp_dim, ('embed', 'mlp'), use_bias=False, name='up')(z)
    a = ACTIVATIONS[activation_name(s)](gate) * up
    return dense(s, s.width, ('mlp', 'embed'), use_bias=False, name='down')(a)


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
  Expert kernels are stacked: gate/up [E, C, F], down [E, F, C] (the same in both weight layouts:
  `kernel_layout` concerns the dense layers only, here the router).
  """
  spec: ModelSpec

  @nn.compact
  def __call__(self, z):
    s = self.spec
    e, c, f = s.num_experts, s.width, s.mlp_dim
    init = _torch_uniform_stacked if s.init == 'torch' else (
        lambda fan_in: nn.initializers.normal(0.02))
    router = dense(s, e, ('embed', 'experts'), use_bias=False, name='router')
    gates = moe_gates(router(z), s.experts_per_token)
    pdt, dtype = param_dtype(s), compute_dtype(s)
    stacked = lambda fan_in, axes: nn.with_logical_partitioning(init(fan_in), axes)
    w_gate = self.param('gate', stacked(c, ('experts', 'embed', 'mlp')), (e, c, f), pdt)
    w_up = self.param('up', stacked(c, ('experts', 'embed', 'mlp')), (e, c, f), pdt)
    w_down = self.param('down', stacked(f, ('experts', 'mlp', 'embed')), (e, f, c), pdt)
    w_gate, w_up, w_down = (w.astype(dtype) for w in (w_gate, w_up, w_down))
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
