"""Bad arguments to the decode entry points are a ValueError naming the argument (issue 41, items 7
and 8; docs/reliability.md rows 21 and 22), checked on the host before anything is traced.

Before: a token id >= vocab_size (or a position past a learned position table) gave NaN logits
and `generate` returned [[1, 999, 0, 0, 0]]; num_tokens=10**9 tried a 160 GB allocation; a NaN
temperature sampled greedily; prefill(length < prompt length) was silently wrong.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax import models
from ctr_jax.inference import decode
from ctr_jax.tasks import language_modelling

VOCAB, MAX_LEN = 50, 8


@functools.cache
def _model(kind: str, positions: str = 'rope'):
  cfg = models.model_config(kind=kind, vocab_size=VOCAB, width=16, depth=1, num_heads=2,
                            max_len=MAX_LEN, k_unroll=2, positions=positions)
  model = models.build(cfg)
  return model, jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))


# Every public entry point that reads token ids, called with `tokens` [B, T]; the argument name.
ENTRY_POINTS = {
    'generate': (lambda m, v, t: decode.generate(m, v, t, 2, jax.random.key(0)), 'prompt'),
    'prefill': (lambda m, v, t: decode.prefill(m, v, t, MAX_LEN), 'prompt'),
    'parallel_prefill': (lambda m, v, t: decode.parallel_prefill(m, v, t, MAX_LEN), 'prompt'),
    'chunked_prefill': (lambda m, v, t: decode.chunked_prefill(m, v, t, MAX_LEN, chunk=2),
                        'prompt'),
    'sequential_logits': (decode.sequential_logits, 'tokens'),
}
KINDS = ['context_ready', 'transformer']


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('entry', sorted(ENTRY_POINTS))
@pytest.mark.parametrize('bad_id', [999, VOCAB, -1])
def test_a_token_id_outside_the_vocabulary_is_named(entry, kind, bad_id):
  call, name = ENTRY_POINTS[entry]
  model, variables = _model(kind)
  tokens = np.array([[1, 2], [3, bad_id]], np.int32)
  with pytest.raises(ValueError, match=rf'^{name}: got token id {bad_id} at \[1, 1\], allowed '
                                       rf'ids in \[0, model.vocab_size={VOCAB}\)$'):
    call(model, variables, tokens)
  # The largest valid id goes through, as a jax array too.
  out = call(model, variables, jnp.array([[1, 2], [3, VOCAB - 1]]))
  assert np.isfinite(np.asarray(out[0] if isinstance(out, tuple) else out, np.float32)).all()


@pytest.mark.parametrize('entry', sorted(ENTRY_POINTS))
@pytest.mark.parametrize('tokens,message', [
    (np.array([1, 2]), r'got shape \(2,\), allowed \[batch, positions\]'),
    (np.zeros((1, 0), np.int32), r'got shape \(1, 0\), allowed \[batch, positions\]'),
    (np.zeros((0, 3), np.int32), r'got shape \(0, 3\), allowed \[batch, positions\]'),
    (np.array([[1.0, 2.0]]), r'got dtype float64, allowed integer token ids'),
], ids=['1d', 'no_positions', 'no_rows', 'float'])
def test_an_empty_1d_or_float_token_array_is_named(entry, tokens, message):
  call, name = ENTRY_POINTS[entry]
  model, variables = _model('context_ready')
  with pytest.raises(ValueError, match=rf'^{name}: {message}'):
    call(model, variables, tokens)


@pytest.mark.parametrize('kind', KINDS)
def test_learned_positions_past_max_len_are_refused_and_max_len_itself_is_finite(kind):
  model, variables = _model(kind, 'learned')
  prompt = jnp.array([[1, 2]])
  with pytest.raises(ValueError, match=rf'^num_tokens: 7 after a 2-token prompt make 9 positions, '
                                       rf'allowed at most model.max_len={MAX_LEN} .*learned '):
    decode.generate(model, variables, prompt, MAX_LEN - 1, jax.random.key(0))
  with pytest.raises(ValueError, match=rf'^tokens: got {MAX_LEN + 1} positions, allowed at most'):
    decode.sequential_logits(model, variables, jnp.ones((1, MAX_LEN + 1), jnp.int32))
  with pytest.raises(ValueError, match=rf'^length: got {MAX_LEN + 1} positions, allowed at most'):
    decode.prefill(model, variables, prompt, MAX_LEN + 1)
  out = decode.generate(model, variables, prompt, MAX_LEN - 2, jax.random.key(0))
  assert out.shape == (1, MAX_LEN)
  logits = decode.sequential_logits(model, variables, out)
  assert np.isfinite(np.asarray(logits)).all()


def test_a_huge_num_tokens_is_refused_before_any_allocation():
  model, variables = _model('context_ready')
  with pytest.raises(ValueError, match=r'^num_tokens: 1000000000 after a 2-token prompt make '
                                       rf'1000000002 positions, allowed at most model.max_len='
                                       rf'{MAX_LEN}'):
    decode.generate(model, variables, jnp.array([[1, 2]]), 10**9, jax.random.key(0))
  for bad in (0, -3, 2.5, True):
    with pytest.raises(ValueError, match=rf'^num_tokens: got {bad!r}, allowed an int >= 1'):
      decode.generate(model, variables, jnp.array([[1, 2]]), bad, jax.random.key(0))


@pytest.mark.parametrize('kwargs,message', [
    ({'temperature': float('nan')}, r'^temperature: got nan, allowed a finite number >= 0'),
    ({'temperature': float('inf')}, r'^temperature: got inf, allowed a finite number >= 0'),
    ({'temperature': -0.5}, r'^temperature: got -0.5, allowed'),
    ({'temperature': 1.0, 'top_k': VOCAB + 1},
     rf'^top_k: got {VOCAB + 1}, allowed an int in \[0, model.vocab_size={VOCAB}\]'),
    ({'temperature': 1.0, 'top_k': -1}, r'^top_k: got -1, allowed'),
    ({'temperature': 1.0, 'top_k': 2.5}, r'^top_k: got 2.5, allowed'),
])
def test_bad_sampling_arguments_are_named(kwargs, message):
  model, variables = _model('transformer')
  prompt = jnp.array([[1, 2]])
  with pytest.raises(ValueError, match=message):
    decode.generate(model, variables, prompt, 2, jax.random.key(0), **kwargs)
  logits, state = decode.prefill(model, variables, prompt, 4)
  with pytest.raises(ValueError, match=message):
    decode.continue_generation(model, variables, logits[:, -1], state, 2, jax.random.key(0),
                               **kwargs)
  # top_k = vocab_size (no cut) is allowed.
  decode.generate(model, variables, prompt, 2, jax.random.key(0), temperature=1.0, top_k=VOCAB)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('entry', ['prefill', 'parallel_prefill', 'chunked_prefill'])
def test_a_prefill_length_below_the_prompt_length_is_named(kind, entry):
  model, variables = _model(kind)
  prompt = jnp.array([[1, 2, 3]])
  call = {'prefill': decode.prefill, 'parallel_prefill': decode.parallel_prefill,
          'chunked_prefill': functools.partial(decode.chunked_prefill, chunk=2)}[entry]
  with pytest.raises(ValueError, match=r'^length: got 2 for a 3-token prompt, allowed >= 3$'):
    call(model, variables, prompt, 2)
  with pytest.raises(ValueError, match=r'^length: got 3.0, allowed an int$'):
    call(model, variables, prompt, 3.0)


def test_a_traced_prompt_gets_the_shape_checks_only():
  # A caller's own jit (e.g. projects/perf/hlo_diff.py) passes a tracer: its values are unknown.
  model, variables = _model('context_ready')
  prompt = jnp.array([[1, 2]])
  jitted = jax.jit(lambda p: decode.generate(model, variables, p, 3, jax.random.key(0)))
  np.testing.assert_array_equal(jitted(prompt),
                                decode.generate(model, variables, prompt, 3, jax.random.key(0)))
  with pytest.raises(ValueError, match=r'^prompt: got shape \(2,\)'):
    jax.jit(lambda p: decode.generate(model, variables, p, 3, jax.random.key(0)))(prompt[0])


def test_evaluate_lm_refuses_a_batch_with_an_id_outside_the_vocabulary():
  model, variables = _model('context_ready')
  good = np.ones((2, 5), np.int32)
  assert np.isfinite(language_modelling.evaluate_lm(model, variables['params'], [good])['loss'])
  bad = good.copy()
  bad[1, 4] = VOCAB  # a target (the last column is never an input)
  with pytest.raises(ValueError, match=rf'^config.model.vocab_size={VOCAB}: an evaluation batch '
                                       rf'holds token id {VOCAB} \(at \[1, 4\]\)'):
    language_modelling.evaluate_lm(model, variables['params'], [good, bad])
  bad[1, 4], bad[0, 1] = 1, -2  # a negative input
  with pytest.raises(ValueError, match=r'holds token id -2 \(at \[0, 1\]\)'):
    language_modelling.evaluate_lm(model, variables['params'], [bad])
