"""The multi-layer algorithm: record with context, then patch layer by layer without it.

Pass 1 runs the unmodified model on context + query and records, for every layer at the query's
last position, v_C, z_C, the layer output out_C (and h_C for Gemma's stable update). Pass 2 runs
the query alone at its absolute positions (same RoPE phase, same learned positions). At each
layer the attention half runs unpatched (it sees no context), the layer's patch is computed from
the values this pass actually produced (closed loop: the already-patched earlier layers' real
output, so rounding is re-absorbed at every layer), and the patched MLP half feeds the next
layer. `loop='open'` instead feeds every patched layer after the first the recorded
full-context input, the ablation the paper's self-correction argument is about.

Queries of several tokens: the patch is computed at the last position and is a parameter patch,
so pass 2 applies it at every query position; earlier query tokens attend to each other in both
passes, and only the last position is guaranteed to match.
"""

import jax.numpy as jnp

from ctr_jax.implicit import blocks
from ctr_jax.inference import decode

LOOPS = ('closed', 'open')


# The model's stages (ctr_jax/models/lm.py), each one `model.apply` on the variables.

def _attend(model, variables, i, x, positions, cache=None, cache_index=None):
  return model.apply(variables, i, x, positions, cache, cache_index, method='layer_attend')[0]


def _mlp_input(model, variables, i, x, v):
  return model.apply(variables, i, x, v, method='layer_mlp_input')


def embed(model, variables, tokens, positions):
  return model.apply(variables, tokens, True, positions, method='embed_tokens')


def logits(model, variables, z):
  return model.apply(variables, z, method='logits')


def _correction_input(model, variables, feedback, e):
  return model.apply(variables, feedback, e, method='correction_input')


def _block_params(variables, i):
  return variables['params']['blocks'][f'block_{i}']


def _gather(a, index):
  """a [B, T, ...] at per-example positions index [B, K] -> [B, K, ...]."""
  index = index.reshape(index.shape + (1,) * (a.ndim - 2))
  return jnp.take_along_axis(a, index, axis=1)


def _layer(model, variables, i, v, z, take):
  """Unpatched MLP half over all positions plus the record at the positions `take` selects."""
  spec = model.spec
  params = _block_params(variables, i)
  out, _, _ = blocks.mlp_half(spec, params, v, z, mode='action')
  # The intermediates (h for the stable update) at the recorded position alone.
  _, _, mlp_rec = blocks.mlp_half(spec, params, take(v), take(z), mode='action')
  rec = {'v': take(v)[:, -1], 'z': take(z)[:, -1], 'out': take(out)[:, -1]}
  if 'h' in mlp_rec:
    rec['h'] = mlp_rec['h']
  return out, rec


def record(model, variables, tokens, last, query_len: int):
  """Pass 1 on tokens [B, T]; `last` [B] is each example's query end (later tokens are padding,
  which causality ignores). Returns (per-layer records, baseline logits [B, V])."""
  t = tokens.shape[1]
  positions = jnp.arange(t)
  query_index = last[:, None] - (query_len - 1) + jnp.arange(query_len)
  take = lambda a: _gather(a, last[:, None])
  records = []
  x = embed(model, variables, tokens, positions)
  for i in range(model.spec.depth):
    v = _attend(model, variables, i, x, positions)
    z = _mlp_input(model, variables, i, x, v)
    out, rec = _layer(model, variables, i, v, z, take)
    rec['x'] = _gather(x, query_index)
    records.append(rec)
    x = out
  return records, logits(model, variables, take(x))[:, 0]


def reduced(model, variables, x, positions, *, records=None, patch=None, method='direct',
            mode='action', loop='closed', first_layer=0):
  """Pass 2 from the embedded query x [B, Tq, C] at `positions` [B, Tq].

  With `records` it computes the patch of layers >= first_layer and returns (logits [B, Tq, V],
  {'blocks': patch}, per-layer diagnostics); with `patch` it applies a given one.
  """
  spec = model.spec
  new_patch, diagnostics = {}, []
  for i in range(spec.depth):
    if loop == 'open' and records is not None:
      x = jnp.where(i > first_layer, records[i]['x'].astype(x.dtype), x)
    v = _attend(model, variables, i, x, positions)
    z = _mlp_input(model, variables, i, x, v)
    name = f'block_{i}'
    given = None if patch is None else patch.get('blocks', {}).get(name)
    target = None if records is None else records[i]
    out, layer_patch, mlp_rec = blocks.mlp_half(
        spec, _block_params(variables, i), v, z, mode=mode, patch=given, target=target,
        method=method, active=jnp.asarray(i >= first_layer))
    if records is not None:
      # A static first_layer leaves the unpatched layers out of the patch altogether.
      if not isinstance(first_layer, int) or i >= first_layer:
        new_patch[name] = layer_patch
      acc = jnp.promote_types(out.dtype, jnp.float32)
      error = jnp.max(jnp.abs(out[:, -1].astype(acc) - target['out'].astype(acc)), axis=-1)
      diagnostics.append(dict(mlp_rec, block_error=error, z=z[:, -1], z_c=target['z'],
                              v=v[:, -1], v_c=target['v'], out=out[:, -1],
                              out_c=target['out']))
    x = out
  out_logits = logits(model, variables, x)
  if records is None:
    return out_logits
  return out_logits, {'blocks': new_patch}, diagnostics


# ------------------------------------------------------------------------------------------------
# The context-ready model: its correction FFN is input-controllable too.
# ------------------------------------------------------------------------------------------------


def crt_record(model, variables, context, query):
  """Pass 1 of the context-ready model: the exact position scan over the context, then the
  query's step with those caches and the cached z_{t-1}.

  Returns (records, correction input z_C [B, C'], baseline logits [B, V]).
  """
  spec = model.spec
  b, tc = context.shape
  state = decode.init_decode_state(model, b, tc + 1)
  _, state = decode.position_scan(model, variables, context, state)
  positions = jnp.full((b, 1), tc)
  e = embed(model, variables, query, positions)
  z_corr = _correction_input(model, variables, state.feedback[:, None].astype(e.dtype), e)
  c, _ = blocks.correction_ffn(spec, variables['params']['correction'], z_corr, mode='action')
  x = e + c
  records = []
  for i in range(spec.depth):
    v = _attend(model, variables, i, x, positions, state.caches[i], state.index)
    z = _mlp_input(model, variables, i, x, v)
    out, rec = _layer(model, variables, i, v, z, lambda a: a)
    rec['x'] = x
    records.append(rec)
    x = out
  return records, z_corr[:, -1], logits(model, variables, x)[:, -1]


def crt_reduced(model, variables, query, positions, *, z_corr_c=None, patch=None, **kwargs):
  """Pass 2 of the context-ready model: the query as the first step of a fresh scan (z_{t-1} =
  0, no KV cache) at its absolute position; the correction FFN and the blocks are patched."""
  e = embed(model, variables, query, positions)
  z = _correction_input(model, variables, jnp.zeros_like(e), e)
  given = None if patch is None else patch.get('correction')
  c, corr_patch = blocks.correction_ffn(model.spec, variables['params']['correction'], z,
                                        mode=kwargs.get('mode', 'action'), patch=given,
                                        target_z=z_corr_c)
  result = reduced(model, variables, e + c, positions, patch=patch, **kwargs)
  if z_corr_c is None:
    return result
  out_logits, block_patch, diagnostics = result
  return out_logits, {'correction': corr_patch, **block_patch}, diagnostics
