"""Hugging Face checkpoints as ctr_jax models, read with numpy safetensors (no torch).

    from ctr_jax import hf
    model, variables = hf.load('/path/to/gemma-3-1b-it')
    logits = model.apply(variables, tokens)        # the checkpoint's logits, float32

A checkpoint directory holds `config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json`). Supported architectures and what they map to:

  Gemma3ForCausalLM (gemma3_text)  block='gemma': pre/post RMSNorm (1 + w), GeGLU-tanh, QK-norm,
      grouped-query attention, sliding/full layers (`layer_types`, or the older
      `sliding_window_pattern`) with their own RoPE bases, query_pre_attn_scalar, sqrt(d)
      embedding scale, tied head.
  LlamaForCausalLM (llama), MistralForCausalLM (mistral)  block='llama'.
  FalconForCausalLM (falcon; RefinedWeb* aliases)  block='falcon': parallel attention + MLP,
      fused query_key_value in all three layouts (multi-head, multi-query, grouped
      "new decoder architecture"), one or two input LayerNorms.
  GPT2LMHeadModel (gpt2)  block='gpt' with learned absolute positions, GELU-tanh, tied head;
      Conv1D weights are already [in, out].

RoPE settings are read from `rope_theta` / `rope_local_base_freq` / `rope_scaling` or from the
newer `rope_parameters` (per layer type for Gemma 3). Options without an exact equivalent here
(ALiBi, logit soft-capping, non-linear RoPE scaling, biased Llama projections, ...) raise
ValueError instead of loading a model that would silently differ.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import hf_checks
from ctr_jax import models
from ctr_jax.models import layers

__all__ = ['load', 'model_config_from_hf', 'read_config', 'read_tensors', 'convert_params',
           'load_tokenizer']

_ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh',
                'gelu_fast': 'gelu_tanh', 'gelu_tanh': 'gelu_tanh', 'silu': 'silu',
                'swish': 'silu', 'relu': 'relu'}
_FAMILY = {'gemma3_text': 'gemma3', 'llama': 'llama', 'mistral': 'llama', 'falcon': 'falcon',
           'RefinedWebModel': 'falcon', 'RefinedWeb': 'falcon', 'gpt2': 'gpt2'}
# Buffers some checkpoints carry that are not parameters.
_IGNORED_SUFFIXES = ('rotary_emb.inv_freq', '.attn.bias', '.attn.masked_bias')


def read_config(directory) -> dict:
  path = os.path.join(os.fspath(directory), 'config.json')
  if not os.path.exists(path):
    raise ValueError(f'{directory} has no config.json; expected a Hugging Face checkpoint '
                     'directory')
  return hf_checks.read_config(path)


def read_tensors(directory) -> dict[str, np.ndarray]:
  """Every tensor of model.safetensors, or of all shards named by its index file."""
  directory = os.fspath(directory)
  index = os.path.join(directory, 'model.safetensors.index.json')
  single = os.path.join(directory, 'model.safetensors')
  if os.path.exists(index):
    files = hf_checks.shard_files(directory, index)
  elif os.path.exists(single):
    files = ['model.safetensors']
  else:
    raise ValueError(f'{directory} has neither model.safetensors nor '
                     'model.safetensors.index.json')
  tensors = {}
  for name in files:
    tensors.update(hf_checks.load_safetensors(directory, name))
  return tensors


def load_tokenizer(directory):
  """The checkpoint's `tokenizers.Tokenizer` (from tokenizer.json), or None if it has none."""
  path = os.path.join(os.fspath(directory), 'tokenizer.json')
  if not os.path.exists(path):
    return None
  return hf_checks.read_tokenizer(path)


def _refuse(ok: bool, message: str):
  if not ok:
    raise ValueError(f'unsupported checkpoint option: {message}')


def _family(hf: dict) -> str:
  model_type = hf.get('model_type', '')
  if model_type == 'gemma3':
    raise ValueError("model_type 'gemma3' is the multimodal Gemma3ForConditionalGeneration; "
                     'load a text-only Gemma3ForCausalLM (model_type gemma3_text) checkpoint')
  if model_type not in _FAMILY:
    raise ValueError(f'model_type {model_type!r} is not supported; supported: '
                     f'{sorted(_FAMILY)}')
  return _FAMILY[model_type]


def _first(hf: dict, *names, default=None):
  for name in names:
    if hf.get(name) is not None:
      return hf[name]
  return default


def _activation(name: str) -> str:
  _refuse(name in _ACTIVATIONS, f'activation {name!r}; supported: {sorted(_ACTIVATIONS)}')
  return _ACTIVATIONS[name]


