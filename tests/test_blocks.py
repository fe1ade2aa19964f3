"""Block families: construction, decoding, parameter names and the family-specific pieces."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax import models
from ctr_jax.inference import decode
from ctr_jax.models import attention, blocks, families, layers
from helpers import FAMILY_OPTIONS, family_lm, max_abs_diff


def family_model(block, kind='transformer', **overrides):
  """A small model of `block` with its initial parameters (norm scales untouched)."""
  extra = {'gemma': dict(layer_types=('sliding_attention', 'full_attention')),
           'falcon': dict(parallel_norms=2, use_bias=True)}.get(block, {})
  return family_lm(block, kind=kind, norm_std=0.0, length=7, seed=3, **{**extra, **overrides})


# The context-ready wiring is family-independent; the Gemma case covers it.
@pytest.mark.parametrize('block, kind', [(b, 'transformer') for b in sorted(FAMILY_OPTIONS)] +
                         [('gemma', 'context_ready')])
def test_every_family_decodes_like_its_parallel_forward(block, kind):
  model, variables, tokens = family_model(block, kind)
  k = tokens.shape[1] + 1
  full = jax.jit(lambda v, t: model.apply(v, t, k_unroll=k))(variables, tokens)
  assert full.shape == (2, 7, 29) and bool(jnp.all(jnp.isfinite(full)))
  assert max_abs_diff(full, decode.sequential_logits(model, variables, tokens)) <= 1e-4


def test_gpt_block_keeps_its_parameter_names():
  model, variables, _ = family_model('gpt')
  paths = {jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_leaves_with_path(variables['params'])}
  block = "['blocks']['block_0']"
  expected = {f"{block}['{m}']['{l}']['{w}']" for m, l in
              [('attn', 'query'), ('attn', 'key'), ('attn', 'value'), ('attn', 'out'),
               ('mlp', 'fc_in'), ('mlp', 'fc_out')] for w in ('weight', 'bias')}
  expected |= {f"{block}['{n}']['{w}']" for n in ('ln_attn', 'ln_mlp') for w in ('scale', 'bias')}
  assert {p for p in paths if p.startswith(block)} == expected
  assert {p for p in paths if 'block_' not in p} == {
      "['embed']['embedding']", "['ln_f']['scale']", "['ln_f']['bias']", "['head']['weight']",
      "['head']['bias']"}


def test_a_new_family_is_one_traits_row_and_one_registered_class(monkeypatch):
  """A family that exists only in this test: Llama's block with LayerNorms, GeGLU-tanh, a head
  bias."""
  with pytest.raises(ValueError, match=r"model.block: got 'gated_ln', allowed \['gpt', "):
    models.model_config(block='gated_ln')
  monkeypatch.setitem(families.TRAITS, 'gated_ln', families.Traits(
      norm_kind='layer', default_activation='gelu_tanh', head_bias=True))
  monkeypatch.setitem(blocks.BLOCK_FAMILIES, 'gated_ln', blocks.LlamaBlock)
  model = models.build(models.model_config(
      kind='transformer', block='gated_ln', vocab_size=29, width=16, depth=2, num_heads=4,
      num_kv_heads=2, max_len=32))
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 29)
  variables = jax.jit(model.init)(jax.random.key(0), tokens)
  p = variables['params']
  # The traits, not the family's name, shape the model around the blocks.
  assert set(p['ln_f']) == {'scale', 'bias'} and set(p['head']) == {'weight', 'bias'}
  assert set(p['blocks']['block_0']['attn_norm']) == {'scale', 'bias'}
  assert layers.activation_name(model.spec) == 'gelu_tanh'
  assert layers.embed_scale(model.spec) == 1.0
  full = jax.jit(model.apply)(variables, tokens)
  assert max_abs_diff(full, decode.sequential_logits(model, variables, tokens)) <= 1e-4


def test_family_traits_reproduce_the_former_switches():
  traits = {name: (t.norm_kind, t.default_activation, t.scale_embeddings, t.head_bias,
                   t.routed_experts, t.learned_positions)
            for name, t in families.TRAITS.items()}
  assert traits == {'gpt': ('layer', 'gelu', False, True, False, True),
                    'gemma': ('rms_offset', 'gelu_tanh', True, False, False, False),
                    'llama': ('rms', 'silu', False, False, False, False),
                    'falcon': ('layer', 'gelu', False, False, False, False),
                    'moe': ('rms', 'silu', False, False, True, False)}
  with pytest.raises(ValueError, match='model.experts_per_token'):
    models.model_config(block='moe', num_experts=2, experts_per_token=3)
  with pytest.raises(ValueError, match=r"model.positions: 'learned' .*\['gpt'\]"):
    models.model_config(block='llama', positions='learned')
  assert models.BLOCKS == tuple(blocks.BLOCK_FAMILIES) == tuple(families.TRAITS)


def test_gemma_family_pieces():
  model, variables, tokens = family_model('gemma', tie_embeddings=True)
  p = variables['params']
  assert 'head' not in p  # tied
  block = p['blocks']['block_0']
  assert set(block) == {'attn_norm', 'attn', 'post_attn_norm', 'mlp_norm', 'mlp',
                        'post_mlp_norm'}
  assert set(block['attn']) == {'query', 'key', 'value', 'out', 'q_norm', 'k_norm'}
  assert block['attn']['key']['weight'].shape == (4, 16)  # one KV head of Dh = 4, [out, in]
  assert float(jnp.abs(block['post_mlp_norm']['scale']).max()) == 0.0  # (1 + w), w = 0
  pieces = jax.jit(lambda v, t: model.apply(v, t, method=lambda m, t: (
      m.embed_tokens(t, True), m.ln_f(m.blocks(m.embed_tokens(t, True),
                                               jnp.arange(t.shape[1]))[0]))))
  e, final = pieces(variables, tokens)
  table = p['embed']['embedding'][tokens]
  np.testing.assert_allclose(e, table * jnp.float32(4.0), rtol=1e-6)  # sqrt(16)
  logits = jax.jit(model.apply)(variables, tokens)
  assert max_abs_diff(logits, final @ p['embed']['embedding'].T) <= 1e-5


def test_sliding_layer_sees_only_its_window():
  model, variables, tokens = family_model('gemma', depth=1, layer_types=('sliding_attention',))
  changed = tokens.at[:, 0].set((tokens[:, 0] + 1) % 29)
  apply = jax.jit(model.apply)
  diff = np.abs(np.asarray(apply(variables, tokens) - apply(variables, changed)))
  per_position = diff.max(axis=(0, 2))
  assert np.all(per_position[:3] > 0) and np.all(per_position[3:] == 0)  # window 3


def test_rms_norm_conventions():
  spec = models.spec_of(models.model_config(block='gemma', layer_norm_eps=0.0))
  x = jax.random.normal(jax.random.key(1), (3, 8))
  w = 0.5 * jax.random.normal(jax.random.key(2), (8,))
  normed = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True))
  for offset, scale in ((True, 1 + w), (False, w)):
    y = layers.RMSNorm(spec, offset=offset).apply({'params': {'scale': w}}, x)
    np.testing.assert_allclose(y, normed * scale, rtol=1e-5, atol=1e-6)


def test_rope_linear_factor_divides_positions():
  x = jax.random.normal(jax.random.key(3), (1, 4, 2, 8))
  pos = jnp.arange(4)
  np.testing.assert_allclose(attention.rope(x, 2 * pos, 100.0, factor=2.0),
                             attention.rope(x, pos, 100.0), rtol=1e-5, atol=1e-6)


def test_integer_rope_spins_pair_j_by_j_radians_per_position():
  x = jax.random.normal(jax.random.key(5), (1, 3, 1, 8))
  pos = jnp.array([0, 1, 5])
  y = np.asarray(attention.rope(x, pos, 1.0, integer=True))
  xc = np.asarray(x[..., :4]) + 1j * np.asarray(x[..., 4:])   # pair (j, j + 4) as a complex
  expected = xc * np.exp(1j * np.asarray(pos)[None, :, None, None] * np.arange(4))
  np.testing.assert_allclose(y[..., :4] + 1j * y[..., 4:], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_layer_norm_matches_flax_in_value_and_gradient(dtype):
  """`ctr_jax.models.layer_norm` (hand-written backward) against Flax's LayerNorm on random
  sizes and token ranks, inputs with a large mean included: outputs, and gradients for the
  input, scale and bias."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(11 if dtype == jnp.float32 else 12)
  width = int(rng.integers(3, 70))
  lead = tuple(int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 4))))
  spec = models.spec_of(models.model_config(dtype='float32' if dtype == jnp.float32
                                            else 'bfloat16', layer_norm_eps=1e-5))
  x = jnp.asarray(rng.standard_normal(lead + (width,)) * 3 + 5, dtype)
  params = {'scale': jnp.asarray(1 + 0.3 * rng.standard_normal(width), jnp.float32),
            'bias': jnp.asarray(0.3 * rng.standard_normal(width), jnp.float32)}
  ours = layers.layer_norm(spec)
  theirs = nn.LayerNorm(epsilon=1e-5, dtype=dtype, param_dtype=jnp.float32)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(ours.apply({'params': params}, x), np.float32),
                             np.asarray(theirs.apply({'params': params}, x), np.float32),
                             rtol=tol, atol=tol)
  cotangent = jnp.asarray(rng.standard_normal(lead + (width,)), jnp.float32)
  def grads(module):
    loss = lambda p, x: jnp.sum(module.apply({'params': p}, x).astype(jnp.float32) * cotangent)
    return jax.grad(loss, argnums=(0, 1))(params, x.astype(jnp.float32))
  for got, want in zip(jax.tree.leaves(grads(ours)), jax.tree.leaves(grads(theirs))):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert ours.apply({'params': params}, x).dtype == dtype


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_rope_matches_the_complex_rotation_and_computes_its_tables_once(dtype):
  """RoPE on random sizes equals the rotation of pair (j, j + Dh/2) as a complex number by
  position * base^(-2j/Dh), in value and gradient; on a CPU the compiled rotation reads its
  sin/cos tables instead of recomputing them per head and batch row (no fusion bigger than a
  table evaluates sin or cos: `kernels.rotation_table`)."""
  rng = np.random.default_rng(7)
  b, t, h, half = (int(n) for n in rng.integers(2, 6, size=4))
  x = jnp.asarray(rng.standard_normal((b, t, h, 2 * half)), dtype)
  pos = jnp.asarray(rng.integers(0, 50, size=(b, t)))
  base = 100.0
  y = np.asarray(jax.jit(attention.rope, static_argnums=2)(x, pos, base), np.float64)
  xf = np.asarray(x, np.float64)
  angles = np.asarray(pos)[..., None, None] * base ** (-np.arange(half) / half)
  expected = (xf[..., :half] + 1j * xf[..., half:]) * np.exp(1j * angles)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(y[..., :half] + 1j * y[..., half:], expected, rtol=tol, atol=tol)
  # The rotation is orthogonal, so the gradient of <rope(x), c> is the inverse rotation of c.
  c = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
  grad = jax.grad(lambda x: jnp.sum(attention.rope(x, pos, base).astype(jnp.float32) * c))(
      x.astype(jnp.float32))
  cf = np.asarray(c, np.float64)
  back = (cf[..., :half] + 1j * cf[..., half:]) * np.exp(-1j * angles)
  np.testing.assert_allclose(grad[..., :half] + 1j * grad[..., half:], back, rtol=1e-5,
                             atol=1e-5)
  if jax.default_backend() == 'cpu':
    hlo = jax.jit(attention.rope, static_argnums=2).lower(x, pos, base).compile().as_text()
    headers = [c.split('\n')[0] for c in re.split(r'\n(?=\S)', hlo)
               if re.search(r' (sine|cosine)\(', c) and not c.startswith('ENTRY')]
    assert headers, hlo
    rotated = f'[{b},{t},{h},{2 * half}]'
    assert not [head for head in headers if rotated in head.split('->')[-1]], headers


