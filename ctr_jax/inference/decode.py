"""Exact sequential inference: one jitted `jax.lax.scan` over positions for both model kinds.

The scan carries a `DecodeState` (per-layer KV caches, the cached z_{t-1}, the write index), so a
prompt is prefilled and a continuation generated without a Python loop per token and without
recompiling per step. The jitted entry points first fuse each attention layer's query, key and
value weights into one matrix (`attention.fuse_qkv`): fewer, larger matrix-vector products per
step; `position_scan` uses whatever variables it is given.

    seq = decode.sequential_logits(model, variables, tokens)          # [B, T, V]
    out = decode.generate(model, variables, prompt, 32, jax.random.key(0), temperature=0.8,
                          top_k=40)                                   # [B, T0 + 32]
    logits, state, passes = decode.chunked_prefill(model, variables, prompt, length, chunk=32)

`chunked_prefill` fills the same state chunk by chunk, each chunk by the correction's fixed point
over its positions (matrix-matrix passes) on the caches of the earlier chunks
(docs/benchmarks.md, "Chunked prefill").

The public entry points check their arguments on the host before anything is traced (a bad one
is a ValueError naming it): token arrays are [B, T] integers with every id in
[0, model.vocab_size) (an id outside it, or a position past a learned position table, makes NaN
logits), and no call holds more than `model.max_len` positions (the decode-state length the model
is built for), which also bounds the KV caches a call allocates. A traced token array (a caller's
own `jit`) gets the shape checks only: its values are not known before it runs.
"""

import functools
import math
import numbers
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.models import attention, blocks, layers
from ctr_jax.ops.recurrence import DecodeState

__all__ = ['DecodeState', 'init_decode_state', 'position_scan', 'sequential_logits', 'prefill',
           'parallel_prefill', 'chunked_prefill', 'sample_logits', 'continue_generation',
           'generate']


def init_decode_state(model, batch_size: int, length: int) -> DecodeState:
  """An empty state that can hold `length` positions."""
  spec = model.spec
  return DecodeState(caches=blocks.init_cache(spec, batch_size, length),
                     feedback=jnp.zeros((batch_size, spec.width), layers.compute_dtype(spec)),
                     index=jnp.zeros((), jnp.int32))


def first_token_outside(tokens: np.ndarray, vocab_size: int) -> tuple[int, tuple] | None:
  """(id, index) of the first token id of the host array `tokens` outside [0, vocab_size), or
  None. Two numpy reductions when every id is valid (microseconds for a batch of windows)."""
  if tokens.size == 0 or (tokens.min() >= 0 and tokens.max() < vocab_size):
    return None
  index = tuple(int(i) for i in np.argwhere((tokens < 0) | (tokens >= vocab_size))[0])
  return int(tokens[index]), index


def _checked_tokens(model, tokens, name: str) -> jax.Array:
  """`tokens` as an int32 [B, T] array; a ValueError naming `name` when it is not 2-D, has no
  positions, is not integer or (when its values are known) holds an id outside the vocabulary."""
  shape = tuple(np.shape(tokens))
  if len(shape) != 2 or 0 in shape:
    raise ValueError(f'{name}: got shape {shape}, allowed [batch, positions] with both >= 1')
  traced = isinstance(tokens, jax.core.Tracer)
  host = None if traced else np.asarray(tokens)
  dtype = tokens.dtype if traced else host.dtype
  if not np.issubdtype(dtype, np.integer):
    raise ValueError(f'{name}: got dtype {dtype}, allowed integer token ids')
  vocab_size = model.spec.vocab_size
  bad = None if traced else first_token_outside(host, vocab_size)
  if bad is not None:
    raise ValueError(f'{name}: got token id {bad[0]} at {list(bad[1])}, allowed ids in '
                     f'[0, model.vocab_size={vocab_size})')
  return jnp.asarray(tokens, jnp.int32)


