"""Language-modelling losses shared by the trainer, the evaluator and the tests."""

import jax
import jax.numpy as jnp
import optax

from ctr_jax import train_step


def next_token_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array | None = None):
  """Mean cross-entropy of logits [B, T, V] against targets [B, T]; targets < 0 are ignored.

  Returns (mean loss, number of counted tokens).
  """
  valid = targets >= 0
  if mask is not None:
    valid &= mask.astype(bool)
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.where(valid, targets, 0))
  count = jnp.sum(valid)
  return jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(count, 1), count


def model_loss(model, params, batch, *, k_unroll=None, rng=None, deterministic=True,
               recipe: train_step.Recipe = train_step.Recipe()):
  """Cross-entropy plus the context-ready convergence term; batch: int32 [B, T+1] windows.

  The forward is the recipe's (`train_step.forward`): the K-unroll, or BPTT through the exact
  scan (which has no convergence term). Returns (total loss, metrics dict).
  """
  inputs, targets = batch[:, :-1], batch[:, 1:]
  logits, aux = train_step.forward(model, params, inputs, recipe, k_unroll=k_unroll, rng=rng,
                                   deterministic=deterministic)
  ce, _ = next_token_loss(logits, targets)
  total = ce
  metrics = {'ce_loss': ce}
  if 'convergence_loss' in aux:
    if model.spec.is_context_ready and recipe.convergence_weight > 0:
      total = ce + recipe.convergence_weight * aux['convergence_loss']
    metrics['convergence_loss'] = aux['convergence_loss']
  return total, {'loss': total, **metrics}
