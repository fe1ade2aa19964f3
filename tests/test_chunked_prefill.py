"""Chunked prefill (decode.chunked_prefill) against the exact position scan: the decode state it
fills, the tokens and logits decoded after it, its tolerance mode and its argument checks."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode_hlo import loop_cache_copies

from ctr_jax import models
from ctr_jax.inference import decode
from helpers import max_abs_diff, random_model, random_tokens


def _tolerances(dtype, ref_logits):
  """(logit tolerance, state tolerance): tight in float32; bfloat16 rounds every block input,
  so its bound scales with the logits as in test_exactness."""
  if dtype == 'float32':
    return 1e-5, 1e-5
  return 0.05 * float(jnp.max(jnp.abs(ref_logits))), 0.1


def _assert_same_state(state, ref_state, tol):
  assert int(state.index) == int(ref_state.index)
  assert max_abs_diff(state.feedback, ref_state.feedback) <= tol
  for ours, ref in zip(state.caches, ref_state.caches, strict=True):
    assert max_abs_diff(ours['k'], ref['k']) <= tol
    assert max_abs_diff(ours['v'], ref['v']) <= tol


def _greedy_rollout(model, variables, state, last_logits, steps):
  """Step-decodes `steps` greedy tokens; returns (tokens [B, steps], their step logits)."""
  tokens, logits = [], []
  for _ in range(steps):
    token = jnp.argmax(last_logits, axis=-1)[:, None].astype(jnp.int32)
    step_logits, state = model.apply(variables, token, decode_state=state)
    last_logits = step_logits[:, 0]
    tokens.append(token)
    logits.append(last_logits)
  return jnp.concatenate(tokens, axis=1), jnp.stack(logits, axis=1)


def _setup(seed, dtype='float32', kind='context_ready', length_range=(5, 14)):
  _, model, variables, _ = random_model(seed, kind=kind, dtype=dtype)
  r = np.random.default_rng(seed + 7)
  t0 = int(r.integers(*length_range))
  tokens = random_tokens(seed, model.spec.vocab_size, batch=int(r.integers(1, 3)), length=t0)
  return model, variables, tokens, r


@pytest.mark.parametrize('seed', [0, pytest.param(1, marks=pytest.mark.slow),
                                  pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_chunk_plus_one_passes_fill_the_scans_state_and_decode_identically(seed, dtype):
  """With passes = chunk + 1 (more than the chunk's dependence chain) the state equals the
  scan's, and decoding after it matches both decoding after the scan and teacher forcing."""
  model, variables, tokens, r = _setup(seed, dtype)
  t0, steps = tokens.shape[1], 3
  chunk = int(r.integers(2, t0))
  length = t0 + steps
  ref_logits, ref_state = decode.prefill(model, variables, tokens, length)
  logits, state, used = decode.chunked_prefill(model, variables, tokens, length, chunk=chunk,
                                               passes=chunk + 1)
  logit_tol, state_tol = _tolerances(dtype, ref_logits)
  assert max_abs_diff(logits, ref_logits) <= logit_tol
  _assert_same_state(state, ref_state, state_tol)
  # No chunk runs more passes than its length: that many are already exact.
  sizes = [min(chunk, t0 - i) for i in range(0, t0, chunk)]
  assert np.all(np.asarray(used) <= np.asarray(sizes))

  ours, our_step_logits = _greedy_rollout(model, variables, state, logits[:, -1], steps)
  theirs, ref_step_logits = _greedy_rollout(model, variables, ref_state, ref_logits[:, -1], steps)
  assert max_abs_diff(our_step_logits, ref_step_logits) <= logit_tol
  if dtype == 'float32':
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    forced = decode.sequential_logits(model, variables, jnp.concatenate([tokens, ours], 1))
    assert max_abs_diff(forced[:, t0 - 1], logits[:, -1]) <= logit_tol
    assert max_abs_diff(forced[:, t0:t0 + steps - 1], our_step_logits[:, :-1]) <= logit_tol


@pytest.mark.parametrize('seed', [3, 4])
def test_chunk_one_is_the_scan_and_chunk_t_is_the_parallel_prefill(seed):
  model, variables, tokens, _ = _setup(seed)
  t0 = tokens.shape[1]
  ref_logits, ref_state = decode.prefill(model, variables, tokens, t0 + 2)
  logits, state, used = decode.chunked_prefill(model, variables, tokens, t0 + 2, chunk=1)
  assert used.shape == (t0,) and np.all(np.asarray(used) == 1)
  assert max_abs_diff(logits, ref_logits) <= 1e-6
  _assert_same_state(state, ref_state, 1e-6)

  par_logits, par_state, _ = decode.parallel_prefill(model, variables, tokens, t0 + 2, 0.0)
  for chunk in (t0, t0 + 5):  # a chunk longer than the prompt is the whole prompt
    logits, state, used = decode.chunked_prefill(model, variables, tokens, t0 + 2, chunk=chunk)
    assert used.shape == (1,)
    assert max_abs_diff(logits, par_logits) <= 1e-5
    _assert_same_state(state, par_state, 1e-5)


@pytest.mark.parametrize('correction', ['token_blind', 'concat', 'none', 'tied'])
def test_every_correction_variant_is_exact(correction):
  _, model, variables, _ = random_model(10, correction=correction)
  tokens = random_tokens(10, model.spec.vocab_size, batch=2, length=9)
  ref_logits, ref_state = decode.prefill(model, variables, tokens, 9)
  logits, state, _ = decode.chunked_prefill(model, variables, tokens, 9, chunk=4)
  assert max_abs_diff(logits, ref_logits) <= 1e-5
  _assert_same_state(state, ref_state, 1e-5)


def test_partial_last_chunk():
  model, variables, tokens, r = _setup(5, length_range=(9, 15))
  t0 = tokens.shape[1]
  chunk = int(r.integers(2, t0 // 2 + 1))
  if t0 % chunk == 0:
    tokens, t0 = tokens[:, :-1], t0 - 1
  ref_logits, ref_state = decode.prefill(model, variables, tokens, t0)
  logits, state, used = decode.chunked_prefill(model, variables, tokens, t0, chunk=chunk)
  assert used.shape == (-(-t0 // chunk),)
  assert int(used[-1]) <= t0 % chunk
  assert max_abs_diff(logits, ref_logits) <= 1e-5
  _assert_same_state(state, ref_state, 1e-5)


def _contracting(variables, factor):
  """The correction's output layer scaled by `factor`: a model whose fixed point contracts fast,
  as trained ones do (reference section 4.2), where random weights barely contract."""
  params = jax.tree.map(lambda x: x, variables['params'])
  out = params['correction']['ffn']['fc_out']
  params['correction']['ffn']['fc_out'] = jax.tree.map(lambda x: x * factor, out)
  return {**variables, 'params': params}


def test_tolerance_stops_early_and_stays_within_it():
  model, variables, tokens, _ = _setup(6, length_range=(12, 16))
  variables = _contracting(variables, 0.05)
  t0 = tokens.shape[1]
  chunk = t0 // 2
  ref_logits, ref_state = decode.prefill(model, variables, tokens, t0)
  # A loose tolerance stops after the first pass of every chunk.
  _, _, used = decode.chunked_prefill(model, variables, tokens, t0, chunk=chunk, tolerance=1e3)
  assert np.all(np.asarray(used) == 1)
  errors = []
  for tolerance in (1e-2, 1e-4):
    logits, state, used = decode.chunked_prefill(model, variables, tokens, t0, chunk=chunk,
                                                 tolerance=tolerance)
    assert int(used[0]) < chunk, used  # stopped before the exact bound
    # Stopping at max |c_new - c| <= tol leaves every block input within ~tol of its fixed point.
    assert max_abs_diff(state.feedback, ref_state.feedback) <= 10 * tolerance
    errors.append(max_abs_diff(logits, ref_logits))
  assert errors[1] <= errors[0]
  # `passes` caps the tolerance mode.
  _, _, used = decode.chunked_prefill(model, variables, tokens, t0, chunk=chunk, passes=1,
                                      tolerance=1e-9)
  assert np.all(np.asarray(used) == 1)


def test_transformer_chunks_take_one_pass_each():
  model, variables, tokens, r = _setup(7, kind='transformer')
  t0 = tokens.shape[1]
  chunk = int(r.integers(2, t0))
  ref_logits, ref_state = decode.prefill(model, variables, tokens, t0 + 1)
  logits, state, used = decode.chunked_prefill(model, variables, tokens, t0 + 1, chunk=chunk)
  assert np.all(np.asarray(used) == 1)
  assert max_abs_diff(logits, ref_logits) <= 1e-5
  _assert_same_state(state, ref_state, 1e-5)


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_generate_with_each_prefill_gives_the_scans_tokens(kind):
  model, variables, tokens, r = _setup(8, kind=kind)
  chunk = int(r.integers(2, tokens.shape[1]))
  rng = jax.random.key(0)
  ref = decode.generate(model, variables, tokens, 4, rng)
  for kwargs in ({'prefill': 'parallel'}, {'prefill': 'chunked', 'prefill_chunk': chunk},
                 {'prefill': 'chunked', 'prefill_chunk': chunk, 'prefill_passes': chunk + 1}):
    out = decode.generate(model, variables, tokens, 4, rng, **kwargs)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref), err_msg=str(kwargs))


def test_bad_arguments_name_themselves():
  model, variables, tokens, _ = _setup(9)
  t0 = tokens.shape[1]
  for kwargs, name in (({'chunk': 0}, 'chunk'), ({'chunk': -2}, 'chunk'), ({'chunk': 2.5}, 'chunk'),
                       ({'chunk': 2, 'passes': 0}, 'passes'),
                       ({'chunk': 2, 'passes': -1}, 'passes'),
                       ({'chunk': 2, 'tolerance': -1.0}, 'tolerance')):
    with pytest.raises(ValueError, match=f'^{name}: got'):
      decode.chunked_prefill(model, variables, tokens, t0, **kwargs)
  with pytest.raises(ValueError, match='^length: got'):
    decode.chunked_prefill(model, variables, tokens, t0 - 1, chunk=2)
  with pytest.raises(ValueError, match=r"prefill: got 'fast', allowed \['scan'"):
    decode.generate(model, variables, tokens, 2, jax.random.key(0), prefill='fast')
  with pytest.raises(ValueError, match='^prefill_chunk: got 0'):
    decode.generate(model, variables, tokens, 2, jax.random.key(0), prefill='chunked')
  with pytest.raises(ValueError, match='^prefill_passes: got 0'):
    decode.generate(model, variables, tokens, 2, jax.random.key(0), prefill='chunked',
                    prefill_chunk=2, prefill_passes=0)
  with pytest.raises(ValueError, match="only for prefill='chunked'"):
    decode.generate(model, variables, tokens, 2, jax.random.key(0), prefill_chunk=4)
  cfg = models.model_config(kind='context_ready', vocab_size=16, width=16, depth=1, num_heads=2,
                            max_len=16, cumulative=True)
  cumulative = models.build(cfg)
  with pytest.raises(ValueError, match='cumulative'):
    decode.chunked_prefill(cumulative, cumulative.init(jax.random.key(0), tokens), tokens, t0,
                           chunk=2)


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_chunked_generate_writes_the_kv_cache_in_place(kind):
  """The chunk loops carry the caches: each pass overwrites the chunk's slots, no cache copy."""
  cfg = models.model_config(kind=kind, vocab_size=64, width=32, depth=2, num_heads=4,
                            max_len=64)
  model = models.build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  prompt, num_tokens, chunk = jnp.ones((1, 11), jnp.int32), 7, 4
  hlo = decode._generate.lower(model, variables, prompt, num_tokens, jax.random.key(1),
                               jnp.float32(0), 0, 'chunked', chunk, chunk,
                               jnp.float32(0)).compile().as_text()
  state = decode.init_decode_state(model, 1, 11 + num_tokens)
  copies = loop_cache_copies(hlo, {tuple(x.shape) for x in jax.tree.leaves(state.caches)})
  assert not copies, copies[:3]


def test_anderson_script_plain_iteration_is_chunked_prefill_and_mixing_converges():
  """ctr_jax.projects.perf.prefill_anderson: memory 0 takes exactly chunked_prefill's passes in the
  tolerance mode, and Anderson mixing reaches the same fixed point (the scan's logits)."""
  from ctr_jax.projects.perf import prefill_anderson
  model, variables, tokens, _ = _setup(8, length_range=(12, 16))
  variables = _contracting(variables, 0.3)
  t0 = tokens.shape[1]
  chunk, tolerance = t0 // 2 + 1, 1e-5
  ref_logits, _ = decode.prefill(model, variables, tokens, t0 + 1)
  _, _, used = decode.chunked_prefill(model, variables, tokens, t0 + 1, chunk=chunk,
                                      tolerance=tolerance)
  for memory in (0, 2):
    logits, script_used, trace = prefill_anderson.prefill(
        model, variables['params'], tokens, memory, chunk, tolerance, max_passes=chunk)
    if memory == 0:
      assert script_used == [int(n) for n in used]
    assert trace[-1] <= tolerance < trace[0]
    assert max_abs_diff(logits, ref_logits) <= 1e-3


def test_anderson_script_bad_checkpoint_is_a_usage_error_naming_the_flag(tmp_path):
  """A workdir without a run is a user mistake: an absl usage error naming --checkpoint."""
  from absl import (
    app,  # pylint: disable=g-import-not-at-top
    flags,  # pylint: disable=g-import-not-at-top
  )

  from ctr_jax.projects.perf import prefill_anderson
  flags.FLAGS(['prefill_anderson', f'--checkpoint={tmp_path}'])
  try:
    with pytest.raises(app.UsageError, match='--checkpoint'):
      prefill_anderson.main([])
  finally:
    flags.FLAGS.unparse_flags()
  assert not os.listdir(tmp_path)  # nothing written into the user's directory
