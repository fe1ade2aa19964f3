"""Model construction: sizes, parameter counts, conversion, ablations, config errors."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ctr_jax import models
from ctr_jax.inference import decode, diagnostics
from ctr_jax.models import convert, layers
from ctr_jax.ops import kernels
from ctr_jax.tasks import losses
from ctr_jax.training import train_step
from helpers import max_abs_diff, random_model, random_tokens

PAPER_COUNTS = {  # reference section 1.4, V = 32,000
    'd5_c1120': 157_094_080, 'd1_c2048': 215_035_136, 'd6_c1024': 149_543_168,
    't6_c1088': 154_980_608, 't12_c768': 134_240_000,
}


@pytest.mark.parametrize('name', sorted(PAPER_COUNTS))
def test_parameter_counts_match_the_paper(name):
  cfg = models.model_config(name=name, vocab_size=32000)
  model = models.build(cfg)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  assert models.count_params(shapes) == PAPER_COUNTS[name]
  c, v, d = cfg.width, cfg.vocab_size, cfg.depth
  formula = 2 * v * c + v + d * (12 * c * c + 13 * c) + (
      8 * c * c + 5 * c + 4 * c if cfg.kind == 'context_ready' else 2 * c)
  assert models.count_params(shapes) == formula


def test_size_table_and_flop_formula():
  assert models.decode_size('d5_c1120') == dict(kind='context_ready', depth=5, width=1120,
                                                num_heads=16)
  assert models.decode_size('t12_c768')['kind'] == 'transformer'
  assert models.decode_size('d3_c384_h6') == dict(kind='context_ready', depth=3, width=384,
                                                  num_heads=6)
  # Per-token cost quoted by the paper's digests: 121M (D=5 C=1120) and 149M (D=1 C=2048).
  assert round(models.flops_per_token(models.model_config(name='d5_c1120')) / 1e6) == 121
  assert round(models.flops_per_token(models.model_config(name='d1_c2048')) / 1e6) == 149
  c = 1088
  assert models.flops_per_token(models.model_config(name='t6_c1088')) == 6 * 12 * c * c + 32000 * c


def test_public_config_example_has_defaults():
  cfg = models.model_config(kind='context_ready', vocab_size=97, width=64, depth=2, num_heads=4,
                            max_len=64, k_unroll=4)
  assert cfg.block == 'gpt' and cfg.correction == 'add' and cfg.k_unroll == 4
  tokens = jnp.zeros((2, 8), jnp.int32)
  model = models.build(cfg)
  variables = model.init(jax.random.key(0), tokens)
  assert model.apply(variables, tokens, k_unroll=3).shape == (2, 8, 97)


@pytest.mark.parametrize('overrides, field', [
    (dict(width=66, num_heads=4), 'width'),
    (dict(k_unroll=0), 'k_unroll'),
    (dict(k_min=2), 'k_min'),  # a training-recipe field (config.train), not the model's
    (dict(train_mode='bptt'), 'train_mode'),
    (dict(kind='rnn'), 'kind'),
    (dict(correction='multiply'), 'correction'),
    (dict(block='mamba'), 'block'),
    (dict(dtype='int8'), 'dtype'),
    (dict(num_heads=4, num_kv_heads=3), 'num_kv_heads'),
    (dict(widht=64), 'widht'),
    (dict(kernel_layout='column_major'), 'kernel_layout'),
])
def test_bad_configs_raise_value_error_naming_the_field(overrides, field):
  with pytest.raises(ValueError, match=field):
    models.model_config(**overrides)


@pytest.mark.parametrize('kind', ['transformer', 'context_ready'])
@pytest.mark.parametrize('block', ['gpt', 'llama', 'moe'])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_weight_layouts_are_the_same_model(kind, block, dtype):
  """[out, in] 'weight' and [in, out] 'kernel' dense layers: the same initial values (the
  transpose of each other), the same logits, and the converter maps one tree onto the other."""
  rng = np.random.default_rng(len(kind) + len(block))
  width = int(rng.choice([16, 32, 48]))
  common = dict(kind=kind, block=block, vocab_size=int(rng.integers(20, 60)), width=width,
                depth=int(rng.integers(1, 3)), num_heads=4, max_len=16, dtype=dtype,
                num_kv_heads=2 if block == 'llama' else 0)
  tokens = random_tokens(int(rng.integers(100)), common['vocab_size'], batch=2, length=9)
  out = {}
  for layout in models.KERNEL_LAYOUTS:
    model = models.build(models.model_config(**common, kernel_layout=layout))
    variables = jax.jit(model.init)(jax.random.key(3), tokens)
    out[layout] = (variables, jax.jit(model.apply)(variables, tokens))
  (v_oi, y_oi), (v_io, y_io) = out['out_in'], out['in_out']
  leaves = lambda v: {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(v)}
  assert any(p.endswith("['weight']") for p in leaves(v_oi))
  assert not any(p.endswith("['kernel']") and 'router' in p for p in leaves(v_oi))
  converted = layers.to_kernel_layout(v_io, 'out_in')
  assert leaves(converted) == leaves(v_oi)
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                                          converted, v_oi)))
  back = layers.to_kernel_layout(v_oi, 'in_out')
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), back, v_io)))
  tol = 1e-5 if dtype == 'float32' else 0.05 * float(jnp.max(jnp.abs(y_io)))
  assert max_abs_diff(y_oi, y_io) <= tol


@pytest.mark.parametrize('layout', ['out_in', 'in_out'])
def test_bf16_dense_product_matches_the_plain_dot_and_its_gradients(layout):
  """`kernels.bf16_product` (float32-result products, explicit backward) gives the plain bf16
  dot's value and autodiff's gradients, for token axes of any rank and both weight layouts, and
  every product of its value-and-gradient keeps bfloat16 operands on XLA:CPU."""
  rng = np.random.default_rng(len(layout))
  d_in, d_out = int(rng.integers(8, 40)), int(rng.integers(8, 40))
  lead = tuple(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 4))))
  x = jnp.asarray(rng.standard_normal(lead + (d_in,)), jnp.bfloat16)
  shape = (d_out, d_in) if layout == 'out_in' else (d_in, d_out)
  matrix = jnp.asarray(rng.standard_normal(shape) / np.sqrt(d_in), jnp.bfloat16)
  cotangent = jnp.asarray(rng.standard_normal(lead + (d_out,)), jnp.float32)
  contract = 1 if layout == 'out_in' else 0

  def plain(x, m):  # the reference: float32 maths on the same bf16 inputs
    return jax.lax.dot_general(x.astype(jnp.float32), m.astype(jnp.float32),
                               (((x.ndim - 1,), (contract,)), ((), ())))

  def objective(fn):
    return lambda x, m: jnp.sum(fn(x, m).astype(jnp.float32) * cotangent)

  ours = jax.jit(lambda x, m: kernels.bf16_product(x, m, contract))
  y = ours(x, matrix)
  assert y.dtype == jnp.bfloat16 and y.shape == lead + (d_out,)
  scale = float(jnp.max(jnp.abs(plain(x, matrix))))
  assert max_abs_diff(y.astype(jnp.float32), plain(x, matrix)) <= 1e-2 * scale
  grads = jax.jit(jax.grad(objective(ours), argnums=(0, 1)))(x, matrix)
  expected = jax.grad(objective(plain), argnums=(0, 1))(x, matrix)
  for got, want, like in zip(grads, expected, (x, matrix)):
    assert got.dtype == like.dtype and got.shape == like.shape
    assert max_abs_diff(got.astype(jnp.float32), want) <= 2e-2 * float(jnp.max(jnp.abs(want)))
  # Through `layers.linear` (a float32 parameter cast to bf16, as a model does), same value.
  node = {'weight' if layout == 'out_in' else 'kernel': matrix.astype(jnp.float32)}
  assert jnp.array_equal(layers.linear(x, node, jnp.bfloat16), y)
  if jax.default_backend() == 'cpu':
    from ctr_jax.projects.perf import matmul_dtypes
    step = jax.jit(jax.value_and_grad(objective(ours), argnums=(0, 1)))
    counts = matmul_dtypes.dot_types(step.lower(x, matrix).compile().as_text())
    # The forward product and the input gradient multiply bf16 operands (the AMX-able form);
    # the plain dot's autodiff would run all three on upcast float32 operands.
    assert sum(n for (lhs, rhs, out, _), n in counts.items()
               if lhs == rhs == 'bf16' and out == 'f32') >= 2, counts


@pytest.mark.parametrize('rows', [2, 7, 32])
def test_few_rows_product_matches_the_plain_dot_and_keeps_the_weight_on_the_left(rows):
  """`kernels.few_rows_product` ((W x^T)^T, the small-batch decode form) gives x W^T and its
  gradients for token axes of any rank, `layers.linear` takes it for 2-32 float32 rows of an
  [out, in] weight on a CPU, and the compiled dot keeps the weight as its left operand (the
  form XLA:CPU's YNNPACK product streams; a folded transpose would put x there again)."""
  rng = np.random.default_rng(rows)
  d_in, d_out = int(rng.integers(8, 40)), int(rng.integers(8, 40))
  lead = (rows,) if rows % 2 else (2, rows // 2)
  x = jnp.asarray(rng.standard_normal(lead + (d_in,)), jnp.float32)
  weight = jnp.asarray(rng.standard_normal((d_out, d_in)) / np.sqrt(d_in), jnp.float32)
  cotangent = jnp.asarray(rng.standard_normal(lead + (d_out,)), jnp.float32)
  plain = lambda x, w: x @ w.T
  y = jax.jit(kernels.few_rows_product)(x, weight)
  assert y.shape == lead + (d_out,)
  np.testing.assert_allclose(y, plain(x, weight), rtol=1e-5, atol=1e-5)
  objective = lambda fn: lambda x, w: jnp.sum(fn(x, w) * cotangent)
  grads = jax.jit(jax.grad(objective(kernels.few_rows_product), argnums=(0, 1)))(x, weight)
  for got, want in zip(grads, jax.grad(objective(plain), argnums=(0, 1))(x, weight)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  bias = jnp.asarray(rng.standard_normal(d_out), jnp.float32)
  np.testing.assert_allclose(layers.linear(x, {'weight': weight, 'bias': bias}, jnp.float32),
                             plain(x, weight) + bias, rtol=1e-5, atol=1e-5)
  if jax.default_backend() == 'cpu':
    hlo = jax.jit(lambda x: layers.linear(x, {'weight': weight}, jnp.float32)).lower(
        x).compile().as_text()
    assert re.search(rf'f32\[{d_out},{rows}\]\S* (fusion|dot)\(', hlo), hlo
    wide = jnp.zeros((2 * kernels.FEW_ROWS[1], d_in))  # many rows: the plain [rows, out] dot
    hlo = jax.jit(lambda x: layers.linear(x, {'weight': weight}, jnp.float32)).lower(
        wide).compile().as_text()
    assert not re.search(rf'f32\[{d_out},{wide.shape[0]}\]', hlo)


def test_unknown_size_name_is_a_clear_error():
  with pytest.raises(ValueError, match='model.name'):
    models.model_config(name='huge')


@pytest.mark.parametrize('depth', [1, 3])
def test_zero_initialised_conversion_reproduces_the_transformer(depth):
  base_cfg, base, base_vars, tokens = random_model(11, kind='transformer', depth=depth)
  crt_cfg = models.model_config(**{**base_cfg.to_dict(), 'kind': 'context_ready'})
  crt = models.build(crt_cfg)
  crt_vars = convert.transformer_to_context_ready(base_vars, crt_cfg)
  expected = base.apply(base_vars, tokens)
  for k in (1, 3, tokens.shape[1] + 1):
    assert max_abs_diff(crt.apply(crt_vars, tokens, k_unroll=k), expected) <= 1e-5
  assert max_abs_diff(decode.sequential_logits(crt, crt_vars, tokens), expected) <= 1e-5
  n = crt_cfg.width
  assert models.count_params(crt_vars) - models.count_params(base_vars) == 8 * n * n + 7 * n
  # The correction really is trainable: its input layer is random, only the output is zero.
  assert float(jnp.abs(crt_vars['params']['correction']['ffn']['fc_in']['weight']).max()) > 0


def test_conversion_refuses_mismatched_sizes():
  base_cfg, _, base_vars, _ = random_model(12, kind='transformer', depth=2)
  wrong = models.model_config(**{**base_cfg.to_dict(), 'kind': 'context_ready', 'depth': 3})
  with pytest.raises(ValueError, match='depth'):
    convert.transformer_to_context_ready(base_vars, wrong)


@pytest.mark.parametrize('depth,grown', [(1, 2), (2, 4)])
def test_a_grown_transformer_computes_the_source_and_its_new_blocks_can_learn(depth, grown):
  """convert.grow_transformer: the source's blocks below pass-through ones (zero branch output
  projections) give the source's logits; the new blocks' other weights stay random, and their
  output projections get a gradient."""
  base_cfg, base, base_vars, tokens = random_model(14, kind='transformer', depth=depth)
  deep_cfg = models.model_config(**{**base_cfg.to_dict(), 'depth': grown})
  deep = models.build(deep_cfg)
  fresh = deep.init(jax.random.key(5), tokens)['params']
  params = convert.grow_transformer(base_vars['params'], fresh)
  expected = base.apply(base_vars, tokens)
  assert max_abs_diff(deep.apply({'params': params}, tokens), expected) <= 1e-5
  for i in range(depth):
    assert params['blocks'][f'block_{i}'] is base_vars['params']['blocks'][f'block_{i}']
  grads = jax.grad(lambda p: jnp.sum(deep.apply({'params': p}, tokens) ** 2))(params)
  for i in range(depth, grown):
    block = params['blocks'][f'block_{i}']
    assert not jnp.any(block['attn']['out']['weight']) and not jnp.any(block['mlp']['fc_out']['weight'])
    assert float(jnp.abs(block['attn']['query']['weight']).max()) > 0
    assert float(jnp.abs(grads['blocks'][f'block_{i}']['mlp']['fc_out']['weight']).max()) > 0
  with pytest.raises(ValueError, match='more blocks'):
    convert.grow_transformer(fresh, base_vars['params'])
  wide = models.model_config(**{**base_cfg.to_dict(), 'depth': grown, 'width': 2 * base_cfg.width})
  wide_fresh = models.build(wide).init(jax.random.key(5), tokens)['params']
  with pytest.raises(ValueError, match='width'):
    convert.grow_transformer(base_vars['params'], wide_fresh)


K_INVARIANT = {'add': True, 'token_blind': True, 'concat': True, 'none': True, 'tied': True}


@pytest.mark.parametrize('correction, cumulative', [
    ('add', False), ('token_blind', False), ('concat', False), ('none', False), ('tied', False),
    ('add', True)])
def test_ablation_variants_train_and_keep_or_break_k_invariance(correction, cumulative):
  cfg, model, variables, tokens = random_model(13, depth=2, correction=correction,
                                               cumulative=cumulative)
  t = tokens.shape[1]
  # One optimiser step lowers the loss on the batch.
  batch = random_tokens(14, cfg.vocab_size, batch=4, length=9)
  opt = optax.adam(1e-2)
  params = variables['params']
  loss_fn = jax.jit(lambda p: train_step.objective_loss(model, p, batch, losses.NextToken(), k_unroll=3)[0])
  loss0, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  updates, _ = opt.update(grads, opt.init(params), params)
  assert float(loss_fn(optax.apply_updates(params, updates))) < float(loss0)
  # K-invariance: once K >= T+1, more iterations change nothing (non-cumulative variants).
  at_t1 = model.apply(variables, tokens, k_unroll=t + 1)
  at_t4 = model.apply(variables, tokens, k_unroll=t + 4)
  if cumulative:
    assert max_abs_diff(at_t1, at_t4) > 1e-3
    with pytest.raises(ValueError, match='cumulative'):
      decode.sequential_logits(model, variables, tokens)
  else:
    assert max_abs_diff(at_t1, at_t4) <= 1e-4
    assert max_abs_diff(at_t1, decode.sequential_logits(model, variables, tokens)) <= 1e-4


@pytest.mark.slow
def test_remat_and_random_depth_give_the_same_function():
  cfg, model, variables, tokens = random_model(15, depth=2)
  batch = random_tokens(16, cfg.vocab_size, batch=2, length=7)

  def loss(p, remat):
    logits, aux = model.apply({'params': p}, batch[:, :-1], k_unroll=4, remat=remat,
                              return_aux=True)
    ce, _ = losses.next_token_loss(logits, batch[:, 1:])
    return ce + train_step.Recipe().convergence_weight * aux['convergence_loss']
  g1 = jax.grad(loss)(variables['params'], False)
  g2 = jax.grad(loss)(variables['params'], True)
  assert max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2))) < 1e-5
  # The call argument is what rematerialises: the backward pass recomputes the iterations.
  traced = lambda remat: str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(
      variables['params'], remat))
  assert 'remat' in traced(True) and 'remat' not in traced(False)
  # A transformer accepts and ignores it.
  t_cfg, t_model, t_vars, t_tokens = random_model(15, kind='transformer', depth=1)
  assert max_abs_diff(t_model.apply(t_vars, t_tokens, remat=True),
                      t_model.apply(t_vars, t_tokens)) == 0


