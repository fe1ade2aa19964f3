"""Implicit context updates: token-dependent patches that stand in for the context.

For a context C and a query x, `compute_patch` returns per-example patches (rank-1 matrix
updates and vector deltas) such that the model *without* C, run on x alone at x's absolute
positions with the patched parameters, gives the next-token logits the model gives *with* C
(arXiv 2511.17864, building on 2507.16003):

    from ctr_jax import implicit
    patch = implicit.compute_patch(model, variables, context, query, method='stable')
    logits = implicit.patched_forward(model, variables, patch, query,
                                      start_pos=context.shape[1])
    # logits[:, -1] == model.apply(variables, concat([context, query], 1))[:, -1]

`context` and `query` are int32 [B, T] batches and the patch is per example. It is a pytree
in the structure of `variables['params']` (patched leaves only): `RankOne(left, right)` for a
kernel, the additive delta for a bias or norm scale, each with a leading batch axis.
`patch_deltas` densifies it, `apply_patch` adds one example's patch to the parameters so plain
`model.apply(..., positions=...)` runs the patched model. Every block family is supported
(gpt, gemma, llama, falcon, moe; see `ctr_jax.implicit.blocks` for the patch of each) and so is
the context-ready model, whose correction FFN gets an input patch as well (one-token queries).
"""

from ctr_jax.implicit import algorithm, patches
from ctr_jax.implicit.api import (
                                  DIAGNOSTICS,
                                  LOOPS,
                                  compute_patch,
                                  next_token_comparison,
                                  patched_forward,
                                  patched_next_token,
                                  record_next_token,
)
from ctr_jax.implicit.blocks import METHODS
from ctr_jax.implicit.patches import (
                                  MODES,
                                  RankOne,
                                  apply_patch,
                                  gradient_form,
                                  matrix_ranks,
                                  patch_deltas,
)
from ctr_jax.implicit.stable import rms_inversion, solve_rms_inversion

__all__ = ['algorithm', 'patches', 'METHODS', 'MODES', 'LOOPS', 'RankOne', 'compute_patch', 'patched_forward',
           'patch_deltas', 'apply_patch', 'next_token_comparison', 'record_next_token',
           'patched_next_token', 'DIAGNOSTICS', 'gradient_form',
           'matrix_ranks', 'rms_inversion', 'solve_rms_inversion']
