"""BPTT: the custom-VJP gradients of the sequential forward are the exact gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ctr_jax import models
from ctr_jax.data import pointer_chasing as pc
from ctr_jax.inference import bptt, decode
from ctr_jax.tasks import losses
from ctr_jax.tasks import pointer_chasing as pointer_task
from ctr_jax.training import train_step
from helpers import max_abs_diff, random_tokens


def tiny_model(kind, depth, length):
  cfg = models.model_config(kind=kind, vocab_size=19, width=16, depth=depth, num_heads=2,
                            max_len=length)
  model = models.build(cfg)
  tokens = random_tokens(depth, cfg.vocab_size, batch=2, length=length)
  return model, model.init(jax.random.key(depth), tokens)['params'], tokens


@pytest.mark.parametrize('kind, depth', [('context_ready', 1), ('context_ready', 2),
                                         ('transformer', 2)])
def test_bptt_gradients_equal_autodiff_and_the_exact_unroll(kind, depth):
  model, params, tokens = tiny_model(kind, depth, length=7)
  t = tokens.shape[1]
  # Some positions without a target, as in pointer chasing.
  targets = jnp.where(random_tokens(9, 2, 2, t) == 0, -1, random_tokens(10, 19, 2, t))
  forwards = {
      'bptt': lambda p: bptt.bptt_logits(model, p, tokens),
      'autodiff': lambda p: bptt.plain_autodiff_logits(model, p, tokens),
      'unroll': lambda p: model.apply({'params': p}, tokens, k_unroll=t + 1),
  }

  if kind == 'transformer':  # its parallel forward has no unroll to compare with
    del forwards['unroll']

  def loss(forward):
    def fn(p):
      logits = forward(p)
      return pointer_task.loss_on_targets(logits, targets), logits
    return fn

  @jax.jit  # one compilation for all of them
  def all_grads(p):
    return {name: jax.grad(loss(f), has_aux=True)(p) for name, f in forwards.items()}

  results = all_grads(params)
  grads, logits = results['bptt']
  sequential = decode.sequential_logits(model, {'params': params}, tokens)
  assert max_abs_diff(logits, sequential) <= 1e-5
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
  assert scale > 1e-3  # a non-trivial gradient
  for name in set(forwards) - {'bptt'}:
    other_grads, other_logits = results[name]
    assert max_abs_diff(other_logits, logits) <= 1e-4, name
    assert jax.tree.structure(other_grads) == jax.tree.structure(grads)
    for (path, a), b in zip(jax.tree.leaves_with_path(grads), jax.tree.leaves(other_grads)):
      assert max_abs_diff(a, b) <= 1e-5 * scale + 1e-7, (name, jax.tree_util.keystr(path))


def test_bptt_memory_is_linear_not_quadratic_in_length():
  """Plain autodiff saves the KV cache at every step; BPTT saves it once."""
  length = 48
  model, params, tokens = tiny_model('context_ready', 1, length)

  def temp_bytes(forward):
    grad = jax.jit(jax.grad(lambda p: jnp.sum(forward(model, p, tokens) ** 2)))
    return grad.lower(params).compile().memory_analysis().temp_size_in_bytes

  cache_bytes = 2 * tokens.size * 16 * 4  # k and v, [B, T, C] floats, one layer
  bptt_bytes, plain_bytes = temp_bytes(bptt.bptt_logits), temp_bytes(bptt.plain_autodiff_logits)
  assert plain_bytes > length / 4 * cache_bytes, (plain_bytes, cache_bytes)
  assert bptt_bytes < plain_bytes / 5, (bptt_bytes, plain_bytes)


@pytest.fixture
def optimized_compilation():
  """The suite compiles without XLA optimisations; a few hundred train steps need them."""
  jax.config.update('jax_disable_most_optimizations', False)
  yield
  jax.config.update('jax_disable_most_optimizations', True)


@pytest.mark.slow
def test_bptt_learns_one_hop_pointer_chasing(optimized_compilation):
  del optimized_compilation
  hops, batch_size, steps = 1, 32, 120
  cfg = models.model_config(kind='context_ready', vocab_size=pc.vocab_size(hops), width=64,
                            depth=1, num_heads=4, max_len=pc.seq_len(hops), init='torch')
  model = models.build(cfg)
  params = model.init(jax.random.key(0), jnp.zeros((1, pc.seq_len(hops)), jnp.int32))['params']
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))

  @jax.jit
  def train_step(params, opt_state, tokens, targets):
    loss_fn = lambda p: pointer_task.loss_on_targets(bptt.bptt_logits(model, p, tokens), targets)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state, history = tx.init(params), []
  for step in range(steps):
    tokens, targets = pc.batch(hops, batch_size, seed=0, start=step * batch_size)
    params, opt_state, loss = train_step(params, opt_state, tokens, targets)
    history.append(float(loss))
  chance = np.log(16)
  assert np.mean(history[:5]) > 0.9 * chance, history[:5]
  assert np.mean(history[-20:]) < 0.7 * chance, history[-20:]
  # The table keys (copy the value two tokens back) are the first thing it learns.
  predict = jax.jit(lambda x: bptt.bptt_logits(model, params, x))
  metrics = pointer_task.evaluate(predict, hops, num_examples=64, batch_size=batch_size)
  assert metrics['table_key_accuracy'] > 0.9, metrics


def test_the_bptt_recipe_trains_language_models_through_bptt():
  """`config.train.mode='bptt'` reaches every task's loss through train_step.forward."""
  model, params, _ = tiny_model('context_ready', 1, length=8)
  batch = random_tokens(3, 19, batch=2, length=9)
  recipe = train_step.Recipe(mode='bptt', k_min=2)  # k_min and lambda mean nothing to BPTT
  value, metrics = train_step.objective_loss(model, params, batch, losses.NextToken(), recipe, k_unroll=1)
  assert set(metrics) == {'loss', 'ce_loss'}  # no convergence term to report

  def reference(p):
    logits = bptt.bptt_logits(model, p, batch[:, :-1])
    return losses.next_token_loss(logits, batch[:, 1:])[0]

  grads = jax.grad(lambda p: train_step.objective_loss(model, p, batch, losses.NextToken(), recipe, k_unroll=1)[0])(
      params)
  expected_grads = jax.grad(reference)(params)
  assert float(value) == pytest.approx(float(reference(params)), rel=1e-6)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads)):
    assert max_abs_diff(a, b) <= 1e-6
  # K = 1 of the unroll is a different function: the recipe, not k_unroll, chose the forward.
  unroll = train_step.objective_loss(model, params, batch, losses.NextToken(), k_unroll=1)[1]['ce_loss']
  assert abs(float(unroll) - float(value)) > 1e-4
