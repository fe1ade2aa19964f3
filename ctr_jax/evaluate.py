"""Validation loss / perplexity in parallel-K and exact sequential mode, and text samples."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import decode, losses


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _batch_loss_sum(model, params, batch, k_unroll, sequential):
  inputs, targets = batch[:, :-1], batch[:, 1:]
  variables = {'params': params}
  if sequential:
    logits = decode.sequential_logits(model, variables, inputs)
  else:
    logits = model.apply(variables, inputs, k_unroll=k_unroll)
  mean, count = losses.next_token_loss(logits, targets)
  return mean * count, count


def evaluate_lm(model, params, batches, *, k_unroll=None, sequential=False, to_global=None):
  """Mean next-token loss and perplexity over `batches` (np int32 [B, T+1] each)."""
  total, count = 0.0, 0
  for batch in batches:
    batch = to_global(batch) if to_global else jnp.asarray(batch)
    s, n = _batch_loss_sum(model, params, batch, k_unroll, sequential)
    total += float(s)
    count += int(n)
  loss = total / max(count, 1)
  return {'loss': loss, 'ppl': math.exp(min(loss, 50.0)), 'tokens': count}


def sample_text(model, params, tokenizer, prompt: str, num_tokens: int, rng, *,
                temperature: float = 0.8, top_k: int = 40) -> str:
  """Continues `prompt` with the exact sequential decoder and returns the decoded text."""
  ids = tokenizer.encode(prompt) or [tokenizer.eot_id]
  prompt_ids = jnp.asarray(np.array(ids, np.int32)[None])
  out = decode.generate(model, {'params': params}, prompt_ids, num_tokens, rng,
                        temperature=temperature, top_k=top_k)
  return tokenizer.decode([int(t) for t in np.asarray(out[0])])