def _rope(params: dict | None, theta_default: float, where: str) -> tuple[float, float]:
  """(base, linear factor) from one rope_parameters / rope_scaling dict."""
  params = params or {}
  kind = params.get('rope_type', params.get('type', 'default'))
  _refuse(kind in ('default', 'linear'),
          f"{where} rope type {kind!r}; only 'default' and 'linear' have an exact equivalent")
  factor = float(params.get('factor', 1.0)) if kind == 'linear' else 1.0
  return float(params.get('rope_theta', theta_default)), factor


def _single_rope(hf: dict) -> tuple[float, float]:
  """RoPE of models with one kind of layer (Llama, Falcon)."""
  if hf.get('rope_parameters'):
    return _rope(hf['rope_parameters'], hf.get('rope_theta', 10000.0), 'rope_parameters')
  scaling = hf.get('rope_scaling')
  base, factor = _rope(scaling, hf.get('rope_theta', 10000.0), 'rope_scaling')
  return float(hf.get('rope_theta', base)), factor


def model_config_from_hf(hf: dict, *, dtype: str = 'float32', param_dtype: str | None = None):
  """The ctr_jax model config of a Hugging Face config.json dict."""
  family = _family(hf)
  common = dict(kind='transformer', vocab_size=int(hf['vocab_size']), dtype=dtype,
                param_dtype=param_dtype or dtype, dropout=0.0)
  return models.model_config(**common, **_FAMILY_CONFIGS[family](hf))


