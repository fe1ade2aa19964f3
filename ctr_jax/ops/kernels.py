"""The kernels the models call for their products, rotary tables and attention: one seam.

The model code (ctr_jax/models) writes the paper's equations: x W, RoPE's rotation, softmax(q k^T)
v. How each is computed on a backend is decided here, in one place (`on_cpu`), so a
backend-specific trick never sits in the layer code:

  dense_product    x W^T or x K; bfloat16 operands accumulate in float32 with an explicit
                   backward (`bf16_product`); on XLA:CPU a product of 2-32 float32 rows is
                   computed weight-first (`few_rows_product`, the small-batch decode form).
  rotation_table   the sin/cos table, materialised on XLA:CPU (`rotation_table`).
  attention        the batched masked softmax attention: on XLA:CPU a hand-written backward
                   pass (`softmax_attention`), elsewhere jax.nn.dot_product_attention, cuDNN's
                   fused kernel where the shapes allow (`attention_implementation`).

Each choice is exact: the alternatives compute the same numbers (tests/test_models.py,
tests/test_attention.py), only their speed differs (docs/benchmarks.md).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np


def on_cpu() -> bool:
  """Whether the XLA:CPU kernels apply (every backend-specific choice below asks this)."""
  return jax.default_backend() == 'cpu'


def accumulation_dtype(dtype):
  """The dtype reductions run in: float32, or float64 for a float64 model."""
  return jnp.promote_types(dtype, jnp.float32)


# ------------------------------------------------------------------------------------------------
# Dense products.
# ------------------------------------------------------------------------------------------------


def dense_product(x, matrix, contract: int):
  """x [..., in] times a dense layer's matrix: [out, in] when `contract` is 1 (x W^T), [in, out]
  when 0 (x K). Operands are already in the compute dtype."""
  if x.dtype == jnp.bfloat16 and matrix.dtype == jnp.bfloat16:
    return bf16_product(x, matrix, contract)
  if contract == 1 and _few_rows(x):
    return few_rows_product(x, matrix)
  return jax.lax.dot_general(x, matrix, (((x.ndim - 1,), (contract,)), ((), ())))


# A decode step at a small batch multiplies a few rows by each weight matrix. XLA:CPU's YNNPACK
# product repacks its right-hand operand on every call; in x W^T that is the weight, so the step
# streams each matrix several times (at B = 8 the peer-shape step read its weights at about a
# third of the batch-1 rate). As W x^T the few activation rows are what gets packed. XLA folds
# plain transposes back into the dot's dimension numbers (the slow form again, without YNNPACK),
# hence the barriers. One row stays a matrix-vector product, which is fast as it is; past ~32 rows
# the product is compute-bound and the form no longer matters (python -m
# ctr_jax.projects.perf.matmul_dtypes --few_rows measures it).
FEW_ROWS = (2, 32)


def _few_rows(x) -> bool:
  rows = math.prod(x.shape[:-1])
  return FEW_ROWS[0] <= rows <= FEW_ROWS[1] and x.dtype == jnp.float32 and on_cpu()


def few_rows_product(x, weight):
  """x [..., in] W^T for W [out, in], computed as (W x^T)^T with both transposes materialised."""
  rows = jax.lax.optimization_barrier(x.reshape(-1, x.shape[-1]).T)  # [in, rows]
  y = jax.lax.optimization_barrier(jax.lax.dot_general(weight, rows, (((1,), (0,)), ((), ()))))
  return y.T.reshape(*x.shape[:-1], weight.shape[0])


def _f32_dot(a, b, a_axes, b_axes):
  return jax.lax.dot_general(a, b, ((a_axes, b_axes), ((), ())),
                             preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def bf16_product(x, matrix, contract: int):
  """x [..., in] times a bfloat16 matrix ([out, in] when `contract` is 1, [in, out] when 0),
  forward and backward products accumulated in float32, results rounded to x's dtype.

  The same numbers as the plain bf16 dot (which accumulates in float32 on every backend), but
  each product asks for a float32 result: XLA:CPU upcasts a dot with a bfloat16 result to a
  float32 dot of converted operands, and keeps a bf16 x bf16 -> f32 dot, which it can send to the
  CPU's bfloat16 matrix units (AMX). Autodiff of the plain dot would produce bf16-result dots
  again, hence the explicit backward (docs/benchmarks.md, "bfloat16 products on XLA:CPU").
  """
  return _f32_dot(x, matrix, (x.ndim - 1,), (contract,)).astype(x.dtype)


def _bf16_product_fwd(x, matrix, contract):
  return bf16_product(x, matrix, contract), (x, matrix)


def _bf16_product_bwd(contract, residuals, g):
  x, matrix = residuals
  dx = _f32_dot(g, matrix, (g.ndim - 1,), (1 - contract,)).astype(x.dtype)
  lead = tuple(range(x.ndim - 1))  # every token axis: summed over for the matrix's gradient
  dmatrix = _f32_dot(g, x, lead, lead) if contract == 1 else _f32_dot(x, g, lead, lead)
  return dx, dmatrix.astype(matrix.dtype)


bf16_product.defvjp(_bf16_product_fwd, _bf16_product_bwd)


# ------------------------------------------------------------------------------------------------
# Rotary tables and attention.
# ------------------------------------------------------------------------------------------------


def rotation_table(table: jax.Array) -> jax.Array:
  """The sin or cos table [.., T, Dh/2], computed once rather than once per head and batch row.

  XLA:CPU fuses the sin and cos into the rotation that broadcasts them over B and H, so every
  element of q and k recomputed two transcendentals (64x the work at the peer shape: ~8% of
  the training step's thread time, docs/benchmarks.md), and it drops an optimization barrier
  before fusing. A product with the identity is exact (each output is 1 x one input plus
  zeros) and ends the fusion, so the table is materialised; tests/test_models.py checks the
  compiled step. Other backends keep the plain table.
  """
  if not on_cpu():
    return table
  eye = jnp.eye(table.shape[-1], dtype=table.dtype)
  return jnp.matmul(table, eye, precision=jax.lax.Precision.HIGHEST)


# Which attention computes `attention`: 'cpu' the hand-written kernel (`softmax_attention`),
# 'xla' / 'cudnn' jax.nn.dot_product_attention's implementations (`library_attention`).
ATTENTION_IMPLEMENTATIONS = ('cpu', 'xla', 'cudnn')

# cuDNN's fused (flash) attention, as JAX gates it (jax/_src/cudnn/fused_attention_stablehlo.py,
# `check_layout` and `check_is_flash_attention`; cuDNN's support matrix:
# https://docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/Attention.html):
# float16 / bfloat16 only; the head dim a multiple of 8 and at most 128 before Hopper, 256 from
# Hopper (compute capability 9.0) on; with a mask (passed on as a bias) in training, even query
# and key lengths. A head dim off the multiple is zero-padded (`CUDNN_HEAD_DIM_MULTIPLE`).
CUDNN_DTYPES = ('bfloat16', 'float16')
CUDNN_HEAD_DIM_MULTIPLE = 8


def cudnn_max_head_dim(compute_capability: str) -> int:
  """The largest head dim JAX sends to cuDNN's fused attention on a GPU of this capability."""
  major = int(str(compute_capability).split('.')[0])
  return 256 if major >= 9 else 128


def padded_head_dim(head_dim: int) -> int:
  """The head dim cuDNN attention runs at: the next multiple of `CUDNN_HEAD_DIM_MULTIPLE`."""
  return -(-head_dim // CUDNN_HEAD_DIM_MULTIPLE) * CUDNN_HEAD_DIM_MULTIPLE


def cudnn_fits(dtype, queries: int, keys: int, head_dim: int, max_head_dim: int) -> bool:
  """Whether cuDNN's fused attention takes these shapes (the head dim padded to a multiple
  of 8 first)."""
  return (jnp.dtype(dtype).name in CUDNN_DTYPES and padded_head_dim(head_dim) <= max_head_dim
          and queries % 2 == 0 and keys % 2 == 0)


def _cuda_capability() -> str | None:
  """The first device's compute capability on a CUDA GPU backend, else None."""
  if jax.default_backend() != 'gpu':
    return None
  device = jax.devices()[0]
  if 'cuda' not in str(getattr(device.client, 'platform_version', '')).lower():
    return None  # ROCm: no cuDNN
  return getattr(device, 'compute_capability', None)


def attention_implementation(q, k) -> str:
  """The attention `attention` runs for q [N, Q, Dh], k [N, S, Dh] on the default backend: the
  hand-written kernel on XLA:CPU, cuDNN's fused kernel on a CUDA GPU where the shapes allow, XLA's
  jax.nn.dot_product_attention otherwise (TPU, ROCm, float32)."""
  if on_cpu():
    return 'cpu'
  capability = _cuda_capability()
  if capability is not None and cudnn_fits(q.dtype, q.shape[1], k.shape[1], q.shape[-1],
                                           cudnn_max_head_dim(capability)):
    return 'cudnn'
  return 'xla'


def attention(q, k, v, mask, scale: float, implementation: str | None = None) -> jax.Array:
  """softmax(scale q k^T, masked) v for q [N, Q, Dh], k/v [N, S, Dh], mask [N, Q, S] -> [N, Q, Dh].

  `implementation` (one of ATTENTION_IMPLEMENTATIONS; None: `attention_implementation`'s choice
  for this backend) only changes how it is computed: the values are the same up to rounding
  (tests/test_attention.py). Scores and softmax in float32 for low-precision inputs.
  """
  implementation = implementation or attention_implementation(q, k)
  if implementation == 'cpu':
    return softmax_attention(q, k, v, mask, scale)
  if implementation == 'cudnn':
    try:
      return library_attention(q, k, v, mask, scale, 'cudnn',
                               head_dim_multiple=CUDNN_HEAD_DIM_MULTIPLE)
    except NotImplementedError:  # a cuDNN version or GPU rule the static check does not know
      implementation = 'xla'
  if implementation != 'xla':
    raise ValueError(f'attention implementation {implementation!r}: allowed '
                     f'{list(ATTENTION_IMPLEMENTATIONS)}')
  return library_attention(q, k, v, mask, scale, 'xla')


def library_attention(q, k, v, mask, scale: float, implementation: str,
                      head_dim_multiple: int = 1) -> jax.Array:
  """`attention` by jax.nn.dot_product_attention ('xla' or 'cudnn').

  The merged axis N = B*G becomes its batch axis with one head ([N, Q, 1, Dh]: the same
  products, no copy), the mask its [N, 1, Q, S] mask. q, k and v are zero-padded to a head dim
  that is a multiple of `head_dim_multiple` (exact: zero columns add nothing to q k^T, and the
  output's padded columns are dropped); the scale stays the caller's.
  """
  dh = q.shape[-1]
  pad = -dh % head_dim_multiple
  if pad:
    q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (q, k, v))
  out = jax.nn.dot_product_attention(q[:, :, None], k[:, :, None], v[:, :, None],
                                     mask=mask[:, None], scale=scale,
                                     implementation=implementation)
  return out[:, :, 0, :dh].astype(q.dtype)


def _attention_probs(scaled_q, k, mask):
  acc = accumulation_dtype(scaled_q.dtype)
  logits = jnp.einsum('nqd,nkd->nqk', scaled_q, k, preferred_element_type=acc)
  # finfo.min, not -inf: a fully masked row then averages instead of producing NaN.
  return jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(acc).min), axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def softmax_attention(q, k, v, mask, scale):
  """`attention` as XLA:CPU runs it fastest: scores and softmax in float32 for low-precision
  inputs, and a hand-written backward pass that reuses the saved probabilities and takes the
  softmax correction from rowsum(dO * O); it beats autodiff on XLA:CPU (docs/benchmarks.md).
  """
  return _attention_forward(q, k, v, mask, scale)[0]


