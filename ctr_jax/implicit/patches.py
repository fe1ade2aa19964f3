"""Patch pytrees, rank-1 factors, and dense layers that apply a per-example patch.

A patch mirrors `variables['params']`: only patched leaves are present. A dense layer's matrix
leaf is a `RankOne` (ΔW = left ⊗ right for each example, in the [in, out] view of the matrix; the
RankOne of an [out, in] 'weight' is marked `transposed`, so its dense form has the weight's own
layout); a vector's leaf (a bias or a norm scale) is its additive delta with a leading batch
axis. The patch code reads dense layers in either layout through `ctr_jax.models.layers`.

Two ways to apply a patch, as the paper's bf16 discussion needs both:
  'action'      W z + (z · left) right, the rank-1 term in float32 (float64 for float64 models);
                the patched weight never exists, so nothing is rounded to the parameter dtype;
  'materialise' (W + ΔW) rounded to the parameter dtype first, as a patched checkpoint would be.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.models import layers

MODES = ('action', 'materialise')


@flax.struct.dataclass
class RankOne:
  """ΔW[b] = outer(left[b], right[b]): left [B, ..., in], right [B, ..., out].

  `transposed` marks the patch of a [out, in] weight (`layers.Linear`): its dense form is then
  outer(right, left), in the weight's own layout.
  """
  left: jax.Array
  right: jax.Array
  transposed: bool = flax.struct.field(pytree_node=False, default=False)

  def dense(self) -> jax.Array:
    """ΔW in the layout of the parameter it patches."""
    if self.transposed:
      return self.right[..., :, None] * self.left[..., None, :]
    return self.outer()

  def outer(self) -> jax.Array:
    """ΔW as [.., in, out], whatever the parameter's layout."""
    return self.left[..., :, None] * self.right[..., None, :]

  def scale(self, factor) -> 'RankOne':
    return RankOne(self.left, self.right * factor, self.transposed)


def is_leaf(x) -> bool:
  return isinstance(x, RankOne)


def safe_divisor(x: jax.Array) -> jax.Array:
  """x with exact zeros replaced by one: the paper's guard against division by zero."""
  return jnp.where(x == 0, jnp.ones_like(x), x)


def input_patch(z: jax.Array, z_target: jax.Array, kernel: jax.Array) -> RankOne:
  """ΔW with (W + ΔW) z = W z_target for a [.., in, out] matrix (`layers.dense_matrix`, or
  stacked expert kernels): W δz z^T / ‖z‖² (rank 1).

  z, z_target [B, in]; a stacked kernel [E, in, out] gets one factor pair per expert.
  """
  acc = layers.accumulation_dtype(z.dtype)
  z, dz = z.astype(acc), (z_target.astype(acc) - z.astype(acc))
  left = z / safe_divisor(jnp.sum(z * z, axis=-1, keepdims=True))
  right = jnp.einsum('bi,...io->b...o', dz, kernel.astype(acc))
  if kernel.ndim == 3:
    left = jnp.broadcast_to(left[:, None], right.shape[:2] + left.shape[-1:])
  return RankOne(left, right)


def output_patch(u: jax.Array, delta_y: jax.Array) -> RankOne:
  """ΔW with (W + ΔW) u = W u + Δy: Δy u^T / ‖u‖² (rank 1). u [B, .., in], Δy [B, .., out]."""
  acc = layers.accumulation_dtype(u.dtype)
  u = u.astype(acc)
  return RankOne(u / safe_divisor(jnp.sum(u * u, axis=-1, keepdims=True)), delta_y.astype(acc))


def linear(x, node, delta: RankOne | None = None, delta_bias=None, *, dtype,
           mode: str = 'action'):
  """x [B, T, in] -> [B, T, out] for a dense layer's parameter node ({'weight' | 'kernel',
  'bias'?}, either layout) with `layers.Linear` numerics plus a per-example patch."""
  acc = layers.accumulation_dtype(dtype)
  x = x.astype(dtype)
  bias = node.get('bias')
  if delta is not None and mode == 'materialise':
    kernel = layers.dense_matrix(node)
    patched = (kernel.astype(acc) + delta.outer()).astype(kernel.dtype)
    y = jnp.einsum('bti,bio->bto', x, patched.astype(dtype))
  else:
    name = layers.matrix_name(node)
    y = layers.linear(x, {name: node[name]}, dtype)
    if delta is not None:
      coeff = jnp.einsum('bti,bi->bt', x.astype(acc), delta.left)
      y = (y.astype(acc) + coeff[..., None] * delta.right[:, None]).astype(dtype)
  if bias is not None:
    if delta_bias is None:
      y = y + bias.astype(dtype)
    elif mode == 'materialise':
      y = y + (bias.astype(acc) + delta_bias).astype(bias.dtype).astype(dtype)[:, None]
    else:
      y = (y.astype(acc) + bias.astype(acc) + delta_bias[:, None]).astype(dtype)
  return y


