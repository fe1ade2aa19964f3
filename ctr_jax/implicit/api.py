"""The entry points of `ctr_jax.implicit`: compute a patch, run a patched model, compare the
next-token logits (see the package docstring). Everything works on the caller's weight layout
(`model.spec.kernel_layout`); patches come back in it.
"""

import functools

import jax
import jax.numpy as jnp

from ctr_jax.implicit import algorithm
from ctr_jax.implicit.blocks import METHODS
from ctr_jax.implicit.patches import MODES

LOOPS = algorithm.LOOPS
_CRT_CORRECTIONS = ('add', 'token_blind', 'concat')


def _check_choices(method, mode, loop):
  if method not in METHODS:
    raise ValueError(f'method={method!r}: expected one of {list(METHODS)}')
  if mode not in MODES:
    raise ValueError(f'mode={mode!r}: expected one of {list(MODES)}')
  if loop not in LOOPS:
    raise ValueError(f'loop={loop!r}: expected one of {list(LOOPS)}')


def _check_model(model, query_len, end: int | None = None):
  """Refuses what the patch code cannot do; `end` is the number of positions used."""
  spec = model.spec
  if spec.positions == 'learned' and end is not None and end > spec.max_len:
    raise ValueError(f'{end} positions exceed the learned position table (max_len='
                     f'{spec.max_len})')
  if spec.is_context_ready:
    if spec.correction not in _CRT_CORRECTIONS or spec.cumulative:
      raise ValueError(f'context-ready patches need a correction FFN with an exact sequential '
                       f'form: correction in {list(_CRT_CORRECTIONS)} and cumulative=False, got '
                       f'correction={spec.correction!r}, cumulative={spec.cumulative}')
    if query_len != 1:
      raise ValueError(f'the context-ready model is patched for one query token at a time '
                       f'(its correction reads the previous position), got {query_len}')


def _positions(start_pos, batch, length):
  start = jnp.broadcast_to(jnp.asarray(start_pos, jnp.int32), (batch,))
  return start[:, None] + jnp.arange(length, dtype=jnp.int32)


def _compute(model, variables, context, query, first_layer, method, mode, loop):
  b, tc = context.shape
  positions = _positions(tc, b, query.shape[1])
  if model.spec.is_context_ready:
    records, z_corr, baseline = algorithm.crt_record(model, variables, context, query)
    out, patch, layers = algorithm.crt_reduced(
        model, variables, query, positions, records=records, z_corr_c=z_corr, method=method,
        mode=mode, loop=loop, first_layer=first_layer)
  else:
    tokens = jnp.concatenate([context, query], axis=1)
    last = jnp.full((b,), tokens.shape[1] - 1)
    records, baseline = algorithm.record(model, variables, tokens, last, query.shape[1])
    x = algorithm.embed(model, variables, query, positions)
    out, patch, layers = algorithm.reduced(model, variables, x, positions, records=records,
                                           method=method, mode=mode, loop=loop,
                                           first_layer=first_layer)
  info = {'baseline_logits': baseline, 'logits': out[:, -1], 'layers': layers}
  return patch, info


_compute_jit = jax.jit(_compute, static_argnames=('model', 'first_layer', 'method', 'mode',
                                                  'loop'))


def compute_patch(model, variables, context, query, method: str = 'direct',
                  first_layer: int = 0, *, mode: str = 'action', loop: str = 'closed',
                  return_info: bool = False):
  """Per-example patches that make `query` without `context` behave as with it.

  Args:
    model: a TransformerLM or ContextReadyLM (any block family).
    variables: its variables.
    context: int32 [B, Tc], Tc >= 1.
    query: int32 [B, Tq]; equality is for the last query position.
    method: 'direct' (the paper's Theorem 1 patches) or 'stable' (Appendix B for Gemma: RMS
      inversion, rank-1 ΔW_down, residual Δm; identical to 'direct' for the other families).
    first_layer: layers below it stay unpatched; the first patched layer absorbs everything.
    mode: how the reduced pass applies the patches while computing them ('action' or
      'materialise'; use the same in `patched_forward`).
    loop: 'closed' (each patch from the actually patched state) or 'open' (from the recorded
      full-context layer inputs; an ablation).
    return_info: also return {'baseline_logits' [B, V], 'logits' [B, V] (patched, last
      position), 'layers': per-layer diagnostics (block_error, z, z_c, v, v_c, out, out_c, and
      the method's extras such as dm_max, constraint, hard_case)}.
  """
  _check_choices(method, mode, loop)
  context, query = jnp.asarray(context, jnp.int32), jnp.asarray(query, jnp.int32)
  if context.ndim != 2 or query.ndim != 2 or context.shape[0] != query.shape[0]:
    raise ValueError(f'context and query must be [B, T] with the same B, got {context.shape} '
                     f'and {query.shape}')
  if context.shape[1] < 1 or query.shape[1] < 1:
    raise ValueError('context and query need at least one token each')
  if not 0 <= first_layer < model.spec.depth:
    raise ValueError(f'first_layer={first_layer} must be in [0, depth={model.spec.depth})')
  _check_model(model, query.shape[1], context.shape[1] + query.shape[1])
  patch, info = _compute_jit(model, variables, context, query, first_layer=int(first_layer),
                             method=method, mode=mode, loop=loop)
  return (patch, info) if return_info else patch


