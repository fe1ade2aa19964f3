"""Exact sequential inference: one jitted `jax.lax.scan` over positions for both model kinds.

The scan carries a `DecodeState` (per-layer KV caches, the cached z_{t-1}, the write index), so a
prompt is prefilled and a continuation generated without a Python loop per token and without
recompiling per step.

    seq = decode.sequential_logits(model, variables, tokens)          # [B, T, V]
    out = decode.generate(model, variables, prompt, 32, jax.random.key(0), temperature=0.8,
                          top_k=40)                                   # [B, T0 + 32]
"""

import functools

import jax
import jax.numpy as jnp

from ctr_jax.models import blocks
from ctr_jax.models import layers
from ctr_jax.models.recurrence import DecodeState

__all__ = ['DecodeState', 'init_decode_state', 'position_scan', 'sequential_logits', 'prefill',
           'sample_logits', 'generate']


def init_decode_state(model, batch_size: int, length: int) -> DecodeState:
  """An empty state that can hold `length` positions."""
  spec = model.spec
  return DecodeState(caches=blocks.init_cache(spec, batch_size, length),
                     feedback=jnp.zeros((batch_size, spec.width), layers.compute_dtype(spec)),
                     index=jnp.zeros((), jnp.int32))


def position_scan(model, variables, tokens: jax.Array, state: DecodeState):
  """Feeds tokens [B, T] one position at a time; returns (logits [B, T, V], final state)."""
  def step(st, token_column):
    logits, st = model.apply(variables, token_column[:, None], decode_state=st)
    return st, logits[:, 0]
  state, logits = jax.lax.scan(step, state, jnp.swapaxes(tokens, 0, 1))
  return jnp.swapaxes(logits, 0, 1), state


@functools.partial(jax.jit, static_argnums=(0,))
def sequential_logits(model, variables, tokens: jax.Array) -> jax.Array:
  """Teacher-forced logits [B, T, V] computed by the exact left-to-right scan."""
  state = init_decode_state(model, tokens.shape[0], tokens.shape[1])
  return position_scan(model, variables, tokens, state)[0]


@functools.partial(jax.jit, static_argnums=(0, 3))
def prefill(model, variables, prompt: jax.Array, length: int):
  """Runs the prompt [B, T0] through a fresh state of `length` slots; returns (logits, state)."""
  state = init_decode_state(model, prompt.shape[0], length)
  return position_scan(model, variables, prompt, state)


def sample_logits(logits: jax.Array, rng, temperature, top_k: int = 0) -> jax.Array:
  """Greedy when temperature == 0, else softmax(logits / temperature) restricted to top_k."""
  greedy = jnp.argmax(logits, axis=-1)
  scaled = logits / jnp.maximum(temperature, 1e-6)
  if top_k:
    kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
  sampled = jax.random.categorical(rng, scaled, axis=-1)
  return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(0, 3, 6))
def _generate(model, variables, prompt, num_tokens, rng, temperature, top_k):
  t0 = prompt.shape[1]
  logits, state = position_scan(model, variables, prompt,
                                init_decode_state(model, prompt.shape[0], t0 + num_tokens))

  def step(carry, step_rng):
    last_logits, st = carry
    token = sample_logits(last_logits, step_rng, temperature, top_k)
    new_logits, st = model.apply(variables, token[:, None], decode_state=st)
    return (new_logits[:, 0], st), token

  rngs = jax.random.split(rng, num_tokens)
  _, tokens = jax.lax.scan(step, (logits[:, -1], state), rngs)
  return jnp.concatenate([prompt, jnp.swapaxes(tokens, 0, 1)], axis=1)


def generate(model, variables, prompt: jax.Array, num_tokens: int, rng, temperature: float = 0.0,
             top_k: int = 0) -> jax.Array:
  """Prefills `prompt` [B, T0] and samples `num_tokens` more; returns [B, T0 + num_tokens]."""
  if num_tokens < 1:
    raise ValueError(f'num_tokens must be >= 1, got {num_tokens}')
  if temperature < 0:
    raise ValueError(f'temperature must be >= 0, got {temperature}')
  return _generate(model, variables, jnp.asarray(prompt, jnp.int32), int(num_tokens), rng,
                   jnp.float32(temperature), int(top_k))
