"""The multi-layer algorithm and the numerics around it (reference checks C5, C9-C18).

Closed vs open loop, the first patched layer, token dependence, the stable update (its RMS
constraint, the zero-scale hard case, bf16), the division-by-zero guard, the fixed post-norm
counterexample, the gradient form, the predecessor's vanilla block, the context-ready model and
the padded next-token comparison the generation experiment uses.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax import implicit
from ctr_jax.implicit import patches
from ctr_jax.inference import decode
from helpers import family_lm


def max_err(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def patched_error(model, variables, tokens, split, evaluate=False, **kwargs):
  """Per-example max |Δlogit| of the patched query vs the full sequence, at the last position.

  The closed loop's reduced pass is the patched forward already; `evaluate` runs
  `patched_forward` separately (needed for the open loop, whose pass is not).
  """
  context, query = tokens[:, :split], tokens[:, split:]
  patch, info = implicit.compute_patch(model, variables, context, query, return_info=True,
                                       **kwargs)
  logits = info['logits']
  if evaluate:
    logits = implicit.patched_forward(model, variables, patch, query, split,
                                      mode=kwargs.get('mode', 'action'))[:, -1]
  full = info['baseline_logits']
  err = np.max(np.abs(np.asarray(logits, np.float64) - np.asarray(full, np.float64)), axis=-1)
  return err, patch, info


def test_closed_loop_is_no_worse_than_open_loop():
  model, variables, tokens = family_lm('gemma', dtype='bfloat16', depth=3, batch=8, length=10)
  closed, _, _ = patched_error(model, variables, tokens, 9, evaluate=True, loop='closed')
  opened, _, _ = patched_error(model, variables, tokens, 9, evaluate=True, loop='open')
  # The open loop's rounding accumulates across layers; the closed loop re-absorbs it.
  assert closed.mean() <= opened.mean() / 3, (closed, opened)


@pytest.mark.parametrize('block, first', [('gemma', 2), ('falcon', 3)])  # L/2; last only
def test_patching_from_a_later_layer_is_exact_and_leaves_lower_layers_alone(block, first):
  with jax.enable_x64(True):
    model, variables, tokens = family_lm(block, dtype='float64', depth=4)
    err, patch, _ = patched_error(model, variables, tokens, 7, evaluate=True,
                                  first_layer=first)
  assert err.max() <= 1e-10, err
  assert sorted(patch['blocks']) == [f'block_{i}' for i in range(first, 4)]


def test_a_patch_is_token_dependent():
  model, variables, tokens = family_lm('gemma', depth=2, length=8)
  err_now, patch, _ = patched_error(model, variables, tokens[:, :7], 6)
  # Reuse the position-6 patch for the next token: context tokens[:7], query tokens[7].
  reused = implicit.patched_forward(model, variables, patch, tokens[:, 7:], 7)[:, -1]
  err_next, _, _ = patched_error(model, variables, tokens, 7)
  full_next = jax.jit(model.apply)(variables, tokens)[:, -1]
  assert err_now.max() <= 1e-4 and err_next.max() <= 1e-4
  assert max_err(reused, full_next) > 100 * max(err_now.max(), err_next.max(), 1e-6)


def test_stable_update_meets_its_rms_constraint_and_shrinks_the_scale_patch():
  with jax.enable_x64(True):
    model, variables, tokens = family_lm('gemma', dtype='float64', depth=2, batch=4)
    err_s, _, info_s = patched_error(model, variables, tokens, 7, method='stable')
    err_d, _, info_d = patched_error(model, variables, tokens, 7, method='direct')
  assert err_s.max() <= 1e-10 and err_d.max() <= 1e-10
  for stable, direct in zip(info_s['layers'], info_d['layers']):
    assert float(jnp.max(stable['constraint'])) <= 1e-12
    assert float(jnp.max(stable['dm_max'])) < float(jnp.max(direct['dm_max']))


def test_stable_update_is_no_worse_than_direct_in_bfloat16():
  model, variables, tokens = family_lm('gemma', dtype='bfloat16', depth=3, batch=16, length=10)
  results = {}
  for method in ('direct', 'stable'):
    err, _, info = patched_error(model, variables, tokens, 9, evaluate=True, method=method,
                                 mode='materialise')
    dm = max(float(jnp.max(layer['dm_max'])) for layer in info['layers'])
    results[method] = (err.mean(), dm)
  (err_d, dm_d), (err_s, dm_s) = results['direct'], results['stable']
  assert err_s <= 1.1 * err_d, results
  assert dm_s < dm_d, results


def random_feasible(rng, n, d):
  y = rng.normal(size=(n, d))
  return y / np.sqrt(np.mean(y * y, axis=1, keepdims=True))


def test_rms_inversion_is_the_constrained_least_squares_minimiser():
  rng = np.random.default_rng(0)
  m, g = rng.normal(size=(5, 12)), 2 * rng.normal(size=(5, 12))
  y, info = implicit.solve_rms_inversion(m, g)
  assert np.all(info['constraint'] <= 1e-12) and not info['hard_case'].any()
  # Stationarity: y_i = m_i g_i / (m_i^2 - mu) with mu below min m^2.
  np.testing.assert_allclose(y, m * g / (m * m - info['mu'][:, None]), rtol=1e-9)
  assert np.all(info['mu'] < np.min(m * m, axis=1))
  best = np.sum((m * y - g) ** 2, axis=1)
  for row in range(5):
    others = np.sum((m[row] * random_feasible(rng, 4000, 12) - g[row]) ** 2, axis=1)
    assert best[row] <= others.min() + 1e-12


def test_traced_rms_inversion_returns_float64_whichever_thread_runs_the_callback():
  # XLA may run the host callback on a thread without the tracer's x64 flag; executing a
  # program compiled under x64 outside the context is the deterministic form of that.
  from ctr_jax.implicit import stable
  rng = np.random.default_rng(3)
  m_host, g_host = rng.normal(size=(3, 9)), rng.normal(size=(3, 9))
  m_host[0, 2] = 0.0
  with jax.enable_x64(True):
    m, g = jnp.asarray(m_host), jnp.asarray(g_host)
    compiled = jax.jit(stable.rms_inversion).lower(m, g).compile()
  y, constraint, hard, mu = compiled(m, g)
  want, info = implicit.solve_rms_inversion(m_host, g_host)
  assert y.dtype == jnp.float64 and mu.dtype == jnp.float64
  np.testing.assert_array_equal(np.asarray(y), want)
  np.testing.assert_array_equal(np.asarray(mu), info['mu'])
  np.testing.assert_array_equal(np.asarray(constraint), info['constraint'])
  np.testing.assert_array_equal(np.asarray(hard), info['hard_case'])


def test_rms_inversion_hard_case_with_a_zero_scale():
  rng = np.random.default_rng(1)
  m = 2 + np.abs(rng.normal(size=10))
  m[3] = 0.0  # a Gemma scale 1 + w with w = -1
  g = 0.5 * rng.normal(size=10)  # small enough that mean((g/m)^2) < 1 off the zero coordinate
  y, info = implicit.solve_rms_inversion(m, g)
  assert bool(info['hard_case']) and float(info['mu']) == 0.0
  assert float(info['constraint']) <= 1e-12
  mask = np.arange(10) != 3
  np.testing.assert_allclose(y[mask], g[mask] / m[mask], rtol=1e-12)
  assert y[3] > 0  # the missing norm sits on the zero-scale coordinate
  others = np.sum((m * random_feasible(rng, 20000, 10) - g) ** 2, axis=1)
  assert np.sum((m * y - g) ** 2) <= others.min() + 1e-12


def test_stable_update_is_exact_with_a_zero_post_norm_scale():
  with jax.enable_x64(True):
    model, variables, tokens = family_lm('gemma', dtype='float64', depth=2)
    params = jax.tree.map(lambda x: x, variables['params'])
    for name in ('block_0', 'block_1'):
      scale = params['blocks'][name]['post_mlp_norm']['scale']
      params['blocks'][name]['post_mlp_norm']['scale'] = scale.at[3].set(-1.0)  # m_3 = 0
    err, _, info = patched_error(model, {'params': params}, tokens, 6, method='stable')
    assert err.max() <= 1e-10
    assert all(float(jnp.max(layer['constraint'])) <= 1e-12 for layer in info['layers'])


def test_division_by_zero_guard_confines_the_error_to_the_zero_coordinate():
  with jax.enable_x64(True):
    # [in, out] kernels, so column 5 of W_down is output coordinate 5.
    model, variables, tokens = family_lm('gemma', dtype='float64', depth=1,
                                         kernel_layout='in_out')
    params = jax.tree.map(lambda x: x, variables['params'])
    down = params['blocks']['block_0']['mlp']['down']['kernel']
    params['blocks']['block_0']['mlp']['down']['kernel'] = down.at[:, 5].set(0.0)  # f_5 = 0
    _, patch, info = patched_error(model, {'params': params}, tokens, 6)
  layer = info['layers'][0]
  assert float(jnp.max(jnp.abs(layer['f'][:, 5]))) == 0.0
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(patch))
  gap = np.abs(np.asarray(layer['out'] - layer['out_c']))
  np.testing.assert_allclose(gap[:, 5], np.abs(layer['v_c'] - layer['v'])[:, 5], rtol=1e-9)
  assert np.delete(gap, 5, axis=1).max() <= 1e-12


def test_a_fixed_post_norm_scale_cannot_absorb_the_context():
  """Appendix D: with m fixed, v + m ⊙ N(h) stays on an ellipsoid; no W_down reaches out_C."""
  rng = np.random.default_rng(2)
  d, f = 8, 16
  m = 1 + 0.3 * rng.normal(size=d)
  a = rng.normal(size=f)
  w_down = rng.normal(size=(f, d)) / 4
  f_c = random_feasible(rng, 1, d)[0]
  gap = 3 * np.sqrt(d) * m * random_feasible(rng, 1, d)[0] / np.sqrt(d)  # ‖gap ⊘ m‖ = 3 sqrt(d)
  assert np.linalg.norm(gap / m) > 2 * np.sqrt(d)
  target = gap + m * f_c  # out_C − v: what m ⊙ N(h) would have to equal
  # The scale patch reaches it exactly.
  dm = gap / f_c
  np.testing.assert_allclose((m + dm) * f_c, target, rtol=1e-12)
  # The best any down projection can do is the constrained least-squares optimum, > 0.
  y, _ = implicit.solve_rms_inversion(m, target)
  floor = np.sum((m * y - target) ** 2)
  assert floor > 1.0
  # Full-rank gradient descent on W_down does not beat it.
  loss = lambda w: jnp.sum(jnp.square(m * (a @ w) / jnp.sqrt(jnp.mean((a @ w) ** 2)) - target))
  step = jax.jit(lambda w: w - 0.05 * jax.grad(loss)(w))
  w = jnp.asarray(w_down)
  for _ in range(300):
    w = step(w)
  assert float(loss(w)) >= floor - 1e-6
  assert float(loss(w)) <= 1.05 * floor  # and the optimiser got close, so the floor is real


def test_patches_are_one_gradient_step_with_rate_one_over_the_input_norm():
  with jax.enable_x64(True):
    model, variables, tokens = family_lm('llama', dtype='float64', depth=1, batch=1,
                                         kernel_layout='in_out')  # the x W form of the theorem
    patch, info = implicit.compute_patch(model, variables, tokens[:, :6], tokens[:, 6:],
                                         return_info=True)
    mlp = variables['params']['blocks']['block_0']['mlp']
    deltas = implicit.patch_deltas(variables, patch)['blocks']['block_0']['mlp']
    layer = info['layers'][0]
    z, z_c = layer['z'][0], layer['z_c'][0]
    gate = mlp['gate']['kernel']
    stepped = implicit.gradient_form(gate, z, z_c @ gate)
    assert max_err(stepped, gate + deltas['gate']['kernel'][0]) <= 1e-12
    a, dy = layer['a'][0], (layer['v_c'] - layer['v'])[0]
    down = mlp['down']['kernel']
    stepped = implicit.gradient_form(down, a, a @ down + dy)
    assert max_err(stepped, down + deltas['down']['kernel'][0]) <= 1e-12


def test_vanilla_block_formula_of_the_predecessor_paper():
  """T_W(C, x) = T_{W+ΔW}(x) for M(W A + b) after a contextual layer; + Δb' with a residual."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(3)
    w, b = rng.normal(size=(6, 9)), rng.normal(size=9)
    w2 = rng.normal(size=(9, 6))
    a_x, a_cx = rng.normal(size=(1, 6)), rng.normal(size=(1, 6))  # A(x), A(C, x)
    layer = {'kernel': w, 'bias': b}  # an [in, out] dense layer
    mlp = lambda a, delta: jnp.tanh(patches.linear(a[:, None], layer, delta, dtype=jnp.float64)
                                    [:, 0]) @ w2
    delta = patches.input_patch(jnp.asarray(a_x), jnp.asarray(a_cx), w)
    assert max_err(mlp(a_x, delta), mlp(a_cx, None)) <= 1e-12
    # With a skip connection A + M(A) the residual difference needs the output bias ΔA.
    assert max_err(a_x + mlp(a_x, delta) + (a_cx - a_x), a_cx + mlp(a_cx, None)) <= 1e-12


