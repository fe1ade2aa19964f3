"""Backpropagation through time: gradients of the exact sequential forward.

The exact model is the position scan of `ctr_jax.inference.decode` (one token at a time, KV caches and the
fed-back z_{t-1} in a `DecodeState`). Its depth grows with the sequence, which is what the
pointer-chasing task (reference section 7) trains with instead of the K-step parallel unroll.

Plain autodiff of that scan (`plain_autodiff_logits`) stores the scan carry, the whole KV cache,
at every position: O(T^2) memory. `bptt_logits` computes the same logits and the same gradients
in O(T) memory with a `jax.custom_vjp`, relying on two facts about one step at position t:
  * it reads cache slots 0..t-1 and writes slot t; slots after t are masked out by causality, and
    a slot never changes once written, so every slot it reads holds in the FINAL cache exactly
    what it held at step t;
  * its own write replaces whatever slot t held before, so feeding it the final cache (where slot
    t already holds that same write) leaves its outputs, and their derivatives, unchanged.
The forward pass therefore keeps only the final caches and the feedback vectors z_{t-1}. The
backward pass walks the positions in reverse, recomputes each step against the final caches and
pulls back through it, carrying the cotangents of the caches and of the feedback vector and
summing the parameter cotangents.

Works for any depth and for both model kinds (a transformer's step ignores the feedback vector).
Dropout is not supported: steps run deterministically.

Its step time and memory against plain autodiff are in docs/benchmarks.md ("BPTT").

    logits = bptt.bptt_logits(model, params, tokens)       # [B, T, V], differentiable in params
    grads = jax.grad(lambda p: loss(bptt.bptt_logits(model, p, tokens)))(params)
"""

import functools

import jax
import jax.numpy as jnp

from ctr_jax.inference import decode
from ctr_jax.ops.recurrence import DecodeState

__all__ = ['bptt_logits', 'plain_autodiff_logits']


def _step(model, params, token_column, state: DecodeState):
  """One exact position step: token_column [B] -> (logits [B, V], new state)."""
  logits, new_state = model.apply({'params': params}, token_column[:, None], decode_state=state)
  return logits[:, 0], new_state


def plain_autodiff_logits(model, params, tokens: jax.Array) -> jax.Array:
  """The sequential logits [B, T, V], differentiated by ordinary autodiff (O(T^2) memory)."""
  state = decode.init_decode_state(model, tokens.shape[0], tokens.shape[1])
  return decode.position_scan(model, {'params': params}, tokens, state)[0]


def _forward(model, params, tokens):
  """Runs the scan; returns logits [B, T, V], the final caches and z_{t-1} per step [T, B, C]."""
  state = decode.init_decode_state(model, tokens.shape[0], tokens.shape[1])

  def body(st, token_column):
    logits, new_st = _step(model, params, token_column, st)
    return new_st, (logits, st.feedback)

  final, (logits, feedbacks) = jax.lax.scan(body, state, jnp.swapaxes(tokens, 0, 1))
  return jnp.swapaxes(logits, 0, 1), final.caches, feedbacks


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def bptt_logits(model, params, tokens: jax.Array) -> jax.Array:
  """The sequential logits [B, T, V] of tokens [B, T]; gradients by O(T)-memory BPTT.

  Equal (to fp rounding) to `decode.sequential_logits(model, {'params': params}, tokens)`, and so
  to the parallel forward with k_unroll >= T + 1; differentiable w.r.t. `params` (not `tokens`).
  """
  return _forward(model, params, tokens)[0]


def _bptt_fwd(model, params, tokens):
  logits, caches, feedbacks = _forward(model, params, tokens)
  return logits, (params, tokens, caches, feedbacks)


def _bptt_bwd(model, residuals, logits_ct):
  params, tokens, caches, feedbacks = residuals

  def body(carry, xs):
    params_ct, caches_ct, feedback_ct = carry
    index, token_column, feedback, step_logits_ct = xs

    def step_outputs(p, c, z):
      # The final caches stand in for the caches step `index` saw (module docstring).
      logits, new_state = _step(model, p, token_column,
                                DecodeState(caches=c, feedback=z, index=index))
      return logits, (new_state.caches, new_state.feedback)

    _, pullback = jax.vjp(step_outputs, params, caches, feedback)
    # caches_ct holds what later steps sent back to the slots; the pullback routes slot `index`'s
    # share into this step's write and keeps the rest for earlier steps.
    step_params_ct, caches_ct, feedback_ct = pullback((step_logits_ct, (caches_ct, feedback_ct)))
    params_ct = jax.tree.map(jnp.add, params_ct, step_params_ct)
    return (params_ct, caches_ct, feedback_ct), None

  init = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, caches),
          jnp.zeros_like(feedbacks[0]))
  xs = (jnp.arange(tokens.shape[1], dtype=jnp.int32), jnp.swapaxes(tokens, 0, 1), feedbacks,
        jnp.swapaxes(logits_ct, 0, 1))
  (params_ct, _, _), _ = jax.lax.scan(body, init, xs, reverse=True)
  return params_ct, None


bptt_logits.defvjp(_bptt_fwd, _bptt_bwd)