def expert_linear(x, kernel, delta: RankOne | None = None, *, dtype, mode: str = 'action'):
  """Stacked experts: x [B, T, in] or [B, T, E, in], kernel [E, in, out] -> [B, T, E, out]."""
  acc = layers.accumulation_dtype(dtype)
  x = x.astype(dtype)
  shared = x.ndim == 3  # every expert reads the same input
  if delta is not None and mode == 'materialise':
    patched = (kernel.astype(acc) + delta.outer()).astype(kernel.dtype).astype(dtype)
    return jnp.einsum('bti,beio->bteo' if shared else 'btei,beio->bteo', x, patched)
  y = jnp.einsum('bti,eio->bteo' if shared else 'btei,eio->bteo', x, kernel.astype(dtype))
  if delta is not None:
    coeff = jnp.einsum('bti,bei->bte' if shared else 'btei,bei->bte', x.astype(acc), delta.left)
    y = (y.astype(acc) + coeff[..., None] * delta.right[:, None]).astype(dtype)
  return y


def patch_deltas(variables, patch):
  """The patch as dense per-example deltas [B, *leaf shape], in the structure of the params.

  Unpatched parameters are absent. Checks each delta against the parameter it patches.
  """
  params = variables['params'] if 'params' in variables else variables
  dense = jax.tree.map(lambda x: x.dense() if is_leaf(x) else x, patch, is_leaf=is_leaf)

  def check(path, delta):
    target = params
    for key in path:
      target = target[key.key]
    if delta.shape[1:] != target.shape:
      raise ValueError(f'patch leaf {jax.tree_util.keystr(path)} has per-example shape '
                       f'{delta.shape[1:]}, the parameter has {target.shape}')
    return delta
  return jax.tree_util.tree_map_with_path(check, dense)


def apply_patch(variables, patch, index: int = 0):
  """`variables` with example `index`'s patch added (rounded to the parameter dtype).

  The result is an ordinary parameter set: `model.apply(apply_patch(v, p, b), query[b:b+1],
  positions=...)` runs the patched model with no knowledge of the patch.
  """
  deltas = patch_deltas(variables, patch)
  params = variables['params']

  def add(tree, delta_tree):
    out = dict(tree)
    for key, delta in delta_tree.items():
      if isinstance(delta, dict):
        out[key] = add(tree[key], delta)
      else:
        acc = layers.accumulation_dtype(tree[key].dtype)
        out[key] = (tree[key].astype(acc) + delta[index].astype(acc)).astype(tree[key].dtype)
    return out
  return {**variables, 'params': add(params, deltas)}


def gradient_form(kernel, x, target):
  """One gradient step on l(W) = ½‖x W − target‖² from W = kernel, with rate 1/‖x‖².

  For target = z_C W this lands on W + ΔW of `input_patch` (the normalised LMS step that
  zeroes l), for target = a W + Δy on `output_patch`: the patch is a single, exactly sized step
  on a local objective. x [in], target [out].
  """
  loss = lambda w: 0.5 * jnp.sum(jnp.square(x @ w - target))
  return kernel - jax.grad(loss)(kernel) / jnp.sum(x * x)


def matrix_ranks(deltas, tol: float | None = None) -> dict:
  """Numerical rank of every per-example matrix delta (2-D leaves per example), by path."""
  ranks = {}

  def visit(path, delta):
    if delta.ndim >= 3:
      # The outer product is formed in the delta's dtype, so rank 1 holds to its precision.
      eps = float(jnp.finfo(delta.dtype).eps)
      flat = np.asarray(delta, np.float64).reshape((-1,) + delta.shape[-2:])
      ranks[jax.tree_util.keystr(path)] = []
      for m in flat:
        s = np.linalg.svd(m, compute_uv=False)
        cutoff = tol if tol is not None else s[0] * max(m.shape) * eps
        ranks[jax.tree_util.keystr(path)].append(int(np.sum(s > cutoff)))
  jax.tree_util.tree_map_with_path(visit, deltas)
  return ranks