def test_context_ready_model_equivalence():
  model, variables, tokens = family_lm('gemma', kind='context_ready', depth=2, length=7)
  context, query = tokens[:, :6], tokens[:, 6:]
  full = decode.sequential_logits(model, variables, tokens)[:, -1]
  patch = implicit.compute_patch(model, variables, context, query)
  logits = implicit.patched_forward(model, variables, patch, query, 6)[:, -1]
  assert max_err(logits, full) <= 1e-4 * max(1.0, float(jnp.max(jnp.abs(full))))
  corr = implicit.patch_deltas(variables, patch)['correction']['ffn']['fc_in']['weight']
  assert implicit.matrix_ranks({'fc_in': corr}) == {"['fc_in']": [1, 1]}
  # Without the correction patch the blocks' patches no longer fit the block input.
  blocks_only = {'blocks': patch['blocks']}
  broken = implicit.patched_forward(model, variables, blocks_only, query, 6)[:, -1]
  assert max_err(broken, full) > 1e-3
  with pytest.raises(ValueError, match='one query token'):
    implicit.compute_patch(model, variables, tokens[:, :5], tokens[:, 5:])


def test_next_token_comparison_on_padded_prompts():
  model, variables, tokens = family_lm('gemma', depth=2, batch=3, length=9)
  lengths = jnp.array([9, 6, 4])
  padded = jnp.where(jnp.arange(9) < lengths[:, None], tokens, 0)
  # Causality makes each example's logits at its own last position independent of padding.
  expected = jax.jit(model.apply)(variables, padded)[jnp.arange(3), lengths - 1]
  for first in (0, 1):  # first_layer is traced: no recompilation
    base, patched, extras = implicit.next_token_comparison(model, variables, padded, lengths,
                                                           first_layer=first)
    assert extras['block_error'].shape == (2, 3)
    assert max_err(base, expected) <= 1e-5
    assert max_err(patched, base) <= 1e-4 * max(1.0, float(jnp.max(jnp.abs(base))))


def test_bad_arguments_are_clear_errors():
  model, variables, tokens = family_lm('llama', depth=2)
  for kwargs, match in ((dict(method='exact'), 'method'), (dict(mode='lazy'), 'mode'),
                        (dict(first_layer=2), 'first_layer'), (dict(loop='half'), 'loop')):
    with pytest.raises(ValueError, match=match):
      implicit.compute_patch(model, variables, tokens[:, :6], tokens[:, 6:], **kwargs)