def _attention_forward(q, k, v, mask, scale):
  # The scale goes on q [N, Q, Dh], not on the scores [N, Q, S]: XLA:CPU's product fusions
  # take the scalar as a materialised [N, Q, S] array, read again in the backward pass.
  scaled_q = q * jnp.asarray(scale, q.dtype)
  probs = _attention_probs(scaled_q, k, mask)
  out = jnp.einsum('nqk,nkd->nqd', probs.astype(v.dtype), v,
                   preferred_element_type=probs.dtype).astype(q.dtype)
  return out, (scaled_q, k, v, mask, probs, out)


def _attention_backward(scale, residuals, d_out):
  scaled_q, k, v, mask, probs, out = residuals
  acc = probs.dtype
  d_out_acc = d_out.astype(acc)
  # The products take their operands in the inputs' dtype and accumulate in `acc`, as the
  # forward does (in bfloat16 that is the form XLA:CPU keeps in bf16 instead of upcasting).
  dv = jnp.einsum('nqk,nqd->nkd', probs.astype(v.dtype), d_out.astype(v.dtype),
                  preferred_element_type=acc)
  d_probs = jnp.einsum('nqd,nkd->nqk', d_out, v, preferred_element_type=acc)
  # Softmax backward: rowsum(dP * P) == rowsum(dO * O) per query.
  delta = jnp.sum(d_out_acc * out.astype(acc), axis=-1, keepdims=True)
  d_logits = probs * (d_probs - delta)  # the gradient of the scaled scores
  dq = jnp.einsum('nqk,nkd->nqd', d_logits.astype(k.dtype), k, preferred_element_type=acc)
  dk = jnp.einsum('nqk,nqd->nkd', d_logits.astype(scaled_q.dtype), scaled_q,
                  preferred_element_type=acc)
  d_mask = np.zeros(mask.shape, jax.dtypes.float0)
  return ((dq * scale).astype(scaled_q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), d_mask)


softmax_attention.defvjp(_attention_forward, _attention_backward)
