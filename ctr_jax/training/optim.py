"""Optimizer: AdamW with linear warmup and cosine decay, gradient clipping."""

import jax
import optax


def learning_rate_schedule(optim_config, total_steps: int):
  peak = optim_config.lr
  warmup = min(optim_config.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if warmup else peak, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1), end_value=peak * optim_config.min_lr_ratio)


def make_optimizer(optim_config, total_steps: int) -> optax.GradientTransformation:
  schedule = learning_rate_schedule(optim_config, total_steps)
  parts = []
  if optim_config.grad_clip > 0:
    parts.append(optax.clip_by_global_norm(optim_config.grad_clip))
  parts.append(optax.adamw(schedule, b1=optim_config.b1, b2=optim_config.b2,
                           eps=optim_config.eps, weight_decay=optim_config.weight_decay,
                           mask=_decay_mask))
  return optax.chain(*parts)


def _decay_mask(params):
  """Weight decay on matrices only (not on biases, norm scales)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)
