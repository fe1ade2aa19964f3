"""GGUF files (llama.cpp's format) as ctr_jax models, read with the numpy-only `gguf` package.

    from ctr_jax.pretrained import gguf_reader
    model, variables = gguf_reader.load('gemma-3-270m-q4_k_m.gguf')     # as hf.load
    tokenizer = gguf_reader.load_tokenizer('gemma-3-270m-q4_k_m.gguf')  # tokenizers.Tokenizer

`pip install -e ".[models]"` brings `gguf`. The file's metadata becomes a Hugging Face
config.json dict and its tensors (dequantized to float32) get their Hugging Face names; both then
go through `hf.model_config_from_hf` / `hf.convert_params`, so a GGUF file and the checkpoint it
was converted from load into the same model. Supported `general.architecture`s: 'gemma3' (HF
gemma3_text) and 'llama'. llama.cpp's converter changed three things, undone here:

  * Gemma norm weights are stored as 1 + w (llama.cpp multiplies by the stored weight; HF and
    ctr_jax store w and multiply by 1 + w): 1 is subtracted again.
  * Llama's q/k projection rows are permuted so that llama.cpp's interleaved RoPE (pairs 2i,
    2i + 1) equals HF's rotate-half RoPE (pairs i, i + D/2): the permutation is inverted.
  * What the file does not store, llama.cpp hard-codes for gemma3, and so does this reader:
    5 sliding : 1 global layers, RoPE base 10k on sliding layers, query_pre_attn_scalar =
    head_dim (C / H for the 62-layer 27B). Keys that do store them win when present.

Everything else that has no exact equivalent (other architectures, integer or not-dequantizable
tensor types, non-linear RoPE scaling, unknown tensors) raises ValueError.

Files are untrusted input, as for `hf` (ctr_jax/pretrained/checks.py): a damaged or truncated
file, a size key that is not a positive integer (`gemma3.attention.head_count` = 0), a tensor
whose shape the metadata does not imply, or a missing tensor ends in one `ValueError:
<path>: ...` line, never the reader's IndexError or numpy's 'cannot reshape array'.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import models
from ctr_jax.pretrained import checks, gguf_tokenizer, hf

__all__ = ['ARCHITECTURES', 'read', 'check_metadata', 'hf_config', 'expected_shapes',
           'hf_tensors', 'load', 'load_tokenizer', 'load_with_tokenizer']

ARCHITECTURES = ('gemma3', 'llama')
_INSTALL = 'pip install -e ".[models]"  (or: pip install gguf)'

# GGUF block tensor -> Hugging Face name under model.layers.{i}.
_BLOCK_NAMES = {
    'gemma3': {'attn_norm': 'input_layernorm', 'attn_q': 'self_attn.q_proj',
               'attn_k': 'self_attn.k_proj', 'attn_v': 'self_attn.v_proj',
               'attn_output': 'self_attn.o_proj', 'attn_q_norm': 'self_attn.q_norm',
               'attn_k_norm': 'self_attn.k_norm', 'post_attention_norm': 'post_attention_layernorm',
               'ffn_norm': 'pre_feedforward_layernorm',
               'post_ffw_norm': 'post_feedforward_layernorm',
               'ffn_gate': 'mlp.gate_proj', 'ffn_up': 'mlp.up_proj', 'ffn_down': 'mlp.down_proj'},
    'llama': {'attn_norm': 'input_layernorm', 'attn_q': 'self_attn.q_proj',
              'attn_k': 'self_attn.k_proj', 'attn_v': 'self_attn.v_proj',
              'attn_output': 'self_attn.o_proj', 'ffn_norm': 'post_attention_layernorm',
              'ffn_gate': 'mlp.gate_proj', 'ffn_up': 'mlp.up_proj', 'ffn_down': 'mlp.down_proj'},
}
_GLOBAL_NAMES = {'token_embd.weight': 'model.embed_tokens.weight',
                 'output_norm.weight': 'model.norm.weight', 'output.weight': 'lm_head.weight'}
# Metadata keys (after '<arch>.') checked like config.json's fields before anything uses them:
# sizes and counts, then floats. A per-layer array is checked entry by entry.
_POSITIVE_INTS = ('embedding_length', 'block_count', 'feed_forward_length', 'context_length',
                  'attention.head_count', 'attention.head_count_kv', 'attention.key_length',
                  'attention.value_length', 'rope.dimension_count')
_NON_NEGATIVE_INTS = ('attention.sliding_window', 'expert_count')
_POSITIVE_FLOATS = ('rope.freq_base', 'rope.freq_base_swa', 'rope.scaling.factor',
                    'attention.scale')
_NON_NEGATIVE_FLOATS = ('attention.layer_norm_rms_epsilon',)
# What the GGUF reader and numpy raise on a damaged or truncated file (short reads show up as
# failed views and reshapes, bad enums and UTF-8 as ValueError, duplicate keys as KeyError).
_DAMAGED = (ValueError, IndexError, KeyError, TypeError, OverflowError, OSError)


def _gguf():
  try:
    import gguf  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(f'reading GGUF files needs the `gguf` package: {_INSTALL}') from None
  return gguf


def _dequantize(gguf, tensor) -> np.ndarray:
  """One tensor as float32 in numpy order ([rows, cols] = torch's [out, in])."""
  qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
  integer = {gguf.GGMLQuantizationType[n] for n in ('I8', 'I16', 'I32', 'I64')}
  supported = 'F32, F16, BF16, F64 and the quantized types gguf.quants can dequantize'
  if qtype in integer:
    raise ValueError(f'GGUF tensor {tensor.name!r} has type {qtype.name}; supported: {supported}')
  if qtype == gguf.GGMLQuantizationType.F64:
    value = np.asarray(tensor.data, np.float32)
  else:
    try:
      value = gguf.quants.dequantize(tensor.data, qtype)
    except NotImplementedError:
      raise ValueError(f'GGUF tensor {tensor.name!r} has quantization type {qtype.name}, which '
                       f'the installed gguf package cannot dequantize; supported: {supported}'
                       ) from None
  shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dims fastest-first
  return np.asarray(value, np.float32).reshape(shape)


def _open(gguf, path: str, prefix: str = '') -> tuple[object, dict]:
  """(reader, {key: python value} of the metadata keys starting with `prefix`)."""
  if not os.path.isfile(path):
    raise ValueError(f'{path} is not a file; expected a .gguf file')
  try:
    reader = gguf.GGUFReader(path)
    metadata = {key: field.contents() for key, field in reader.fields.items()
                if key.startswith(prefix) and not key.startswith('GGUF.')}
  except _DAMAGED as e:
    raise ValueError(f'{path} is not a readable GGUF file ({os.path.getsize(path)} bytes; '
                     f'damaged or cut short): {type(e).__name__}: {" ".join(str(e).split())}'
                     ) from None
  return reader, metadata


def read(path) -> tuple[dict, dict[str, np.ndarray]]:
  """(metadata {key: python value}, {GGUF tensor name: float32 array}) of a .gguf file."""
  gguf = _gguf()
  path = os.fspath(path)
  reader, metadata = _open(gguf, path)
  check_metadata(metadata, path)
  with checks.naming(path):
    return metadata, {t.name: _dequantize(gguf, t) for t in reader.tensors}


def check_metadata(metadata: dict, path: str) -> None:
  """The architecture is supported and every size / float key is usable, or ValueError."""
  with checks.naming(path):
    arch = _check_architecture(metadata)
  fields = [(name, True, 1) for name in _POSITIVE_INTS] + [
      (name, True, 0) for name in _NON_NEGATIVE_INTS] + [
          (name, False, True) for name in _POSITIVE_FLOATS] + [
              (name, False, False) for name in _NON_NEGATIVE_FLOATS]
  pattern = metadata.get(f'{arch}.attention.sliding_window_pattern')
  if pattern is not None and not isinstance(pattern, list):  # a list holds one flag per layer
    fields.append(('attention.sliding_window_pattern', True, 1))
  for name, integer, bound in fields:
    key = f'{arch}.{name}'
    value = metadata.get(key)
    for entry in value if isinstance(value, list) else [value]:
      if entry is None:
        continue
      if integer:
        checks.check_int(entry, path, key, bound)
      else:
        checks.check_float(entry, path, key, positive=bound)


def _check_architecture(metadata: dict) -> str:
  arch = metadata.get('general.architecture')
  if arch not in ARCHITECTURES:
    raise ValueError(f'GGUF general.architecture {arch!r} is not supported; supported: '
                     f'{list(ARCHITECTURES)}')
  return arch


def _scalar(metadata: dict, key: str, default=None):
  """A metadata value; per-layer arrays (some files store them) must be constant."""
  value = metadata.get(key, default)
  if isinstance(value, list):
    if len(set(value)) != 1:
      raise ValueError(f'GGUF {key} varies per layer ({value}); only uniform layers are '
                       'supported')
    value = value[0]
  if value is None:
    raise ValueError(f'GGUF metadata is missing {key!r}')
  return value


def _float32_value(x) -> float:
  """GGUF stores float32: 9.99999997e-07 is written back as the 1e-06 it came from."""
  return float(f'{float(x):.7g}')


def _gemma3_layer_types(metadata: dict, depth: int) -> list[str]:
  pattern = metadata.get('gemma3.attention.sliding_window_pattern', 6)
  if isinstance(pattern, list):  # one flag per layer: True = sliding
    sliding = [bool(x) for x in pattern]
  else:  # llama.cpp's set_swa_pattern(n): the last layer of every n is global
    sliding = [(i + 1) % int(pattern) != 0 for i in range(depth)]
  if len(sliding) != depth:
    raise ValueError(f'GGUF gemma3.attention.sliding_window_pattern has {len(sliding)} entries '
                     f'for {depth} layers')
  return ['sliding_attention' if s else 'full_attention' for s in sliding]


def hf_config(metadata: dict, tensors: dict) -> dict:
  """The Hugging Face config.json dict that a GGUF file's metadata (and tensors) describe."""
  arch = _check_architecture(metadata)
  key = lambda name, default=None: _scalar(metadata, f'{arch}.{name}', default)
  width, heads, depth = int(key('embedding_length')), int(key('attention.head_count')), int(
      key('block_count'))
  head_dim = int(key('attention.key_length', width // heads))
  if int(key('attention.value_length', head_dim)) != head_dim:
    raise ValueError(f'GGUF {arch}.attention.value_length differs from key_length; unsupported')
  if int(key('rope.dimension_count', head_dim)) != head_dim:
    raise ValueError(f'GGUF {arch}.rope.dimension_count != head_dim (partial RoPE); unsupported')
  if int(metadata.get(f'{arch}.expert_count', 0) or 0):
    raise ValueError(f'GGUF {arch}.expert_count > 0 (mixture of experts); unsupported')
  scaling = metadata.get(f'{arch}.rope.scaling.type', 'none')
  if scaling not in ('none', 'linear'):
    raise ValueError(f"GGUF {arch}.rope.scaling.type {scaling!r}; only 'none' and 'linear' "
                     'have an exact equivalent')
  if 'token_embd.weight' not in tensors:
    raise ValueError("GGUF file has no 'token_embd.weight' tensor")
  vocab = np.shape(tensors['token_embd.weight'])[0]  # the model's truth; files agree with it
  config = dict(
      vocab_size=int(vocab), hidden_size=width, num_hidden_layers=depth,
      intermediate_size=int(key('feed_forward_length')), num_attention_heads=heads,
      num_key_value_heads=int(key('attention.head_count_kv', heads)), head_dim=head_dim,
      rms_norm_eps=_float32_value(key('attention.layer_norm_rms_epsilon')),
      max_position_embeddings=int(key('context_length')),
      rope_theta=float(key('rope.freq_base', 10000.0)),
      tie_word_embeddings='output.weight' not in tensors,
      sliding_window=int(metadata.get(f'{arch}.attention.sliding_window', 0) or 0) or None)
  if scaling == 'linear':
    config['rope_scaling'] = {'rope_type': 'linear',
                              'factor': float(key('rope.scaling.factor'))}
  if arch == 'llama':
    return dict(config, model_type='llama', architectures=['LlamaForCausalLM'], hidden_act='silu')
  # llama.cpp: f_attention_scale = 1/sqrt(C/H) for the 27B (62 layers), else 1/sqrt(head_dim).
  default_qpas = width / heads if depth == 62 else head_dim
  scale = metadata.get('gemma3.attention.scale')
  config.update(
      model_type='gemma3_text', architectures=['Gemma3ForCausalLM'],
      hidden_activation='gelu_pytorch_tanh', layer_types=_gemma3_layer_types(metadata, depth),
      rope_local_base_freq=float(metadata.get('gemma3.rope.freq_base_swa', 10000.0)),
      query_pre_attn_scalar=float(scale ** -2 if scale else default_qpas),
      # gemma3 files carry no soft-capping; a file that does is refused by hf.
      final_logit_softcapping=metadata.get('gemma3.final_logit_softcapping'),
      attn_logit_softcapping=metadata.get('gemma3.attn_logit_softcapping'))
  return config


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
  """Inverse of llama.cpp's LlamaModel.permute: rows (h, i, pair) -> (h, pair, i)."""
  rows = w.shape[0]
  return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_shapes(arch: str, config: dict) -> dict[str, tuple[int, ...]]:
  """{GGUF tensor name: numpy shape ([rows, cols])} that the config (from the metadata) implies."""
  width, ff, head_dim = config['hidden_size'], config['intermediate_size'], config['head_dim']
  q_rows = config['num_attention_heads'] * head_dim
  kv_rows = config['num_key_value_heads'] * head_dim
  block = {'attn_q': (q_rows, width), 'attn_k': (kv_rows, width), 'attn_v': (kv_rows, width),
           'attn_output': (width, q_rows), 'ffn_gate': (ff, width), 'ffn_up': (ff, width),
           'ffn_down': (width, ff), 'attn_q_norm': (head_dim,), 'attn_k_norm': (head_dim,)}
  shapes = {'token_embd.weight': (config['vocab_size'], width), 'output_norm.weight': (width,)}
  if not config['tie_word_embeddings']:
    shapes['output.weight'] = (config['vocab_size'], width)
  for layer in range(config['num_hidden_layers']):
    for name in _BLOCK_NAMES[arch]:
      shapes[f'blk.{layer}.{name}.weight'] = block.get(name, (width,))  # the rest are norms
  return shapes


def _check_shapes(arch: str, tensors: dict[str, np.ndarray], config: dict) -> None:
  """Every tensor the model needs is there, with the shape the metadata implies."""
  want = expected_shapes(arch, config)
  for name, value in tensors.items():
    if name in want and np.shape(value) != want[name]:
      raise ValueError(f'GGUF tensor {name!r} has shape {list(np.shape(value))}, but the '
                       f'metadata implies {list(want[name])} (numpy order: [out, in])')
  missing = sorted(set(want) - set(tensors))
  if missing:
    more = f' and {len(missing) - 6} more' if len(missing) > 6 else ''
    raise ValueError(f'GGUF file lacks tensors that its metadata implies ({arch}.block_count='
                     f'{config["num_hidden_layers"]}): {missing[:6]}{more}')


def hf_tensors(metadata: dict, tensors: dict[str, np.ndarray], config: dict) -> dict:
  """GGUF tensors under their Hugging Face names, with llama.cpp's changes undone."""
  arch = _check_architecture(metadata)
  _check_shapes(arch, tensors, config)
  out, unknown = {}, []
  for name, value in tensors.items():
    parts = name.split('.')
    if name in _GLOBAL_NAMES:
      hf_name = _GLOBAL_NAMES[name]
    elif (len(parts) == 4 and parts[0] == 'blk' and parts[1].isdigit() and parts[3] == 'weight'
          and parts[2] in _BLOCK_NAMES[arch] and int(parts[1]) < config['num_hidden_layers']):
      hf_name = f'model.layers.{parts[1]}.{_BLOCK_NAMES[arch][parts[2]]}.weight'
    else:
      unknown.append(name)
      continue
    if arch == 'gemma3' and hf_name.endswith('norm.weight'):
      value = value - np.float32(1.0)
    elif arch == 'llama' and hf_name.endswith('q_proj.weight'):
      value = _unpermute(value, config['num_attention_heads'])
    elif arch == 'llama' and hf_name.endswith('k_proj.weight'):
      value = _unpermute(value, config['num_key_value_heads'])
    out[hf_name] = value
  if unknown:
    depth = config['num_hidden_layers']
    beyond = [n for n in unknown if n.startswith('blk.') and n.split('.')[1].isdigit()
              and int(n.split('.')[1]) >= depth]
    hint = (" (rope_freqs: Llama 3.1-style RoPE scaling, which has no equivalent here)"
            if 'rope_freqs.weight' in unknown else
            f' (layers beyond {arch}.block_count={depth})' if beyond else '')
    raise ValueError(f'GGUF tensors not understood for {arch!r}: {sorted(unknown)[:8]}{hint}')
  return out


def _check_fits(model, params):
  expected = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
  got = {jax.tree_util.keystr(p): np.shape(x)
         for p, x in jax.tree_util.tree_leaves_with_path(params)}
  want = {jax.tree_util.keystr(p): x.shape
          for p, x in jax.tree_util.tree_leaves_with_path(expected['params'])}
  if got != want:
    diff = sorted(set(got.items()) ^ set(want.items()))
    raise ValueError(f'converted GGUF parameters do not fit the model: {diff[:6]}')


def _build(path: str, metadata: dict, tensors: dict, dtype: str, param_dtype: str | None):
  """(model, variables); every failure is a ValueError naming `path`."""
  with checks.naming(path):
    config = hf_config(metadata, tensors)
    checks.check_config(config, path)  # what the metadata left to defaults (head_dim = C / H)
    cfg = hf.model_config_from_hf(config, dtype=dtype, param_dtype=param_dtype)
    model = models.build(cfg)
    params = hf.convert_params(config, hf_tensors(metadata, tensors, config), model.spec)
    _check_fits(model, params)
  pdt = jnp.dtype(cfg.param_dtype)
  return model, {'params': jax.tree.map(lambda x: jnp.asarray(x, pdt), params)}


def load(path, *, dtype: str = 'float32', param_dtype: str | None = None):
  """(model, variables) of a .gguf file, like `hf.load` of the checkpoint it came from.

  Quantized tensors are dequantized to float32 first, so 'float32' computes with exactly the
  weights llama.cpp computes with.
  """
  return _build(os.fspath(path), *read(path), dtype, param_dtype)


def load_tokenizer(path):
  """The `tokenizers.Tokenizer` of a .gguf file's vocabulary (see ctr_jax/pretrained/gguf_tokenizer.py)."""
  path = os.fspath(path)
  _, metadata = _open(_gguf(), path, prefix='tokenizer.')
  with checks.naming(path):
    return gguf_tokenizer.from_metadata(metadata)


def load_with_tokenizer(path, *, dtype: str = 'float32', param_dtype: str | None = None):
  """(model, variables, tokenizer), reading the file once."""
  path = os.fspath(path)
  metadata, tensors = read(path)
  model, variables = _build(path, metadata, tensors, dtype, param_dtype)
  with checks.naming(path):
    return model, variables, gguf_tokenizer.from_metadata(metadata)
