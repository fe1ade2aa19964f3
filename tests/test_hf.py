"""Hugging Face checkpoints: tiny checkpoints in the exact HF layout, checked against numpy.

Each test writes random weights under the Hugging Face tensor names (torch Linear layout
[out, in]; GPT-2's Conv1D [in, out]; Falcon's fused query_key_value) with a config.json, loads
them with `hf.load`, and compares the logits with an independent float64 numpy forward written
here from the transformers modeling files (no model code reused).
"""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from ctr_jax import implicit, pretrained
from ctr_jax.pretrained import hf

VOCAB, WIDTH, TOKENS = 23, 16, np.array([[3, 7, 1, 19, 4, 4, 11, 2, 9, 0]])


# ------------------------------------------------------------------------------------------------
# Numpy reference pieces (float64).
# ------------------------------------------------------------------------------------------------


def rms_norm(x, w, eps, gemma):
  normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
  return normed * (1.0 + w) if gemma else normed * w


def layer_norm(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def gelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
  return x / (1.0 + np.exp(-x))


def rotary(x, theta, factor=1.0):
  """HF apply_rotary_pos_emb on x [T, heads, D] at positions 0..T-1 (rotate_half pairing)."""
  t, _, d = x.shape
  inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d) / factor
  angles = np.arange(t)[:, None] * inv_freq
  emb = np.concatenate([angles, angles], -1)[:, None, :]
  rotated = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1)
  return x * np.cos(emb) + rotated * np.sin(emb)


