"""Truncated gradients (config.train.grad_iterations): same forward, gradient of the last m."""

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from ctr_jax import models
from ctr_jax.tasks import losses
from ctr_jax.training import train_step
from helpers import max_abs_diff, random_model, random_tokens


def _grads(model, params, batch, recipe, k):
  return jax.grad(lambda p: train_step.objective_loss(model, p, batch, losses.NextToken(), recipe, k_unroll=k)[0])(
      params)


@pytest.mark.parametrize('seed', [0, pytest.param(1, marks=pytest.mark.slow)])
def test_forward_is_unchanged_and_m_equal_k_is_full_backpropagation(seed):
  cfg, model, variables, _ = random_model(seed, depth=2)
  batch = random_tokens(seed + 10, cfg.vocab_size, batch=2, length=9)
  params, k = variables['params'], 4
  full = train_step.objective_loss(model, params, batch, losses.NextToken(), k_unroll=k)
  for m in (1, 2, 3):
    recipe = train_step.Recipe(grad_iterations=m)
    truncated = train_step.objective_loss(model, params, batch, losses.NextToken(), recipe, k_unroll=k)
    assert float(truncated[0]) == pytest.approx(float(full[0]), rel=1e-6, abs=1e-6)
    assert float(truncated[1]['convergence_loss']) == pytest.approx(
        float(full[1]['convergence_loss']), rel=1e-5, abs=1e-7)
  g_full = _grads(model, params, batch, train_step.Recipe(), k)
  g_all = _grads(model, params, batch, train_step.Recipe(grad_iterations=k), k)
  assert max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(g_full),
                                                jax.tree.leaves(g_all))) == 0
  g_one = _grads(model, params, batch, train_step.Recipe(grad_iterations=1), k)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(g_one))
  assert max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(g_full),
                                                jax.tree.leaves(g_one))) > 1e-6


def test_m_equal_one_is_the_gradient_of_the_last_iteration_alone():
  # Written out with the model's stages: the first K - 1 passes are constants, the last one and
  # the convergence term are differentiated (embeddings included).
  cfg, model, variables, _ = random_model(3, depth=1)
  batch = random_tokens(4, cfg.vocab_size, batch=2, length=7)
  params, k, lam = variables['params'], 3, train_step.Recipe().convergence_weight
  inputs, targets = batch[:, :-1], batch[:, 1:]
  positions = jnp.arange(inputs.shape[1])

  def manual(p):
    run = lambda *a, **kw: model.apply({'params': p}, *a, **kw)
    e = run(inputs, True, method='embed_tokens')
    c = jnp.zeros_like(e)
    for _ in range(k - 1):
      c = jax.lax.stop_gradient(run(c, e, positions, method='iterate')[0])
    c_next, u, z, _ = run(c, e, positions, method='iterate')
    ce, _ = losses.next_token_loss(run(z, method='logits'), targets)
    diff = e + c_next - jax.lax.stop_gradient(u)
    return ce + lam * jnp.mean(jnp.square(diff))

  want = jax.grad(manual)(params)
  got = _grads(model, params, batch, train_step.Recipe(grad_iterations=1), k)
  assert max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got))) \
      < 1e-6


def test_truncation_is_validated_at_config_time():
  crt = models.model_config(kind='context_ready', k_unroll=4)
  make = lambda **f: ml_collections.ConfigDict({**train_step.Recipe().__dict__, **f})
  train_step.validate(make(grad_iterations=2), crt)
  with pytest.raises(ValueError, match='config.train.grad_iterations'):
    train_step.validate(make(grad_iterations=5), crt)
  with pytest.raises(ValueError, match='config.train.grad_iterations'):
    train_step.validate(make(grad_iterations=1), models.model_config(kind='transformer'))
  with pytest.raises(ValueError, match='config.train.grad_iterations'):
    train_step.validate(make(grad_iterations=1, mode='bptt'), crt)


def test_frozen_iterations_store_nothing_for_the_backward_pass():
  # Compiled temporaries of the gradient shrink with m (the activations of K - m iterations
  # are not kept): at K = 8, m = 1 needs well under half of full backpropagation's.
  cfg = models.model_config(kind='context_ready', width=64, depth=1, num_heads=2,
                            vocab_size=128, max_len=64, k_unroll=8)
  model = models.build(cfg)
  batch = jnp.zeros((4, 65), jnp.int32)
  params = model.init(jax.random.key(0), batch[:, :-1])['params']

  def temp_bytes(m):
    recipe = train_step.Recipe(grad_iterations=m)
    grad = jax.jit(jax.grad(lambda p: train_step.objective_loss(model, p, batch, losses.NextToken(), recipe, k_unroll=8)[0]))
    return grad.lower(params).compile().memory_analysis().temp_size_in_bytes

  full, one = temp_bytes(0), temp_bytes(1)
  assert one < 0.4 * full, (one, full)