def _check_positions(model, positions: int, name: str, what: str) -> None:
  max_len = model.spec.max_len
  if positions > max_len:
    table = ', the rows of its learned position table' if model.spec.positions == 'learned' else ''
    raise ValueError(f'{name}: {what} {positions} positions, allowed at most model.max_len='
                     f'{max_len} (the longest sequence the model is built for{table})')


def _check_length(model, prompt_len: int, length) -> int:
  """`length`, the state's slots for a `prompt_len`-token prompt, as an int (ValueError naming
  it when it is not an int in [prompt_len, model.max_len])."""
  if isinstance(length, bool) or not isinstance(length, numbers.Integral):
    raise ValueError(f'length: got {length!r}, allowed an int')
  if length < prompt_len:
    raise ValueError(f'length: got {length} for a {prompt_len}-token prompt, allowed '
                     f'>= {prompt_len}')
  _check_positions(model, int(length), 'length', 'got')
  return int(length)


def _check_sampling(model, temperature, top_k) -> None:
  if not (math.isfinite(float(temperature)) and temperature >= 0):
    raise ValueError(f'temperature: got {temperature!r}, allowed a finite number >= 0 '
                     '(0 = greedy)')
  vocab_size = model.spec.vocab_size
  if (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
      or not 0 <= top_k <= vocab_size):
    raise ValueError(f'top_k: got {top_k!r}, allowed an int in [0, model.vocab_size='
                     f'{vocab_size}] (0 = no cut)')


def _check_num_tokens(model, num_tokens, prompt_len: int) -> int:
  if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral) \
      or num_tokens < 1:
    raise ValueError(f'num_tokens: got {num_tokens!r}, allowed an int >= 1')
  _check_positions(model, prompt_len + int(num_tokens), 'num_tokens',
                   f'{num_tokens} after a {prompt_len}-token prompt make')
  return int(num_tokens)


def position_scan(model, variables, tokens: jax.Array, state: DecodeState):
  """Feeds tokens [B, T] one position at a time; returns (logits [B, T, V], final state)."""
  def step(st, token_column):
    logits, st = model.apply(variables, token_column[:, None], decode_state=st)
    return st, logits[:, 0]
  state, logits = jax.lax.scan(step, state, jnp.swapaxes(tokens, 0, 1))
  return jnp.swapaxes(logits, 0, 1), state


@functools.partial(jax.jit, static_argnums=(0,))
def _sequential_logits(model, variables, tokens):
  state = init_decode_state(model, tokens.shape[0], tokens.shape[1])
  return position_scan(model, attention.fuse_qkv(variables), tokens, state)[0]


def sequential_logits(model, variables, tokens: jax.Array) -> jax.Array:
  """Teacher-forced logits [B, T, V] computed by the exact left-to-right scan."""
  tokens = _checked_tokens(model, tokens, 'tokens')
  _check_positions(model, tokens.shape[1], 'tokens', 'got')
  return _sequential_logits(model, variables, tokens)


def _prefill(model, fused_variables, prompt, length):
  state = init_decode_state(model, prompt.shape[0], length)
  if model.spec.is_context_ready:
    return position_scan(model, fused_variables, prompt, state)
  # A transformer's cache entries do not depend on later positions: one parallel pass fills them.
  return model.apply(fused_variables, prompt, decode_state=state)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _prefill_jit(model, variables, prompt, length):
  return _prefill(model, attention.fuse_qkv(variables), prompt, length)


def prefill(model, variables, prompt: jax.Array, length: int):
  """Runs the prompt [B, T0] through a fresh state of `length` slots (T0 <= length <=
  model.max_len); returns (logits, state).

  Exact for both kinds: a context-ready model by the position scan, a transformer in one pass.
  """
  prompt = _checked_tokens(model, prompt, 'prompt')
  return _prefill_jit(model, variables, prompt, _check_length(model, prompt.shape[1], length))