def _gemma3_config(hf: dict) -> dict:
  _refuse(hf.get('final_logit_softcapping') is None, 'Gemma final_logit_softcapping')
  _refuse(hf.get('attn_logit_softcapping') is None, 'Gemma attn_logit_softcapping')
  _refuse(not hf.get('attention_bias', False), 'Gemma attention_bias=True')
  _refuse(not hf.get('use_bidirectional_attention', False),
          'Gemma use_bidirectional_attention=True')
  depth = int(hf['num_hidden_layers'])
  layer_types = hf.get('layer_types')
  if not layer_types:
    pattern = int(_first(hf, 'sliding_window_pattern', '_sliding_window_pattern', default=6))
    layer_types = ['sliding_attention' if (i + 1) % pattern else 'full_attention'
                   for i in range(depth)]
  rope = hf.get('rope_parameters')
  if rope and 'full_attention' in rope:
    full_base, factor = _rope(rope['full_attention'], 1e6, 'full_attention')
    local_base, local_factor = _rope(rope.get('sliding_attention'), 1e4, 'sliding_attention')
  else:
    full_base, factor = _rope(rope or hf.get('rope_scaling'), hf.get('rope_theta', 1e6),
                              'rope_scaling')
    full_base = float(hf.get('rope_theta', full_base))
    local_base, local_factor = float(hf.get('rope_local_base_freq', 1e4)), 1.0
  _refuse(local_factor == 1.0, 'scaled RoPE on sliding layers')
  heads = int(hf['num_attention_heads'])
  head_dim = int(hf.get('head_dim') or hf['hidden_size'] // heads)
  return dict(
      block='gemma', width=int(hf['hidden_size']), depth=depth, num_heads=heads,
      num_kv_heads=int(hf.get('num_key_value_heads') or heads), head_dim=head_dim,
      mlp_dim=int(hf['intermediate_size']),
      max_len=int(hf.get('max_position_embeddings', 131072)),
      rope_base=full_base, rope_local_base=local_base, rope_scaling_factor=factor,
      layer_norm_eps=float(hf.get('rms_norm_eps', 1e-6)), qk_norm=True,
      sliding_window=int(hf.get('sliding_window') or 0), layer_types=tuple(layer_types),
      query_pre_attn_scalar=float(hf.get('query_pre_attn_scalar', head_dim)),
      tie_embeddings=bool(hf.get('tie_word_embeddings', True)),
      activation=_activation(_first(hf, 'hidden_activation', 'hidden_act',
                                    default='gelu_pytorch_tanh')))


def _llama_config(hf: dict) -> dict:
  _refuse(not hf.get('attention_bias', False), 'Llama attention_bias=True')
  _refuse(not hf.get('mlp_bias', False), 'Llama mlp_bias=True')
  base, factor = _single_rope(hf)
  heads = int(hf['num_attention_heads'])
  return dict(
      block='llama', width=int(hf['hidden_size']), depth=int(hf['num_hidden_layers']),
      num_heads=heads, num_kv_heads=int(hf.get('num_key_value_heads') or heads),
      head_dim=int(hf.get('head_dim') or hf['hidden_size'] // heads),
      mlp_dim=int(hf['intermediate_size']),
      max_len=int(hf.get('max_position_embeddings', 2048)), rope_base=base,
      rope_scaling_factor=factor, layer_norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
      sliding_window=int(hf.get('sliding_window') or 0),
      tie_embeddings=bool(hf.get('tie_word_embeddings', False)),
      activation=_activation(hf.get('hidden_act', 'silu')))


def _falcon_layout(hf: dict) -> tuple[str, int, int]:
  """('new' | 'multi_query' | 'multi_head', H, G) of the fused query_key_value."""
  heads = int(_first(hf, 'num_attention_heads', 'n_head'))
  if hf.get('new_decoder_architecture', False):
    return 'new', heads, int(_first(hf, 'num_kv_heads', 'n_head_kv', default=heads))
  if hf.get('multi_query', True):
    return 'multi_query', heads, 1
  return 'multi_head', heads, int(_first(hf, 'num_kv_heads', default=heads))


def _falcon_config(hf: dict) -> dict:
  _refuse(not hf.get('alibi', False), 'Falcon alibi=True (ALiBi positions)')
  _refuse(hf.get('parallel_attn', True), 'Falcon parallel_attn=False (sequential block)')
  layout, heads, kv_heads = _falcon_layout(hf)
  width = int(_first(hf, 'hidden_size', 'n_embed'))
  base, factor = _single_rope(hf)
  two_norms = layout == 'new' and hf.get('num_ln_in_parallel_attn') in (None, 2)
  return dict(
      block='falcon', width=width, depth=int(_first(hf, 'num_hidden_layers', 'n_layer')),
      num_heads=heads, num_kv_heads=kv_heads, head_dim=width // heads,
      mlp_dim=int(hf.get('ffn_hidden_size') or 4 * width),
      max_len=int(hf.get('max_position_embeddings', 2048)), rope_base=base,
      rope_scaling_factor=factor, layer_norm_eps=float(hf.get('layer_norm_epsilon', 1e-5)),
      use_bias=bool(hf.get('bias', False)), parallel_norms=2 if two_norms else 1,
      tie_embeddings=bool(hf.get('tie_word_embeddings', True)),
      activation=_activation(hf.get('activation', 'gelu')))


def _gpt2_config(hf: dict) -> dict:
  _refuse(hf.get('scale_attn_weights', True), 'GPT-2 scale_attn_weights=False')
  _refuse(not hf.get('scale_attn_by_inverse_layer_idx', False),
          'GPT-2 scale_attn_by_inverse_layer_idx=True')
  _refuse(not hf.get('add_cross_attention', False), 'GPT-2 add_cross_attention=True')
  width = int(_first(hf, 'n_embd', 'hidden_size'))
  return dict(
      block='gpt', positions='learned', width=width,
      depth=int(_first(hf, 'n_layer', 'num_hidden_layers')),
      num_heads=int(_first(hf, 'n_head', 'num_attention_heads')),
      mlp_dim=int(hf.get('n_inner') or 4 * width),
      max_len=int(_first(hf, 'n_positions', 'max_position_embeddings', default=1024)),
      layer_norm_eps=float(hf.get('layer_norm_epsilon', 1e-5)),
      tie_embeddings=bool(hf.get('tie_word_embeddings', True)),
      activation=_activation(hf.get('activation_function', 'gelu_new')))


_FAMILY_CONFIGS = {'gemma3': _gemma3_config, 'llama': _llama_config, 'falcon': _falcon_config,
                   'gpt2': _gpt2_config}


# ------------------------------------------------------------------------------------------------
# Parameters: Hugging Face names -> the ctr_jax tree. torch Linear weights are [out, in];
# flax kernels are [in, out].
# ------------------------------------------------------------------------------------------------


class _Tensors:
  """Checkpoint tensors under an optional prefix; remembers which ones were used."""

  def __init__(self, tensors: dict, prefixes: tuple[str, ...]):
    self.tensors = tensors
    self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in tensors)), '')
    self.used = set()

  def __contains__(self, name):
    return self.prefix + name in self.tensors

  def get(self, name, transpose=False):
    key = self.prefix + name
    if key not in self.tensors:
      raise ValueError(f'checkpoint is missing tensor {key!r}')
    self.used.add(key)
    value = self.tensors[key]
    return value.T if transpose else value

  def linear(self, name, bias=False):
    out = {'kernel': self.get(name + '.weight', transpose=True)}
    if bias:
      out['bias'] = self.get(name + '.bias')
    return out

  def norm(self, name, bias=False):
    out = {'scale': self.get(name + '.weight')}
    if bias:
      out['bias'] = self.get(name + '.bias')
    return out

  def mark_used(self, key):
    self.used.add(key)


