"""The maths of the context-ready transformer: K-unroll vs the exact sequential scan."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax.inference import decode
from helpers import max_abs_diff, random_model, random_tokens


@pytest.mark.parametrize('depth', [1, 2, 3])
@pytest.mark.parametrize('seed', [0, 1])
def test_unroll_with_k_above_length_equals_sequential_scan(depth, seed):
  cfg, model, variables, tokens = random_model(seed, depth=depth)
  t = tokens.shape[1]
  parallel = model.apply(variables, tokens, k_unroll=t + 1)
  sequential = decode.sequential_logits(model, variables, tokens)
  assert max_abs_diff(parallel, sequential) <= 1e-4


def test_finite_step_exactness_and_shrinking_error():
  """After K iterations positions t <= K-2 are exact; the remaining error shrinks with K."""
  _, model, variables, _ = random_model(3, depth=2)
  tokens = random_tokens(3, model.spec.vocab_size, batch=2, length=12)
  sequential = np.asarray(decode.sequential_logits(model, variables, tokens))
  errors = []
  for k in (1, 2, 4, 8, 13):
    parallel = np.asarray(model.apply(variables, tokens, k_unroll=k))
    per_position = np.abs(parallel - sequential).max(axis=(0, 2))
    assert per_position[:max(k - 1, 0)].max(initial=0.0) <= 1e-4, (k, per_position)
    if k <= 4:  # the first unresolved position, t = K-1, is one iteration short: the +1 is real.
      assert per_position[k - 1] > 1e-4, (k, per_position)
    errors.append(per_position.mean())
  assert errors[-1] <= 1e-4
  assert all(later < earlier or later < 1e-5 for earlier, later in zip(errors, errors[1:])), errors


@pytest.mark.parametrize('seed', [0, 1])
def test_bfloat16_unroll_tracks_sequential(seed):
  _, model, variables, tokens = random_model(seed, depth=2, dtype='bfloat16')
  t = tokens.shape[1]
  parallel = model.apply(variables, tokens, k_unroll=t + 1)
  sequential = decode.sequential_logits(model, variables, tokens)
  assert parallel.dtype == jnp.float32
  scale = float(jnp.max(jnp.abs(sequential)))
  assert max_abs_diff(parallel, sequential) <= 0.05 * scale


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_causality_in_both_modes(kind):
  _, model, variables, tokens = random_model(4, kind=kind, depth=2)
  tokens = random_tokens(4, model.spec.vocab_size, batch=2, length=8)
  s = 5
  changed = tokens.at[:, s].set((tokens[:, s] + 1) % model.spec.vocab_size)
  for fn in (lambda x: model.apply(variables, x, k_unroll=9),
             lambda x: decode.sequential_logits(model, variables, x)):
    a, b = np.asarray(fn(tokens)), np.asarray(fn(changed))
    assert np.abs(a[:, :s] - b[:, :s]).max() == 0.0
    assert np.abs(a[:, s:] - b[:, s:]).max() > 0.0


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_transformer_and_crt_cached_decode_equals_full_forward(kind):
  _, model, variables, tokens = random_model(5, kind=kind)
  full = model.apply(variables, tokens, k_unroll=tokens.shape[1] + 1)
  assert max_abs_diff(full, decode.sequential_logits(model, variables, tokens)) <= 1e-4


def test_transformer_chunked_prefill_matches_full_forward():
  _, model, variables, tokens = random_model(6, kind='transformer')
  state = decode.init_decode_state(model, tokens.shape[0], tokens.shape[1] + 2)
  logits, state = model.apply(variables, tokens, decode_state=state)
  assert max_abs_diff(logits, model.apply(variables, tokens)) <= 1e-4
  assert int(state.index) == tokens.shape[1]


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_greedy_generate_is_the_argmax_rollout_of_teacher_forcing(kind):
  _, model, variables, _ = random_model(7, kind=kind, depth=2)
  prompt = random_tokens(7, model.spec.vocab_size, batch=3, length=4)
  out = decode.generate(model, variables, prompt, 6, jax.random.key(1), temperature=0.0)
  assert out.shape == (3, 10)
  np.testing.assert_array_equal(out[:, :4], prompt)
  teacher = model.apply(variables, out[:, :-1], k_unroll=out.shape[1] + 1)
  np.testing.assert_array_equal(np.argmax(teacher[:, 3:], axis=-1), out[:, 4:])


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_prefill_then_continue_generation_equals_generate(kind):
  _, model, variables, _ = random_model(9, kind=kind, depth=2)
  prompt = random_tokens(9, model.spec.vocab_size, batch=2, length=5)
  rng = jax.random.key(4)
  whole = decode.generate(model, variables, prompt, 6, rng, temperature=0.7)
  logits, state = decode.prefill(model, variables, prompt, 5 + 6)
  assert max_abs_diff(logits, model.apply(variables, prompt, k_unroll=6)) <= 1e-4
  tokens, state = decode.continue_generation(model, variables, logits[:, -1], state, 6, rng,
                                             jnp.float32(0.7))
  np.testing.assert_array_equal(whole[:, 5:], tokens)
  assert int(state.index) == 11
  with pytest.raises(ValueError, match='do not fit'):
    decode.continue_generation(model, variables, logits[:, -1], state, 1, rng)


def test_sampling_respects_top_k_and_seed():
  _, model, variables, _ = random_model(8, depth=1)
  prompt = random_tokens(8, model.spec.vocab_size, batch=4, length=3)
  a = decode.generate(model, variables, prompt, 5, jax.random.key(2), temperature=1.0, top_k=1)
  greedy = decode.generate(model, variables, prompt, 5, jax.random.key(3), temperature=0.0)
  np.testing.assert_array_equal(a, greedy)  # top_k=1 sampling is greedy
  b = decode.generate(model, variables, prompt, 5, jax.random.key(2), temperature=5.0)
  c = decode.generate(model, variables, prompt, 5, jax.random.key(2), temperature=5.0)
  np.testing.assert_array_equal(b, c)
  assert int(b.max()) < model.spec.vocab_size
  assert not np.array_equal(b, greedy)  # a hot sampler really samples


def test_sample_logits_draws_from_the_softmax_and_argmax_when_cold():
  logits = jnp.broadcast_to(jnp.log(jnp.array([1.0, 3.0, 0.0])), (20000, 3))
  draws = np.asarray(decode.sample_logits(logits, jax.random.key(0), 1.0))
  np.testing.assert_allclose(np.bincount(draws, minlength=3) / 20000, [0.25, 0.75, 0.0],
                             atol=0.015)
  assert (np.asarray(decode.sample_logits(logits, jax.random.key(0), 0.0)) == 1).all()
  sharp = np.asarray(decode.sample_logits(logits, jax.random.key(1), 0.5))  # p ∝ w^2: 0.9
  assert abs((sharp == 1).mean() - 0.9) < 0.015


@pytest.mark.parametrize('seed', [0, 1, 2])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_parallel_prefill_equals_sequential_prefill_and_continues_identically(seed, dtype):
  """Run to its exact bound (T0 + 1 passes), the fixed-point prefill reproduces the position
  scan's logits and state, so greedy decoding from either state gives the same tokens."""
  _, model, variables, tokens = random_model(seed, dtype=dtype)
  t0 = tokens.shape[1]
  length = t0 + 4
  ref_logits, ref_state = decode.prefill(model, variables, tokens, length)
  logits, state, passes = decode.parallel_prefill(model, variables, tokens, length, 0.0)
  tol = 1e-4 if dtype == 'float32' else 0.05 * float(jnp.max(jnp.abs(ref_logits)))
  assert int(passes) == t0 + 1
  assert max_abs_diff(logits, ref_logits) <= tol
  assert int(state.index) == int(ref_state.index) == t0
  assert max_abs_diff(state.feedback, ref_state.feedback) <= (1e-4 if dtype == 'float32' else 0.1)
  for ours, ref in zip(state.caches, ref_state.caches):
    assert max_abs_diff(ours['k'], ref['k']) <= (1e-4 if dtype == 'float32' else 0.1)
  if dtype == 'float32':
    def rollout(st, last):
      out = []
      for _ in range(3):
        token = jnp.argmax(last, axis=-1)[:, None].astype(jnp.int32)
        step_logits, st = model.apply(variables, token, decode_state=st)
        last = step_logits[:, 0]
        out.append(np.asarray(token))
      return np.concatenate(out, axis=1)
    np.testing.assert_array_equal(rollout(state, logits[:, -1]), rollout(ref_state, ref_logits[:, -1]))


def test_parallel_prefill_stops_at_the_tolerance_and_transformers_take_one_pass():
  _, model, variables, tokens = random_model(5, depth=2)
  loose = decode.parallel_prefill(model, variables, tokens, tokens.shape[1], 1e3)
  assert int(loose[2]) == 1  # the first pass's change |c^(1) - 0| is already below 1e3
  capped = decode.parallel_prefill(model, variables, tokens, tokens.shape[1], 0.0, 2)
  assert int(capped[2]) == 2
  _, tmodel, tvariables, ttokens = random_model(5, kind='transformer', depth=2)
  logits, _, passes = decode.parallel_prefill(tmodel, tvariables, ttokens, ttokens.shape[1])
  assert int(passes) == 1
  assert max_abs_diff(logits, tmodel.apply(tvariables, ttokens)) <= 1e-5