def parallel_prefill(model, variables, prompt: jax.Array, length: int, tolerance=1e-4,
                     max_iterations: int = 0):
  """`prefill` by fixed-point iteration over all prompt positions at once.

  Context-ready models iterate u = e + c, z = Block(u), c <- CorrFFN(LN(shift(z) + e)) (the
  model's `iterate`, the pass its parallel forward repeats K times) until
  max |c_new - c| <= tolerance (or `max_iterations`, default T0 + 1, after which the result is
  exact by causality: position t is exact after t + 2 passes). Every pass writes the KV caches,
  so the state after the last pass continues decoding like `prefill`'s. A transformer needs one
  pass. Returns (logits [B, T0, V], state, block passes used).
  """
  prompt = _checked_tokens(model, prompt, 'prompt')
  length = _check_length(model, prompt.shape[1], length)
  return _parallel_prefill(model, variables, prompt, length, tolerance, max_iterations)


@functools.partial(jax.jit, static_argnums=(0, 3, 5))
def _parallel_prefill(model, variables, prompt, length, tolerance, max_iterations):
  t0 = prompt.shape[1]
  state = init_decode_state(model, prompt.shape[0], length)
  variables = attention.fuse_qkv(variables)
  if not model.spec.is_context_ready:
    logits, state = _prefill(model, variables, prompt, length)
    return logits, state, jnp.ones((), jnp.int32)
  if model.spec.cumulative:
    raise ValueError('model.cumulative=True has no exact sequential form; it cannot be prefilled')
  max_iterations = max_iterations or t0 + 1
  positions = jnp.arange(t0)
  apply = functools.partial(model.apply, variables)
  e = apply(prompt, True, positions, method='embed_tokens')

  def one_pass(carry):
    c, _, _, _, iterations, _ = carry
    # Every pass writes all T0 positions of the fresh caches, so the last pass's caches are
    # those of its (final) block inputs.
    c_next, u, z, caches = apply(c, e, positions, caches=state.caches, method='iterate')
    change = jnp.max(jnp.abs((c_next - c).astype(jnp.float32)))
    return c_next, u, z, caches, iterations + 1, change

  def not_converged(carry):
    *_, iterations, change = carry
    return (iterations < max_iterations) & (change > tolerance)

  zeros = jnp.zeros_like(e)
  carry = one_pass((zeros, e, zeros, state.caches, jnp.zeros((), jnp.int32), jnp.float32(0)))
  _, u, z, caches, iterations, _ = jax.lax.while_loop(not_converged, one_pass, carry)
  logits = apply(z, method='logits')
  feedback = apply(z[:, -1:], u[:, -1:], method='feedback')[:, 0]
  state = state.replace(caches=caches, feedback=feedback.astype(state.feedback.dtype),
                        index=jnp.asarray(t0, jnp.int32))
  return logits, state, iterations


# ------------------------------------------------------------------------------------------------
# Chunked prefill: the fixed point over c positions at a time, on the caches of earlier chunks.
# ------------------------------------------------------------------------------------------------


def _solve_chunk(model, fused_variables, state, tokens, max_passes, tolerance):
  """Fills positions state.index .. + n of `state` with the prompt chunk `tokens` [B, n].

  A context-ready model iterates the correction over the chunk, its queries reading the cached
  earlier chunks (`iterate` from slot state.index), until max |c_new - c| <= tolerance or
  `max_passes`. Position 0 of the chunk reads the previous chunk's converged z, so its c is
  exact from the start and position i is exact after i + 1 passes: n passes make the chunk
  exact. Each pass overwrites the chunk's cache slots, so those of the last pass remain.
  Returns (z or, for a transformer, logits [B, n, .], state, passes used).
  """
  apply = functools.partial(model.apply, fused_variables)
  if not model.spec.is_context_ready:
    logits, state = apply(tokens, decode_state=state)
    return logits, state, jnp.ones((), jnp.int32)
  start = state.index
  positions = start + jnp.arange(tokens.shape[1])
  e = apply(tokens, True, positions, method='embed_tokens')
  feedback = state.feedback.astype(e.dtype)
  first = apply(feedback[:, None], e[:, :1], method='correct')
  # Positions after the first start from c = 0, the start the K-unroll is trained from.
  c0 = jnp.zeros_like(e).at[:, :1].set(first.astype(e.dtype))

  def one_pass(carry):
    c, _, _, caches, passes, _ = carry
    c_next, u, z, caches = apply(c, e, positions, caches=caches, cache_index=start,
                                 first_feedback=feedback, method='iterate')
    change = jnp.max(jnp.abs((c_next - c).astype(jnp.float32)))
    return c_next, u, z, caches, passes + 1, change

  def not_converged(carry):
    *_, passes, change = carry
    return (passes < max_passes) & (change > tolerance)

  carry = one_pass((c0, e, e, state.caches, jnp.zeros((), jnp.int32), jnp.float32(0)))
  _, u, z, caches, passes, _ = jax.lax.while_loop(not_converged, one_pass, carry)
  last = apply(z[:, -1:], u[:, -1:], method='feedback')[:, 0]
  state = state.replace(caches=caches, feedback=last.astype(state.feedback.dtype),
                        index=start + tokens.shape[1])
  return z, state, passes