def _attention(t: _Tensors, prefix: str) -> dict:
  """q/k/v/o projections of a Llama-layout attention (also Gemma 3's)."""
  names = {'query': 'q_proj', 'key': 'k_proj', 'value': 'v_proj', 'out': 'o_proj'}
  return {ours: t.linear(f'{prefix}self_attn.{theirs}') for ours, theirs in names.items()}


def _gated_mlp(t: _Tensors, prefix: str) -> dict:
  names = {'gate': 'gate_proj', 'up': 'up_proj', 'down': 'down_proj'}
  return {ours: t.linear(f'{prefix}mlp.{theirs}') for ours, theirs in names.items()}


def _gemma3_params(t: _Tensors, spec) -> dict:
  blocks = {}
  for i in range(spec.depth):
    p = f'layers.{i}.'
    blocks[f'block_{i}'] = {
        'attn_norm': t.norm(p + 'input_layernorm'),
        'attn': {**_attention(t, p), 'q_norm': t.norm(p + 'self_attn.q_norm'),
                 'k_norm': t.norm(p + 'self_attn.k_norm')},
        'post_attn_norm': t.norm(p + 'post_attention_layernorm'),
        'mlp_norm': t.norm(p + 'pre_feedforward_layernorm'),
        'mlp': _gated_mlp(t, p),
        'post_mlp_norm': t.norm(p + 'post_feedforward_layernorm'),
    }
  return {'embed': {'embedding': t.get('embed_tokens.weight')}, 'blocks': blocks,
          'ln_f': t.norm('norm')}


def _llama_params(t: _Tensors, spec) -> dict:
  blocks = {}
  for i in range(spec.depth):
    p = f'layers.{i}.'
    blocks[f'block_{i}'] = {
        'attn_norm': t.norm(p + 'input_layernorm'),
        'attn': _attention(t, p),
        'mlp_norm': t.norm(p + 'post_attention_layernorm'),
        'mlp': _gated_mlp(t, p),
    }
  return {'embed': {'embedding': t.get('embed_tokens.weight')}, 'blocks': blocks,
          'ln_f': t.norm('norm')}


