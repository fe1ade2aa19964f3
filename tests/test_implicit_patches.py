"""Per family: the patched model without the context reproduces the model with it.

Covers the reference checks C1-C4, C6-C8: exactness in float64 and float32 (a two-token query,
multi-layer, grouped/multi-query attention, sliding layers), rank-1 matrix patches, negative
controls (no patch at all; one patch omitted), MoE routing, and that a patch is an ordinary
parameter update that plain `model.apply` can run.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax import implicit
from ctr_jax.models import layers
from helpers import family_lm

FAMILIES = ('gemma', 'llama', 'falcon', 'moe', 'gpt')
# Patch leaves whose omission must break the equality: (output side, input side or None).
# 'W' is the dense layer's matrix: 'weight' [out, in] or 'kernel' [in, out] (model.kernel_layout).
OMITTED = {
    'gemma': (('post_mlp_norm', 'scale'), ('mlp', 'gate', 'W')),
    'llama': (('mlp', 'down', 'W'), ('mlp', 'up', 'W')),
    'falcon': (('mlp', 'fc_out', 'W'), None),
    'moe': (('mlp', 'down'), ('mlp', 'router', 'W')),
    'gpt': (('mlp', 'fc_out', 'bias'), ('mlp', 'fc_in', 'W')),
}
# Both weight layouts for every family in float64; the default layout in float32.
CASES = ([(b, 'float64', layout) for b in FAMILIES for layout in ('out_in', 'in_out')]
         + [(b, 'float32', 'out_in') for b in FAMILIES])


def matrix_name(layout):
  return 'weight' if layout == 'out_in' else 'kernel'


def precision(dtype):
  return jax.enable_x64(True) if dtype == 'float64' else contextlib.nullcontext()


def max_err(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def without(patch, path):
  """`patch` with the leaf at blocks/*/path zeroed in every layer: that patch omitted.

  (Zeroing keeps the pytree structure, so nothing recompiles.)
  """
  def zero(keys, leaf):
    names = tuple(k.key for k in keys)
    return jax.tree.map(jnp.zeros_like, leaf) if names[-len(path):] == path else leaf
  return jax.tree_util.tree_map_with_path(zero, patch, is_leaf=implicit.patches.is_leaf)


def plain_apply(model, variables, patch, query, start):
  """model.apply on each example's own patched parameters (the query alone at start...).

  With patch=None, the unpatched model on the query alone.
  """
  positions = start + jnp.arange(query.shape[1])

  def one(index, q):
    v = variables if patch is None else implicit.apply_patch(variables, patch, index)
    return model.apply(v, q[None], positions=positions)[0]
  return jax.jit(jax.vmap(one))(jnp.arange(query.shape[0]), query)


@pytest.mark.parametrize('block,dtype,layout', CASES)
def test_patched_query_without_context_equals_with_context(block, dtype, layout):
  with precision(dtype):
    model, variables, tokens = family_lm(block, dtype=dtype, kernel_layout=layout)
    context, query = tokens[:, :6], tokens[:, 6:]  # a two-token query at positions 6, 7
    full = jax.jit(model.apply)(variables, tokens)[:, -1]
    patch, info = implicit.compute_patch(model, variables, context, query, return_info=True)
    patched = implicit.patched_forward(model, variables, patch, query, start_pos=6)[:, -1]
    # The patch is a plain parameter update: model.apply runs it with no special code.
    plain = plain_apply(model, variables, patch, query, 6)[:, -1]
    alone = plain_apply(model, variables, None, query, 6)[:, -1]

    tol = 1e-10 if dtype == 'float64' else 1e-4 * max(1.0, float(jnp.max(jnp.abs(full))))
    assert patched.dtype == full.dtype
    for result in (patched, info['logits'], plain):
      assert max_err(result, full) <= tol
    assert max_err(alone, full) > 1e-2  # negative control: the query alone, unpatched

    ranks = implicit.matrix_ranks(implicit.patch_deltas(variables, patch))
    assert ranks, 'the patch has matrix updates'
    for path, per_example_ranks in ranks.items():
      # MoE: only the active experts' down projections move.
      allowed = {0, 1} if block == 'moe' and "['down']" in path else {1}
      assert set(per_example_ranks) <= allowed, (path, per_example_ranks)

    if dtype == 'float64':
      output_side, input_side = OMITTED[block]
      for path in (output_side, input_side) if block == 'gemma' else (output_side,):
        path = tuple(matrix_name(layout) if name == 'W' else name for name in path)
        broken = implicit.patched_forward(model, variables, without(patch, path), query, 6)
        assert max_err(broken[:, -1], full) > 1e-3, path


def test_moe_router_patch_keeps_the_full_context_routing():
  with jax.enable_x64(True):
    model, variables, tokens = family_lm('moe', dtype='float64', depth=3)
    _, info = implicit.compute_patch(model, variables, tokens[:, :7], tokens[:, 7:],
                                     return_info=True)
    for i, layer in enumerate(info['layers']):
      router = variables['params']['blocks'][f'block_{i}']['mlp']['router']['weight'].T
      expected = layers.moe_gates(layer['z_c'] @ router, 2)
      assert max_err(layer['gates'], expected) <= 1e-12
      assert np.array_equal(np.asarray(layer['gates']) > 0, np.asarray(expected) > 0)


def test_falcon_patches_only_the_output_matrix():
  model, variables, tokens = family_lm('falcon')
  patch = implicit.compute_patch(model, variables, tokens[:, :7], tokens[:, 7:])
  for layer in patch['blocks'].values():
    assert list(jax.tree_util.tree_leaves_with_path(
        layer, is_leaf=implicit.patches.is_leaf))[0][0] == (
            jax.tree_util.DictKey('mlp'), jax.tree_util.DictKey('fc_out'),
            jax.tree_util.DictKey('weight'))
    assert len(jax.tree.leaves(layer, is_leaf=implicit.patches.is_leaf)) == 1