def _chunked_fill(model, fused_variables, prompt, state, chunk, passes, tolerance):
  """`_solve_chunk` over the prompt [B, T0], `chunk` positions at a time (a shorter last one):
  one `scan` over the full chunks, then the rest. Returns (outputs [B, T0, .], state, passes
  used per chunk)."""
  b, t0 = prompt.shape
  full, rest = divmod(t0, chunk)
  solve = lambda st, tokens: _solve_chunk(model, fused_variables, st, tokens,
                                          min(passes, tokens.shape[1]), tolerance)
  outs, used = [], []
  if full:
    def step(st, tokens):
      out, st, n = solve(st, tokens)
      return st, (out, n)
    chunks = jnp.swapaxes(prompt[:, :full * chunk].reshape(b, full, chunk), 0, 1)
    state, (out, n) = jax.lax.scan(step, state, chunks)
    outs.append(jnp.swapaxes(out, 0, 1).reshape(b, full * chunk, out.shape[-1]))
    used.append(n)
  if rest:
    out, state, n = solve(state, prompt[:, full * chunk:])
    outs.append(out)
    used.append(n[None])
  return jnp.concatenate(outs, axis=1), state, jnp.concatenate(used)


def _head(model, fused_variables, outputs):
  if not model.spec.is_context_ready:
    return outputs  # already logits
  return model.apply(fused_variables, outputs, method='logits')


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def _chunked_prefill(model, variables, prompt, length, chunk, passes, tolerance):
  variables = attention.fuse_qkv(variables)
  state = init_decode_state(model, prompt.shape[0], length)
  out, state, used = _chunked_fill(model, variables, prompt, state, chunk, passes, tolerance)
  return _head(model, variables, out), state, used


def _check_chunked(model, chunk, passes, tolerance, prefix=''):
  """Raises ValueError naming the bad argument; returns (chunk, passes) as ints."""
  if model.spec.is_context_ready and model.spec.cumulative:
    raise ValueError('model.cumulative=True has no exact sequential form; it cannot be prefilled')
  if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
    raise ValueError(f'{prefix}chunk: got {chunk!r}, allowed an int >= 1')
  if passes is not None and (isinstance(passes, bool) or not isinstance(passes, numbers.Integral)
                             or passes < 1):
    raise ValueError(f'{prefix}passes: got {passes!r}, allowed None (= chunk, exact) or an '
                     'int >= 1')
  if not tolerance >= 0:
    raise ValueError(f'{prefix}tolerance: got {tolerance!r}, allowed a number >= 0')
  return int(chunk), int(passes or chunk)