def _split_falcon_qkv(fused: np.ndarray, layout: str, heads: int, kv_heads: int,
                      head_dim: int):
  """Fused query_key_value rows (weight [rows, C] or bias [rows]) -> q, k, v rows."""
  rest = fused.shape[1:]
  if layout == 'new':
    # Rows are grouped per key/value head: its H/G queries, then its key, then its value.
    grouped = fused.reshape((kv_heads, heads // kv_heads + 2, head_dim) + rest)
    q, k, v = grouped[:, :-2], grouped[:, -2], grouped[:, -1]
  elif layout == 'multi_query':
    grouped = fused.reshape((heads + 2, head_dim) + rest)
    q, k, v = grouped[:heads], grouped[heads:heads + 1], grouped[heads + 1:]
  else:
    grouped = fused.reshape((heads, 3, head_dim) + rest)
    q, k, v = grouped[:, 0], grouped[:, 1], grouped[:, 2]
  return tuple(x.reshape((-1,) + rest) for x in (q, k, v))


def _falcon_params(t: _Tensors, spec, hf: dict) -> dict:
  layout, heads, kv_heads = _falcon_layout(hf)
  bias = spec.use_bias
  blocks = {}
  for i in range(spec.depth):
    p = f'h.{i}.'
    q, k, v = _split_falcon_qkv(t.get(p + 'self_attention.query_key_value.weight'), layout,
                                heads, kv_heads, spec.head_dim)
    attn = {'query': {'kernel': q.T}, 'key': {'kernel': k.T}, 'value': {'kernel': v.T},
            'out': t.linear(p + 'self_attention.dense', bias)}
    if bias:
      qb, kb, vb = _split_falcon_qkv(t.get(p + 'self_attention.query_key_value.bias'), layout,
                                     heads, kv_heads, spec.head_dim)
      attn['query']['bias'], attn['key']['bias'], attn['value']['bias'] = qb, kb, vb
    block = {'attn': attn,
             'mlp': {'fc_in': t.linear(p + 'mlp.dense_h_to_4h', bias),
                     'fc_out': t.linear(p + 'mlp.dense_4h_to_h', bias)}}
    if spec.parallel_norms == 2:
      block['attn_norm'] = t.norm(p + 'ln_attn', bias=True)
      block['mlp_norm'] = t.norm(p + 'ln_mlp', bias=True)
    else:
      block['attn_norm'] = t.norm(p + 'input_layernorm', bias=True)
    blocks[f'block_{i}'] = block
  return {'embed': {'embedding': t.get('word_embeddings.weight')}, 'blocks': blocks,
          'ln_f': t.norm('ln_f', bias=True)}


def _gpt2_params(t: _Tensors, spec) -> dict:
  c = spec.width
  blocks = {}
  for i in range(spec.depth):
    p = f'h.{i}.'
    # Conv1D stores [in, out]: c_attn's columns are q | k | v.
    w, b = t.get(p + 'attn.c_attn.weight'), t.get(p + 'attn.c_attn.bias')
    conv = lambda name: {'kernel': t.get(name + '.weight'), 'bias': t.get(name + '.bias')}
    blocks[f'block_{i}'] = {
        'ln_attn': t.norm(p + 'ln_1', bias=True),
        'attn': {'query': {'kernel': w[:, :c], 'bias': b[:c]},
                 'key': {'kernel': w[:, c:2 * c], 'bias': b[c:2 * c]},
                 'value': {'kernel': w[:, 2 * c:], 'bias': b[2 * c:]},
                 'out': conv(p + 'attn.c_proj')},
        'ln_mlp': t.norm(p + 'ln_2', bias=True),
        'mlp': {'fc_in': conv(p + 'mlp.c_fc'), 'fc_out': conv(p + 'mlp.c_proj')},
    }
  return {'embed': {'embedding': t.get('wte.weight')},
          'pos_embed': {'embedding': t.get('wpe.weight')}, 'blocks': blocks,
          'ln_f': t.norm('ln_f', bias=True)}


def convert_params(hf: dict, tensors: dict, spec) -> dict:
  """The ctr_jax parameter tree (numpy) of a checkpoint's tensors."""
  family = _family(hf)
  prefixes = {'gemma3': ('model.',), 'llama': ('model.',), 'falcon': ('transformer.',),
              'gpt2': ('transformer.',)}[family]
  t = _Tensors(tensors, prefixes)
  if family == 'gemma3':
    params = _gemma3_params(t, spec)
  elif family == 'llama':
    params = _llama_params(t, spec)
  elif family == 'falcon':
    params = _falcon_params(t, spec, hf)
  else:
    params = _gpt2_params(t, spec)
  if 'lm_head.weight' in tensors:
    t.mark_used('lm_head.weight')
    if not spec.tie_embeddings:
      params['head'] = {'kernel': tensors['lm_head.weight'].T}
      if spec.block == 'gpt':  # the gpt family's untied head has a bias; GPT-2's has none
        params['head']['bias'] = np.zeros(spec.vocab_size, tensors['lm_head.weight'].dtype)
  elif not spec.tie_embeddings:
    raise ValueError("checkpoint is missing tensor 'lm_head.weight' (tie_word_embeddings is "
                     'false)')
  unused = sorted(k for k in tensors if k not in t.used and not k.endswith(_IGNORED_SUFFIXES))
  if unused:
    raise ValueError(f'checkpoint tensors not understood for {hf.get("model_type")!r}: '
                     f'{unused[:8]}{" ..." if len(unused) > 8 else ""}')
  return layers.to_kernel_layout(params, spec.kernel_layout)


def load(directory, *, dtype: str = 'float32', param_dtype: str | None = None):
  """(model, variables) of a Hugging Face checkpoint directory.

  `dtype` is the compute dtype and `param_dtype` (default: dtype) the parameters' dtype;
  'float32' reproduces the checkpoint's float32 logits. The parameter tree is checked leaf by
  leaf against the model's own.
  """
  hf = read_config(directory)
  with hf_checks.naming(os.path.join(os.fspath(directory), 'config.json')):
    cfg = model_config_from_hf(hf, dtype=dtype, param_dtype=param_dtype)
  model = models.build(cfg)
  params = convert_params(hf, read_tensors(directory), model.spec)
  expected = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
  expected = expected['params']
  got_paths = {jax.tree_util.keystr(p): np.shape(x)
               for p, x in jax.tree_util.tree_leaves_with_path(params)}
  want_paths = {jax.tree_util.keystr(p): x.shape
                for p, x in jax.tree_util.tree_leaves_with_path(expected)}
  if got_paths != want_paths:
    diff = sorted(set(got_paths.items()) ^ set(want_paths.items()))
    raise ValueError(f'converted parameters do not fit the model: {diff[:6]}')
  pdt = jnp.dtype(cfg.param_dtype)
  params = jax.tree.map(lambda x: jnp.asarray(np.asarray(x, np.float32), pdt)
                        if pdt != np.float64 else jnp.asarray(np.asarray(x, np.float64)),
                        params)
  return model, {'params': params}