def attention(q, k, v, scale, window=None):
  """q [T, H, D], k/v [T, G, D]; query head h reads kv head h // (H/G) (repeat_kv)."""
  t, heads, _ = q.shape
  group = heads // k.shape[1]
  out = np.zeros_like(q)
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  allowed = (j <= i) & ((i - j < window) if window else True)
  for h in range(heads):
    scores = q[:, h] @ k[:, h // group].T * scale
    scores = np.where(allowed, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
  return out.reshape(t, -1)


def lin(x, w, b=None):
  return x @ w.T + (0 if b is None else b)


# ------------------------------------------------------------------------------------------------
# Checkpoint writers.
# ------------------------------------------------------------------------------------------------


def write(directory, config, tensors, shards=1):
  directory.mkdir(exist_ok=True)
  (directory / 'config.json').write_text(json.dumps(config))
  tensors = {k: np.asarray(v, np.float32) for k, v in tensors.items()}
  if shards == 1:
    safetensors_numpy.save_file(tensors, str(directory / 'model.safetensors'))
    return
  names = sorted(tensors)
  weight_map = {}
  for s in range(shards):
    file = f'model-{s + 1:05d}-of-{shards:05d}.safetensors'
    part = {n: tensors[n] for n in names[s::shards]}
    safetensors_numpy.save_file(part, str(directory / file))
    weight_map.update({n: file for n in part})
  (directory / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': weight_map}))


class Weights:
  """Random float32-representable weights, kept in float64 for the reference."""

  def __init__(self, seed):
    self.rng = np.random.default_rng(seed)
    self.tensors = {}

  def __call__(self, name, *shape, scale=0.3, offset=0.0):
    value = (offset + scale * self.rng.normal(size=shape)).astype(np.float32).astype(np.float64)
    self.tensors[name] = value
    return value


def load_logits(directory):
  model, variables = pretrained.load(directory)  # the public loader (a directory: `hf.load`)
  return model, variables, np.asarray(jax.jit(model.apply)(variables, jnp.asarray(TOKENS))[0])


def assert_close(got, want):
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ------------------------------------------------------------------------------------------------
# Gemma 3.
# ------------------------------------------------------------------------------------------------

GEMMA = dict(heads=4, kv_heads=1, head_dim=8, ff=24, layers=3, window=3, qpas=12.0, eps=1e-6)


def gemma_weights(seed):
  w, g = Weights(seed), GEMMA
  w('model.embed_tokens.weight', VOCAB, WIDTH, scale=0.5)
  w('model.norm.weight', WIDTH)
  for i in range(g['layers']):
    p = f'model.layers.{i}.'
    for norm in ('input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm',
                 'post_feedforward_layernorm'):
      w(p + norm + '.weight', WIDTH)
    w(p + 'self_attn.q_proj.weight', g['heads'] * g['head_dim'], WIDTH)
    w(p + 'self_attn.k_proj.weight', g['kv_heads'] * g['head_dim'], WIDTH)
    w(p + 'self_attn.v_proj.weight', g['kv_heads'] * g['head_dim'], WIDTH)
    w(p + 'self_attn.o_proj.weight', WIDTH, g['heads'] * g['head_dim'])
    w(p + 'self_attn.q_norm.weight', g['head_dim'])
    w(p + 'self_attn.k_norm.weight', g['head_dim'])
    w(p + 'mlp.gate_proj.weight', g['ff'], WIDTH)
    w(p + 'mlp.up_proj.weight', g['ff'], WIDTH)
    w(p + 'mlp.down_proj.weight', WIDTH, g['ff'])
  return w.tensors


def gemma_reference(t, layer_types, local_theta, global_theta, global_factor):
  g = GEMMA
  h = t['model.embed_tokens.weight'][TOKENS[0]] * np.float32(math.sqrt(WIDTH))
  norm = lambda x, name: rms_norm(x, t[name + '.weight'], g['eps'], gemma=True)
  for i, kind in enumerate(layer_types):
    p = f'model.layers.{i}.'
    x = norm(h, p + 'input_layernorm')
    q = lin(x, t[p + 'self_attn.q_proj.weight']).reshape(len(x), g['heads'], g['head_dim'])
    k = lin(x, t[p + 'self_attn.k_proj.weight']).reshape(len(x), g['kv_heads'], g['head_dim'])
    v = lin(x, t[p + 'self_attn.v_proj.weight']).reshape(len(x), g['kv_heads'], g['head_dim'])
    q, k = norm(q, p + 'self_attn.q_norm'), norm(k, p + 'self_attn.k_norm')
    sliding = kind == 'sliding_attention'
    theta, factor = (local_theta, 1.0) if sliding else (global_theta, global_factor)
    q, k = rotary(q, theta, factor), rotary(k, theta, factor)
    a = attention(q, k, v, g['qpas'] ** -0.5, g['window'] if sliding else None)
    h = h + norm(lin(a, t[p + 'self_attn.o_proj.weight']), p + 'post_attention_layernorm')
    x = norm(h, p + 'pre_feedforward_layernorm')
    m = gelu_tanh(lin(x, t[p + 'mlp.gate_proj.weight'])) * lin(x, t[p + 'mlp.up_proj.weight'])
    h = h + norm(lin(m, t[p + 'mlp.down_proj.weight']), p + 'post_feedforward_layernorm')
  return norm(h, 'model.norm') @ t['model.embed_tokens.weight'].T


def gemma_config(**extra):
  g = GEMMA
  return dict(architectures=['Gemma3ForCausalLM'], model_type='gemma3_text', vocab_size=VOCAB,
              hidden_size=WIDTH, intermediate_size=g['ff'], num_hidden_layers=g['layers'],
              num_attention_heads=g['heads'], num_key_value_heads=g['kv_heads'],
              head_dim=g['head_dim'], rms_norm_eps=g['eps'], sliding_window=g['window'],
              query_pre_attn_scalar=g['qpas'], hidden_activation='gelu_pytorch_tanh',
              final_logit_softcapping=None, attn_logit_softcapping=None,
              max_position_embeddings=64, **extra)


def test_gemma3_old_config_format(tmp_path):
  # rope_theta / rope_local_base_freq and the 5:1-style pattern (here every 2nd layer global).
  t = gemma_weights(0)
  write(tmp_path / 'g', gemma_config(rope_theta=1000.0, rope_local_base_freq=10.0,
                                     rope_scaling=None, sliding_window_pattern=2), t)
  model, variables, logits = load_logits(tmp_path / 'g')
  types = ['sliding_attention', 'full_attention', 'sliding_attention']
  assert model.spec.layer_types == tuple(types)
  assert_close(logits, gemma_reference(t, types, 10.0, 1000.0, 1.0))
  # The paper's experiment runs on the loaded model as is.
  tokens = jnp.asarray(TOKENS)
  patch = implicit.compute_patch(model, variables, tokens[:, :-1], tokens[:, -1:],
                                 method='stable')
  patched = implicit.patched_forward(model, variables, patch, tokens[:, -1:], TOKENS.shape[1] - 1)
  assert_close(np.asarray(patched[0, -1]), logits[-1])


def test_gemma3_rope_parameters_format_sharded(tmp_path):
  t = gemma_weights(1)
  types = ['full_attention', 'sliding_attention', 'sliding_attention']
  rope = {'full_attention': {'rope_type': 'linear', 'factor': 4.0, 'rope_theta': 500.0},
          'sliding_attention': {'rope_type': 'default', 'rope_theta': 20.0}}
  write(tmp_path / 'g', gemma_config(layer_types=types, rope_parameters=rope), t, shards=3)
  _, _, logits = load_logits(tmp_path / 'g')
  assert_close(logits, gemma_reference(t, types, 20.0, 500.0, 4.0))


# ------------------------------------------------------------------------------------------------
# Llama.
# ------------------------------------------------------------------------------------------------


def test_llama_grouped_query_untied(tmp_path):
  w = Weights(2)
  heads, kv, dim, ff, eps = 4, 2, 4, 20, 1e-5
  w('model.embed_tokens.weight', VOCAB, WIDTH, scale=0.5)
  w('model.norm.weight', WIDTH, offset=1.0)
  w('lm_head.weight', VOCAB, WIDTH)
  for i in range(2):
    p = f'model.layers.{i}.'
    w(p + 'input_layernorm.weight', WIDTH, offset=1.0)
    w(p + 'post_attention_layernorm.weight', WIDTH, offset=1.0)
    for name, rows in (('q', heads * dim), ('k', kv * dim), ('v', kv * dim)):
      w(p + f'self_attn.{name}_proj.weight', rows, WIDTH)
    w(p + 'self_attn.o_proj.weight', WIDTH, heads * dim)
    w(p + 'mlp.gate_proj.weight', ff, WIDTH)
    w(p + 'mlp.up_proj.weight', ff, WIDTH)
    w(p + 'mlp.down_proj.weight', WIDTH, ff)
  t = w.tensors
  config = dict(architectures=['LlamaForCausalLM'], model_type='llama', vocab_size=VOCAB,
                hidden_size=WIDTH, intermediate_size=ff, num_hidden_layers=2,
                num_attention_heads=heads, num_key_value_heads=kv, rms_norm_eps=eps,
                rope_parameters={'rope_type': 'default', 'rope_theta': 50.0},
                hidden_act='silu', tie_word_embeddings=False, max_position_embeddings=64)
  write(tmp_path / 'l', config, t)
  _, _, logits = load_logits(tmp_path / 'l')

  h = t['model.embed_tokens.weight'][TOKENS[0]]
  norm = lambda x, name: rms_norm(x, t[name + '.weight'], eps, gemma=False)
  for i in range(2):
    p = f'model.layers.{i}.'
    x = norm(h, p + 'input_layernorm')
    q = lin(x, t[p + 'self_attn.q_proj.weight']).reshape(len(x), heads, dim)
    k = lin(x, t[p + 'self_attn.k_proj.weight']).reshape(len(x), kv, dim)
    v = lin(x, t[p + 'self_attn.v_proj.weight']).reshape(len(x), kv, dim)
    a = attention(rotary(q, 50.0), rotary(k, 50.0), v, dim ** -0.5)
    h = h + lin(a, t[p + 'self_attn.o_proj.weight'])
    x = norm(h, p + 'post_attention_layernorm')
    m = silu(lin(x, t[p + 'mlp.gate_proj.weight'])) * lin(x, t[p + 'mlp.up_proj.weight'])
    h = h + lin(m, t[p + 'mlp.down_proj.weight'])
  assert_close(logits, norm(h, 'model.norm') @ t['lm_head.weight'].T)


# ------------------------------------------------------------------------------------------------
# Falcon: three fused query_key_value layouts.
# ------------------------------------------------------------------------------------------------


def split_fused(qkv, layout, heads, kv, dim):
  """modeling_falcon's _split_heads on [T, rows] -> q [T, H, D], k/v [T, G, D]."""
  t = len(qkv)
  if layout == 'new':
    grouped = qkv.reshape(t, kv, heads // kv + 2, dim)
    return (grouped[:, :, :-2].reshape(t, heads, dim), grouped[:, :, -2], grouped[:, :, -1])
  if layout == 'multi_query':
    grouped = qkv.reshape(t, heads + 2, dim)
    return grouped[:, :-2], grouped[:, [-2]], grouped[:, [-1]]
  grouped = qkv.reshape(t, heads, 3, dim)
  return grouped[..., 0, :], grouped[..., 1, :], grouped[..., 2, :]


@pytest.mark.parametrize('layout, kv, bias', [('new', 2, False), ('multi_query', 1, False),
                                             ('multi_head', 4, True)])
def test_falcon_fused_layouts(tmp_path, layout, kv, bias):
  w = Weights(3)
  heads, dim, ff, eps = 4, 4, 24, 1e-5
  two_norms = layout == 'new'
  rows = (heads + 2 * kv) * dim
  w('transformer.word_embeddings.weight', VOCAB, WIDTH, scale=0.5)
  w('transformer.ln_f.weight', WIDTH, offset=1.0)
  w('transformer.ln_f.bias', WIDTH)
  for i in range(2):
    p = f'transformer.h.{i}.'
    for norm in (('ln_attn', 'ln_mlp') if two_norms else ('input_layernorm',)):
      w(p + norm + '.weight', WIDTH, offset=1.0)
      w(p + norm + '.bias', WIDTH)
    for name, shape in (('self_attention.query_key_value', (rows, WIDTH)),
                        ('self_attention.dense', (WIDTH, WIDTH)),
                        ('mlp.dense_h_to_4h', (ff, WIDTH)), ('mlp.dense_4h_to_h', (WIDTH, ff))):
      w(p + name + '.weight', *shape)
      if bias:
        w(p + name + '.bias', shape[0])
  t = w.tensors
  config = dict(architectures=['FalconForCausalLM'], model_type='falcon', vocab_size=VOCAB,
                hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=heads,
                num_kv_heads=kv, new_decoder_architecture=layout == 'new',
                multi_query=layout == 'multi_query', parallel_attn=True, alibi=False,
                bias=bias, layer_norm_epsilon=eps, ffn_hidden_size=ff, rope_theta=30.0,
                activation='gelu', max_position_embeddings=64)
  write(tmp_path / 'f', config, t)
  _, _, logits = load_logits(tmp_path / 'f')

  get_b = lambda name: t.get(name + '.bias') if bias else None
  h = t['transformer.word_embeddings.weight'][TOKENS[0]]
  ln = lambda x, name: layer_norm(x, t[name + '.weight'], t[name + '.bias'], eps)
  for i in range(2):
    p = f'transformer.h.{i}.'
    x_attn = ln(h, p + ('ln_attn' if two_norms else 'input_layernorm'))
    x_mlp = ln(h, p + 'ln_mlp') if two_norms else x_attn
    name = p + 'self_attention.query_key_value'
    q, k, v = split_fused(lin(x_attn, t[name + '.weight'], get_b(name)), layout, heads, kv, dim)
    a = attention(rotary(q, 30.0), rotary(k, 30.0), v, dim ** -0.5)
    name = p + 'self_attention.dense'
    attn_out = lin(a, t[name + '.weight'], get_b(name))
    up, down = p + 'mlp.dense_h_to_4h', p + 'mlp.dense_4h_to_h'
    mlp_out = lin(gelu(lin(x_mlp, t[up + '.weight'], get_b(up))), t[down + '.weight'],
                  get_b(down))
    h = h + attn_out + mlp_out
  assert_close(logits, ln(h, 'transformer.ln_f') @ t['transformer.word_embeddings.weight'].T)


# ------------------------------------------------------------------------------------------------
# GPT-2.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('prefix', ['transformer.', ''])
def test_gpt2_learned_positions_and_conv1d(tmp_path, prefix):
  w = Weights(4)
  heads, eps = 4, 1e-5
  dim = WIDTH // heads
  w(prefix + 'wte.weight', VOCAB, WIDTH, scale=0.5)
  w(prefix + 'wpe.weight', 16, WIDTH, scale=0.5)
  w(prefix + 'ln_f.weight', WIDTH, offset=1.0)
  w(prefix + 'ln_f.bias', WIDTH)
  for i in range(2):
    p = f'{prefix}h.{i}.'
    for norm in ('ln_1', 'ln_2'):
      w(p + norm + '.weight', WIDTH, offset=1.0)
      w(p + norm + '.bias', WIDTH)
    for name, shape in (('attn.c_attn', (WIDTH, 3 * WIDTH)), ('attn.c_proj', (WIDTH, WIDTH)),
                        ('mlp.c_fc', (WIDTH, 4 * WIDTH)), ('mlp.c_proj', (4 * WIDTH, WIDTH))):
      w(p + name + '.weight', *shape)  # Conv1D: [in, out]
      w(p + name + '.bias', shape[1])
  t = dict(w.tensors)
  t[f'{prefix}h.0.attn.bias'] = np.tril(np.ones((16, 16)))[None, None]  # old causal buffer
  config = dict(architectures=['GPT2LMHeadModel'], model_type='gpt2', vocab_size=VOCAB,
                n_embd=WIDTH, n_layer=2, n_head=heads, n_positions=16, n_inner=None,
                activation_function='gelu_new', layer_norm_epsilon=eps)
  write(tmp_path / 'gpt2', config, t)
  _, _, logits = load_logits(tmp_path / 'gpt2')

  n = len(TOKENS[0])
  h = t[prefix + 'wte.weight'][TOKENS[0]] + t[prefix + 'wpe.weight'][np.arange(n)]
  ln = lambda x, name: layer_norm(x, t[name + '.weight'], t[name + '.bias'], eps)
  conv = lambda x, name: x @ t[name + '.weight'] + t[name + '.bias']
  for i in range(2):
    p = f'{prefix}h.{i}.'
    qkv = conv(ln(h, p + 'ln_1'), p + 'attn.c_attn')
    q, k, v = (qkv[:, j * WIDTH:(j + 1) * WIDTH].reshape(n, heads, dim) for j in range(3))
    h = h + conv(attention(q, k, v, dim ** -0.5), p + 'attn.c_proj')
    h = h + conv(gelu_tanh(conv(ln(h, p + 'ln_2'), p + 'mlp.c_fc')), p + 'mlp.c_proj')
  assert_close(logits, ln(h, prefix + 'ln_f') @ t[prefix + 'wte.weight'].T)


# ------------------------------------------------------------------------------------------------
# Refusals.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('change, match', [
    (dict(final_logit_softcapping=30.0), 'final_logit_softcapping'),
    (dict(rope_scaling={'rope_type': 'yarn', 'factor': 2.0}), "'yarn'"),
    (dict(model_type='gemma3'), 'multimodal'),
    (dict(model_type='bert'), "'bert'"),
])
def test_unsupported_options_are_refused(tmp_path, change, match):
  config = {**gemma_config(rope_theta=1000.0, rope_local_base_freq=10.0), **change}
  write(tmp_path / 'x', config, gemma_weights(5))
  with pytest.raises(ValueError, match=match):
    hf.load(tmp_path / 'x')


def test_falcon_alibi_and_unknown_tensors_are_refused(tmp_path):
  config = dict(model_type='falcon', vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=1,
                num_attention_heads=4, alibi=True)
  with pytest.raises(ValueError, match='alibi'):
    hf.model_config_from_hf(config)
  t = gemma_weights(6)
  t['model.layers.0.mystery.weight'] = np.zeros(3)
  write(tmp_path / 'g', gemma_config(rope_theta=1000.0, rope_local_base_freq=10.0), t)
  with pytest.raises(ValueError, match='mystery'):
    hf.load(tmp_path / 'g')