def chunked_prefill(model, variables, prompt: jax.Array, length: int, *, chunk: int,
                    passes: int | None = None, tolerance: float = 0.0):
  """`prefill`, `chunk` positions at a time, each chunk by the fixed point over its positions.

  Within a chunk the correction is iterated (the model's `iterate`, one matrix-matrix pass over
  the chunk's positions) with its queries reading the KV caches of the earlier chunks; the
  chunk's first position reads the previous chunk's converged z. It stops after `passes`
  passes (default `chunk`: position i of a chunk depends on the chunk only through i-1, so
  `chunk` passes are exact, and more are never run) or once max |c_new - c| <= `tolerance`
  (0: only when nothing changes). The last chunk may be shorter. A transformer's chunk takes
  one pass. Returns (logits [B, T0, V], the state, block passes used per chunk [chunks]).
  """
  chunk, passes = _check_chunked(model, chunk, passes, tolerance)
  prompt = _checked_tokens(model, prompt, 'prompt')
  length = _check_length(model, prompt.shape[1], length)
  return _chunked_prefill(model, variables, prompt, length, min(chunk, prompt.shape[1]),
                          passes, jnp.float32(tolerance))

def sample_logits(logits: jax.Array, rng, temperature, top_k: int = 0) -> jax.Array:
  """Greedy when temperature == 0, else softmax(logits / temperature) restricted to top_k.

  A `cond`, not a select of both: drawing the Gumbel noise over V logits costs more than a
  whole small decode step on a CPU, and greedy decoding never needs it.
  """
  def sample():
    scaled = logits / jnp.maximum(temperature, 1e-6)
    if top_k:
      kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
      scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    return jax.random.categorical(rng, scaled, axis=-1).astype(jnp.int32)

  greedy = lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32)
  return jax.lax.cond(jnp.asarray(temperature) > 0, sample, greedy)


def _sample_loop(model, fused_variables, last_logits, state, num_tokens, rng, temperature, top_k):
  def step(carry, step_rng):
    logits, st = carry
    token = sample_logits(logits, step_rng, temperature, top_k)
    new_logits, st = model.apply(fused_variables, token[:, None], decode_state=st)
    return (new_logits[:, 0], st), token

  rngs = jax.random.split(rng, num_tokens)
  (_, state), tokens = jax.lax.scan(step, (last_logits, state), rngs)
  return jnp.swapaxes(tokens, 0, 1), state


_fuse = jax.jit(attention.fuse_qkv)
# The last variables `generate` / `continue_generation` fused: (weak refs to their parameter
# leaves, the fused collection). One entry, so at most one extra copy of the q/k/v weights lives.
_last_fused: list = []


def with_fused_qkv(variables):
  """`variables` with the fused q/k/v collection, fused once per set of parameters.

  Fusing concatenates every layer's q/k/v weights, a copy of a third of the attention weights
  that a whole `generate` call would otherwise pay on each call. The result is reused while the
  caller passes the same (immutable) jax arrays; new arrays, numpy arrays or tracers are fused
  afresh (numpy arrays may change in place, so they are never cached).
  """
  if attention.FUSED in variables:
    return variables
  leaves = jax.tree.leaves(variables['params'])
  if not all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves):
    return attention.fuse_qkv(variables)
  if _last_fused:
    refs, fused = _last_fused[0]
    if len(refs) == len(leaves) and all(r() is x for r, x in zip(refs, leaves)):
      return {**variables, attention.FUSED: fused}
  fused = _fuse({'params': variables['params']})[attention.FUSED]
  # Under a caller's jit (concrete parameters closed over) the result is a tracer of that trace:
  # cached, it would leak into the next call.
  if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(fused)):
    _last_fused[:] = [([weakref.ref(x) for x in leaves], fused)]
  return {**variables, attention.FUSED: fused}


@functools.partial(jax.jit, static_argnums=(0, 4, 7))
def _continue(model, variables, last_logits, state, num_tokens, rng, temperature, top_k):
  return _sample_loop(model, attention.fuse_qkv(variables), last_logits, state, num_tokens, rng,
                      temperature, top_k)


