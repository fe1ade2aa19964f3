"""Scoring logits: the next-token cross-entropy, and the language-modelling objective.

An objective tells the training step what the model reads and how its output is scored; the step
(`ctr_jax.training.train_step`) runs the forward its recipe chooses between the two:

    objective = losses.NextToken(convergence_weight=0.1)
    logits, aux = train_step.forward(model, params, objective.inputs(batch), recipe)
    loss, metrics = objective.loss(logits, aux, batch)

Every task is such an objective (`inputs` and `loss`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax


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


@dataclasses.dataclass(frozen=True)
class NextToken:
  """Next-token prediction on windows int32 [B, T+1]: cross-entropy plus, for a context-ready
  model's K-unroll, lambda times its convergence term MSE(e + c^(K), stopgrad(e + c^(K-1))).

  A transformer's forward reports a zero convergence term and BPTT none, so lambda changes
  nothing for them.
  """
  convergence_weight: float = 0.1

  def inputs(self, batch: jax.Array) -> jax.Array:
    return batch[:, :-1]

  def loss(self, logits: jax.Array, aux: dict, batch: jax.Array) -> tuple[jax.Array, dict]:
    """(total loss, metrics dict with 'loss', 'ce_loss' and any 'convergence_loss')."""
    ce, _ = next_token_loss(logits, batch[:, 1:])
    total = ce
    metrics = {'ce_loss': ce}
    if 'convergence_loss' in aux:
      if self.convergence_weight > 0:
        total = ce + self.convergence_weight * aux['convergence_loss']
      metrics['convergence_loss'] = aux['convergence_loss']
    return total, {'loss': total, **metrics}