def test_unroll_diagnostics_report_contraction():
  _, model, variables, _ = random_model(17, depth=2)
  tokens = random_tokens(17, model.spec.vocab_size, batch=2, length=16)
  report = diagnostics.unroll_diagnostics(model, variables, tokens, k_unroll=6)
  changes = np.array(report['change_max'])
  assert changes.shape == (6,) and np.all(changes >= 0)
  assert 0 < report['contraction_ratio'] < 1
  assert report['contraction_ratio'] == pytest.approx((changes[-1] / changes[0]) ** (1 / 5))
  # A zero-initialised correction never changes: the ratio is 0, the bound 0.
  base_cfg, _, base_vars, _ = random_model(18, kind='transformer', depth=1)
  crt_cfg = models.model_config(**{**base_cfg.to_dict(), 'kind': 'context_ready'})
  converted = convert.transformer_to_context_ready(base_vars, crt_cfg)
  flat = diagnostics.unroll_diagnostics(models.build(crt_cfg), converted,
                                        random_tokens(18, crt_cfg.vocab_size, 2, 5), k_unroll=4)
  assert flat['change_max'] == [0.0] * 4 and flat['error_bound'] == 0.0


@pytest.mark.parametrize('seed', range(2))
@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_decode_state_holds_two_c_per_layer_per_token(seed, kind):
  # Claim 10b: the KV cache grows by 2 x C x depth values per token (keys and values of every
  # layer); a context-ready model's recurrent state adds one C-vector, the same at any length.
  cfg, model, variables, tokens = random_model(seed, kind=kind)
  batch, prompt_len = tokens.shape
  for length in (prompt_len, 2 * prompt_len + 3):
    _, state = decode.prefill(model, variables, tokens, length)
    cached = sum(c['k'].size + c['v'].size for c in state.caches)
    assert cached == 2 * cfg.width * cfg.depth * batch * length
    if kind == 'context_ready':  # the z cache
      assert state.feedback.shape == (batch, cfg.width)