def continue_generation(model, variables, last_logits: jax.Array, state: DecodeState,
                        num_tokens: int, rng, temperature: float = 0.0, top_k: int = 0):
  """Samples `num_tokens` tokens after a prefilled `state` whose last logits [B, V] are given
  (e.g. `logits[:, -1]` of `prefill`); returns (tokens [B, num_tokens], state). Timing this alone
  measures decode steps without the prefill."""
  if isinstance(num_tokens, bool) or not isinstance(num_tokens, numbers.Integral) \
      or num_tokens < 1:
    raise ValueError(f'num_tokens: got {num_tokens!r}, allowed an int >= 1')
  _check_sampling(model, temperature, top_k)
  slots = state.caches[0]['v'].shape[1]  # [B*G, S, Dh]
  if int(state.index) + num_tokens > slots:
    raise ValueError(f'the state holds {slots} positions and {int(state.index)} are used; '
                     f'{num_tokens} more do not fit (prefill with a larger length)')
  return _continue(model, with_fused_qkv(variables), last_logits, state, int(num_tokens), rng,
                   jnp.float32(temperature), int(top_k))


PREFILLS = ('scan', 'parallel', 'chunked')


@functools.partial(jax.jit, static_argnums=(0, 3, 6, 7, 8, 9))
def _generate(model, variables, prompt, num_tokens, rng, temperature, top_k, prefill_kind='scan',
              chunk=0, passes=0, tolerance=0.0):
  variables = attention.fuse_qkv(variables)
  length = prompt.shape[1] + num_tokens
  if prefill_kind == 'chunked':
    state = init_decode_state(model, prompt.shape[0], length)
    out, state, _ = _chunked_fill(model, variables, prompt, state, chunk, passes, tolerance)
    last_logits = _head(model, variables, out[:, -1:])[:, 0]  # the head only where it is read
  elif prefill_kind == 'parallel':
    logits, state, _ = _parallel_prefill(model, variables, prompt, length, tolerance, 0)
    last_logits = logits[:, -1]
  else:
    logits, state = _prefill(model, variables, prompt, length)
    last_logits = logits[:, -1]
  tokens, _ = _sample_loop(model, variables, last_logits, state, num_tokens, rng, temperature,
                           top_k)
  return jnp.concatenate([prompt, tokens], axis=1)


def generate(model, variables, prompt: jax.Array, num_tokens: int, rng, temperature: float = 0.0,
             top_k: int = 0, *, prefill: str = 'scan', prefill_chunk: int = 0,
             prefill_passes: int | None = None, prefill_tolerance: float = 0.0) -> jax.Array:
  """Prefills `prompt` [B, T0] and samples `num_tokens` more; returns [B, T0 + num_tokens].

  `prefill` chooses how the prompt fills the state, all exact at the defaults: 'scan' (the
  position scan, `prefill`), 'parallel' (`parallel_prefill` to `prefill_tolerance`) or
  'chunked' (`chunked_prefill` with chunk = `prefill_chunk`, `prefill_passes` and
  `prefill_tolerance`). The prompt and the `num_tokens` new tokens together hold at most
  `model.max_len` positions.
  """
  prompt = _checked_tokens(model, prompt, 'prompt')
  num_tokens = _check_num_tokens(model, num_tokens, prompt.shape[1])
  _check_sampling(model, temperature, top_k)
  if prefill not in PREFILLS:
    raise ValueError(f'prefill: got {prefill!r}, allowed {list(PREFILLS)}')
  chunk, passes = 0, 0
  if prefill == 'chunked':
    chunk, passes = _check_chunked(model, prefill_chunk, prefill_passes, prefill_tolerance,
                                   'prefill_')
    chunk = min(chunk, prompt.shape[1])
  else:
    if prefill_chunk or prefill_passes is not None:
      raise ValueError(f'prefill_chunk and prefill_passes: only for prefill=\'chunked\', got '
                       f'prefill={prefill!r}')
    if not prefill_tolerance >= 0:
      raise ValueError(f'prefill_tolerance: got {prefill_tolerance!r}, allowed a number >= 0')
  return _generate(model, with_fused_qkv(variables), prompt, num_tokens, rng,
                   jnp.float32(temperature), int(top_k), prefill, chunk, passes,
                   jnp.float32(prefill_tolerance))