@pytest.mark.parametrize('positions, depth', [('rope_integer', 1), ('none', 2)])
def test_position_variant_decodes_like_its_parallel_forward(positions, depth):
  cfg = models.model_config(kind='context_ready', vocab_size=13, width=16, depth=depth,
                            num_heads=2, max_len=8, positions=positions)
  model = models.build(cfg)
  tokens = jax.random.randint(jax.random.key(6), (2, 6), 0, 13)
  variables = model.init(jax.random.key(7), tokens)
  full = model.apply(variables, tokens, k_unroll=7)
  assert max_abs_diff(full, decode.sequential_logits(model, variables, tokens)) <= 1e-4
  ladder = models.build(models.model_config(**{**cfg.to_dict(), 'positions': 'rope'}))
  assert max_abs_diff(full, ladder.apply(variables, tokens, k_unroll=7)) > 1e-3


def test_no_positions_one_layer_reads_its_prefix_as_a_set():
  # positions='none' (the author's no-RoPE pointer-chasing option): with the causal mask as the
  # only order signal, a 1-layer transformer's last output is a function of the multiset of the
  # earlier tokens, so reordering them changes nothing there; with RoPE it does.
  cfg = models.model_config(kind='transformer', vocab_size=11, width=16, depth=1, num_heads=2,
                            max_len=8, positions='none')
  model = models.build(cfg)
  tokens = jnp.array([[3, 7, 1, 9, 4]])
  shuffled = jnp.array([[1, 9, 7, 3, 4]])
  variables = model.init(jax.random.key(8), tokens)
  last = lambda m, t: m.apply(variables, t)[0, -1]
  assert max_abs_diff(last(model, tokens), last(model, shuffled)) <= 1e-5
  rope = models.build(models.model_config(**{**cfg.to_dict(), 'positions': 'rope'}))
  assert max_abs_diff(last(rope, tokens), last(rope, shuffled)) > 1e-4


def test_moe_routing_is_mixtral_top_k():
  logits = jax.random.normal(jax.random.key(4), (5, 6))
  gates = np.asarray(layers.moe_gates(logits, 2))
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  for row, g in zip(probs, gates):
    top = np.argsort(row)[-2:]
    expected = np.zeros(6)
    expected[top] = row[top] / row[top].sum()
    np.testing.assert_allclose(g, expected, rtol=1e-6)


@pytest.mark.parametrize('overrides, field', [
    (dict(positions='alibi'), 'positions'),
    (dict(activation='tanh'), 'activation'),
    (dict(depth=2, layer_types=('full_attention',)), 'layer_types'),
    (dict(depth=1, layer_types=('local',)), 'layer_types'),
    (dict(parallel_norms=3), 'parallel_norms'),
    (dict(rope_scaling_factor=0.0), 'rope_scaling_factor'),
    (dict(block='llama', positions='learned'), 'positions'),
])
def test_new_fields_are_validated(overrides, field):
  with pytest.raises(ValueError, match=field):
    models.model_config(**overrides)
