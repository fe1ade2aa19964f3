"""LayerNorm with a hand-written backward pass (notation: ctr_jax/notation.py).

Same parameters ('scale', 'bias' over C), initialisation and maths as `flax.linen.LayerNorm`
with float32 statistics; what differs is how XLA:CPU gets to compute it. Autodiff of Flax's
LayerNorm leaves the backward's row sums as reduction fusions that multiply by the [C] scale
inside them, and XLA:CPU's YNNPACK reduction fusions take that scale as a materialised
[B, T, C] array: one extra write and read of the activations per norm and step (the profile in
docs/benchmarks.md). Here the row sums that involve the scale are matrix-vector products with
it, [.., C] x [C], which take the vector as it is.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.models.config import ModelSpec


def _accumulation_dtype(dtype):
  return jnp.promote_types(dtype, jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def normalize_affine(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
  """(x - mean) / sqrt(var + eps) * scale + bias over the last axis, in at least float32."""
  return _normalize_affine_forward(x, scale, bias, eps)[0]


def _normalize_affine_forward(x, scale, bias, eps):
  acc = _accumulation_dtype(x.dtype)
  xf = x.astype(acc)
  centred = xf - jnp.mean(xf, axis=-1, keepdims=True)
  # Two-pass variance (not E[x^2] - E[x]^2): no cancellation for inputs with a large mean.
  inv_std = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
  normed = centred * inv_std
  y = normed * scale.astype(acc) + bias.astype(acc)
  # x's dtype rides along as an empty array (residuals must be arrays).
  return y, (normed, inv_std, scale, bias, jnp.zeros((0,), x.dtype))


def _normalize_affine_backward(eps, residuals, dy):
  del eps
  normed, inv_std, scale, bias, x_like = residuals
  acc = normed.dtype
  dy = dy.astype(acc)
  width = normed.shape[-1]
  scale_acc = scale.astype(acc)
  tokens = tuple(range(dy.ndim - 1))
  dy_normed = dy * normed
  d_scale = jnp.sum(dy_normed, axis=tokens)
  d_bias = jnp.sum(dy, axis=tokens)
  # d/dx of the normalisation: inv_std * (g - mean(g) - normed * mean(g * normed)), g = dy*scale;
  # both means are products with the scale vector (see the module docstring).
  mean_g = jnp.matmul(dy, scale_acc / width, precision=jax.lax.Precision.HIGHEST)[..., None]
  mean_g_normed = jnp.matmul(dy_normed, scale_acc / width,
                             precision=jax.lax.Precision.HIGHEST)[..., None]
  dx = inv_std * (dy * scale_acc - mean_g - normed * mean_g_normed)
  return dx.astype(x_like.dtype), d_scale.astype(scale.dtype), d_bias.astype(bias.dtype)


normalize_affine.defvjp(_normalize_affine_forward, _normalize_affine_backward)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis; the output in the model's compute dtype."""
  spec: ModelSpec
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    width = x.shape[-1]
    scale = self.param('scale', nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
                       (width,), self.param_dtype)
    bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
                      (width,), self.param_dtype)
    return normalize_affine(x, scale, bias, self.spec.layer_norm_eps).astype(self.dtype)
