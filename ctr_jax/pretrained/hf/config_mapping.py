"""Hugging Face config.json -> ctr_jax model config, one function per architecture.

`ARCHITECTURES` maps a checkpoint's `model_type` to the architecture whose `CONFIGS` entry
builds the config (and whose `param_mapping.PARAMS` entry reads its tensors).
"""

from ctr_jax import models

_ACTIVATIONS = {'gelu': 'gelu', 'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh',
                'gelu_fast': 'gelu_tanh', 'gelu_tanh': 'gelu_tanh', 'silu': 'silu',
                'swish': 'silu', 'relu': 'relu'}
# model_type -> architecture (the keys of CONFIGS and param_mapping.PARAMS).
ARCHITECTURES = {'gemma3_text': 'gemma3', 'llama': 'llama', 'mistral': 'llama',
                 'falcon': 'falcon', 'RefinedWebModel': 'falcon', 'RefinedWeb': 'falcon',
                 'gpt2': 'gpt2'}


def _refuse(ok: bool, message: str):
  if not ok:
    raise ValueError(f'unsupported checkpoint option: {message}')


def architecture(hf: dict) -> str:
  """The architecture of a config.json dict (a key of CONFIGS and param_mapping.PARAMS)."""
  model_type = hf.get('model_type', '')
  if model_type == 'gemma3':
    raise ValueError("model_type 'gemma3' is the multimodal Gemma3ForConditionalGeneration; "
                     'load a text-only Gemma3ForCausalLM (model_type gemma3_text) checkpoint')
  if model_type not in ARCHITECTURES:
    raise ValueError(f'model_type {model_type!r} is not supported; supported: '
                     f'{sorted(ARCHITECTURES)}')
  return ARCHITECTURES[model_type]


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
  common = dict(kind='transformer', vocab_size=int(hf['vocab_size']), dtype=dtype,
                param_dtype=param_dtype or dtype, dropout=0.0)
  return models.model_config(**common, **CONFIGS[architecture(hf)](hf))


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


def falcon_layout(hf: dict) -> tuple[str, int, int]:
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
  layout, heads, kv_heads = falcon_layout(hf)
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


CONFIGS = {'gemma3': _gemma3_config, 'llama': _llama_config, 'falcon': _falcon_config,
           'gpt2': _gpt2_config}