@functools.partial(jax.jit, static_argnames=('model', 'mode'))
def _patched_forward(model, variables, patch, query, positions, mode):
  if model.spec.is_context_ready:
    return algorithm.crt_reduced(model, variables, query, positions, patch=patch, mode=mode)
  x = algorithm.embed(model, variables, query, positions)
  return algorithm.reduced(model, variables, x, positions, patch=patch, mode=mode)


def patched_forward(model, variables, patch, query, start_pos, *, mode: str = 'action'):
  """Logits [B, Tq, V] of the patched model on `query` alone at positions start_pos...

  `start_pos` is an int or [B] ints (normally the context length).
  """
  if mode not in MODES:
    raise ValueError(f'mode={mode!r}: expected one of {list(MODES)}')
  query = jnp.asarray(query, jnp.int32)
  positions = _positions(start_pos, query.shape[0], query.shape[1])
  _check_model(model, query.shape[1], int(jnp.max(positions)) + 1)
  return _patched_forward(model, variables, patch, query, positions, mode=mode)


# Per-layer diagnostics gathered by the next-token entry points ([L, B] each, where present).
DIAGNOSTICS = ('block_error', 'dm_max', 'dm_channel', 'dm_numerator', 'dm_f', 'dm_h',
               'dm_scale', 'rms_h', 'min_abs_f', 'constraint', 'mu')


@functools.partial(jax.jit, static_argnames=('model',))
def _record_next_token(model, variables, tokens, last):
  return algorithm.record(model, variables, tokens, last, 1)


@functools.partial(jax.jit, static_argnames=('model', 'method', 'mode', 'loop'))
def _patched_next_token(model, variables, records, query, positions, first_layer, method, mode,
                        loop):
  x = algorithm.embed(model, variables, query, positions)
  out, _, layers = algorithm.reduced(model, variables, x, positions, records=records,
                                     method=method, mode=mode, loop=loop,
                                     first_layer=first_layer)
  extras = {k: jnp.stack([layer[k] for layer in layers]) for k in DIAGNOSTICS if k in layers[0]}
  return out[:, -1], extras


def _check_transformer(model):
  if model.spec.is_context_ready:
    raise ValueError('the next-token entry points support the transformer; use compute_patch '
                     'for the context-ready model')


def record_next_token(model, variables, tokens, lengths):
  """Pass 1 once for right-padded prompts: (records, baseline logits [B, V]).

  tokens int32 [B, T] holds each example's sequence in its first `lengths[b]` slots (padding
  after it is ignored); the last real token is the query, everything before it the context.
  The records feed `patched_next_token` for any number of settings, so every setting is
  compared against one and the same baseline.
  """
  _check_transformer(model)
  lengths = jnp.asarray(lengths, jnp.int32)
  _check_model(model, 1, int(jnp.max(lengths)))
  return _record_next_token(model, variables, jnp.asarray(tokens, jnp.int32), lengths - 1)


def patched_next_token(model, variables, records, query, positions, *, method='direct',
                       mode='action', first_layer=0, loop='closed'):
  """Pass 2 from `record_next_token`'s records: the patched logits [B, V] of the query
  tokens [B] alone at their absolute `positions` [B], and per-layer diagnostics [L, B]
  (`DIAGNOSTICS` that the method produces). `first_layer` is traced (no recompiling)."""
  _check_choices(method, mode, loop)
  _check_transformer(model)
  query = jnp.asarray(query, jnp.int32).reshape(-1, 1)
  positions = jnp.asarray(positions, jnp.int32).reshape(-1, 1)
  if not 0 <= int(first_layer) < model.spec.depth:
    raise ValueError(f'first_layer={first_layer} must be in [0, depth={model.spec.depth})')
  _check_model(model, 1, int(jnp.max(positions)) + 1)
  return _patched_next_token(model, variables, records, query, positions,
                             jnp.asarray(first_layer, jnp.int32), method=method, mode=mode,
                             loop=loop)


def next_token_comparison(model, variables, tokens, lengths, *, method='direct', mode='action',
                          first_layer=0, loop='closed'):
  """Baseline vs patched next-token logits for right-padded prompts, one compile for all.

  `record_next_token` then `patched_next_token` (to compare several settings against one
  baseline, call those two directly). Returns (baseline [B, V], patched [B, V], per-layer
  diagnostics [L, B]).
  """
  _check_choices(method, mode, loop)
  records, baseline = record_next_token(model, variables, tokens, lengths)
  tokens = jnp.asarray(tokens, jnp.int32)
  last = jnp.asarray(lengths, jnp.int32) - 1
  query = jnp.take_along_axis(tokens, last[:, None], axis=1)[:, 0]
  patched, extras = patched_next_token(model, variables, records, query, last, method=method,
                                       mode=mode, first_layer=first_layer, loop=loop)
  return baseline, patched, extras
