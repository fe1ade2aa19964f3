"""Checks for reading Hugging Face checkpoint directories that may be damaged or hostile.

`ctr_jax.pretrained.hf` reads every file through these functions, so each failure is a `ValueError` that
names the file (and the field), never a library's bare exception:

  read_config(path)            config.json as a dict; sizes positive ints below 2**31, floats
                               finite, the fields a family needs present.
  shard_files(directory, index)  the shard names of model.safetensors.index.json, each confined
                               to the checkpoint directory.
  load_safetensors(directory, name)  one safetensors file's tensors.
  read_tokenizer(path)         a `tokenizers.Tokenizer`.
  naming(path)                 a context: the rest of the mapping's errors name `path`.
  check_int / check_float      one size or float field, named as `path: field` (the GGUF reader
                               checks its metadata keys with them too).

Confinement: a file name taken from the checkpoint (a `weight_map` value) must be relative and
free of `..`, and the file it resolves to (symlinks followed) must lie inside the directory;
the one exception is the Hugging Face hub cache, whose `snapshots/<revision>/` files link to
`../../blobs/`.
"""

import contextlib
import json
import math
import os
import posixpath

from safetensors import numpy as safetensors_numpy
import tokenizers

# Integer fields that are sizes or counts: positive, and small enough for int32 shapes.
POSITIVE_INTS = ('vocab_size', 'hidden_size', 'n_embd', 'n_embed', 'num_hidden_layers', 'n_layer',
                 'num_attention_heads', 'n_head', 'num_key_value_heads', 'n_head_kv',
                 'num_kv_heads', 'head_dim', 'intermediate_size', 'n_inner', 'ffn_hidden_size',
                 'max_position_embeddings', 'n_positions', 'sliding_window_pattern',
                 '_sliding_window_pattern', 'num_ln_in_parallel_attn')
NON_NEGATIVE_INTS = ('sliding_window',)
# Float fields: finite, and > 0 (a base or a scale) or >= 0 (an epsilon).
POSITIVE_FLOATS = ('rope_theta', 'rope_local_base_freq', 'query_pre_attn_scalar', 'factor')
NON_NEGATIVE_FLOATS = ('rms_norm_eps', 'layer_norm_epsilon', 'layer_norm_eps')
MAX_SIZE = 2**31 - 1
# Each family's required fields; a tuple lists alternative names of one field.
REQUIRED = {
    'gemma3_text': ('vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads',
                    'intermediate_size'),
    'llama': ('vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads',
              'intermediate_size'),
    'falcon': ('vocab_size', ('hidden_size', 'n_embed'), ('num_hidden_layers', 'n_layer'),
               ('num_attention_heads', 'n_head')),
    'gpt2': ('vocab_size', ('n_embd', 'hidden_size'), ('n_layer', 'num_hidden_layers'),
             ('n_head', 'num_attention_heads')),
}
REQUIRED['mistral'] = REQUIRED['llama']
REQUIRED['RefinedWeb'] = REQUIRED['RefinedWebModel'] = REQUIRED['falcon']


def read_json(path: str):
  """The parsed JSON of `path`; a ValueError naming the file if it is unreadable or invalid."""
  try:
    with open(path, 'rb') as f:
      return json.loads(f.read().decode('utf-8'))
  except UnicodeDecodeError as e:
    raise ValueError(f'{path} is not UTF-8 text (byte {e.start})') from None
  except json.JSONDecodeError as e:
    raise ValueError(f'{path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}'
                     ) from None
  except OSError as e:
    raise ValueError(f'cannot read {path}: {e.strerror or e}') from None


def read_config(path: str) -> dict:
  """config.json as a dict, every known size and float field checked (see the module doc)."""
  hf = read_json(path)
  if not isinstance(hf, dict):
    raise ValueError(f'{path} must hold a JSON object (the model config), not a '
                     f'{type(hf).__name__}')
  check_config(hf, path)
  return hf


def check_config(hf: dict, path: str) -> None:
  model_type = hf.get('model_type', '')
  if not isinstance(model_type, str):
    raise ValueError(f'{path}: model_type must be a string, got {model_type!r}')
  for names in REQUIRED.get(model_type, ()):
    names = (names,) if isinstance(names, str) else names
    if all(hf.get(n) is None for n in names):
      raise ValueError(f'{path}: {" or ".join(names)} is missing (needed for model_type '
                       f'{model_type!r})')
  _check_fields(hf, path, '')


def _check_fields(node: dict, path: str, where: str) -> None:
  for key, value in node.items():
    field = f'{where}{key}'
    if isinstance(value, dict) and (key.startswith('rope') or where):
      _check_fields(value, path, field + '.')  # rope_scaling / rope_parameters (per layer type)
    elif value is None:
      continue
    elif key in POSITIVE_INTS or key in NON_NEGATIVE_INTS:
      check_int(value, path, field, 1 if key in POSITIVE_INTS else 0)
    elif key in POSITIVE_FLOATS or key in NON_NEGATIVE_FLOATS:
      check_float(value, path, field, positive=key in POSITIVE_FLOATS)


def check_int(value, path: str, field: str, minimum: int) -> None:
  """ValueError `path: field must be an integer in [minimum, MAX_SIZE]` unless it is one."""
  ok = (isinstance(value, int) and not isinstance(value, bool)) or (
      isinstance(value, float) and math.isfinite(value) and value == int(value))
  if not ok or not minimum <= value <= MAX_SIZE:
    raise ValueError(f'{path}: {field} must be an integer in [{minimum}, {MAX_SIZE}], got '
                     f'{value!r}')


def check_float(value, path: str, field: str, positive: bool) -> None:
  """ValueError `path: field must be a finite number > 0` (>= 0 unless positive) unless it is."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if not ok or value < 0 or (positive and value == 0):
    raise ValueError(f'{path}: {field} must be a finite number {"> 0" if positive else ">= 0"}, '
                     f'got {value!r}')


def confined(directory: str, name, source: str) -> str:
  """The path of `name` inside `directory`; ValueError if it is absolute or escapes it."""
  if not isinstance(name, str) or not name or '\0' in name:
    raise ValueError(f'{source}: {name!r} is not a file name')
  normal = posixpath.normpath(name.replace('\\', '/'))
  if posixpath.isabs(normal) or os.path.isabs(name) or normal.split('/')[0] == '..':
    raise ValueError(f'{source}: {name!r} points outside the checkpoint directory; refusing '
                     'to open it')
  path = os.path.join(directory, normal)
  real, root = os.path.realpath(path), os.path.realpath(directory)
  roots = [root]
  if os.path.basename(os.path.dirname(root)) == 'snapshots':  # the hub cache's layout
    roots.append(os.path.join(os.path.dirname(os.path.dirname(root)), 'blobs'))
  if not any(os.path.commonpath([real, r]) == r for r in roots):
    raise ValueError(f'{source}: {name!r} resolves to {real}, outside the checkpoint directory '
                     f'{directory}; refusing to open it')
  return path


def shard_files(directory: str, index_path: str) -> list[str]:
  """The sorted distinct shard names of a sharded checkpoint's index, each one confined."""
  index = read_json(index_path)
  weight_map = index.get('weight_map') if isinstance(index, dict) else None
  if not isinstance(weight_map, dict) or not weight_map:
    raise ValueError(f'{index_path}: weight_map must be a non-empty object mapping tensor '
                     'names to shard files')
  names = set()
  for tensor, name in weight_map.items():
    confined(directory, name, f'{index_path}: weight_map[{tensor!r}]')
    names.add(name)
  return sorted(names)


def load_safetensors(directory: str, name: str, source: str | None = None) -> dict:
  """The numpy tensors of one safetensors file of the checkpoint."""
  path = confined(directory, name, source or directory)
  if not os.path.isfile(path):
    raise ValueError(f'{source or directory}: {name!r} does not exist in {directory}')
  try:
    return safetensors_numpy.load_file(path)
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError is a bare Exception)
    raise ValueError(f'{path} is not a readable safetensors file: {" ".join(str(e).split())}'
                     ) from None


def read_tokenizer(path: str):
  """`tokenizers.Tokenizer.from_file`, whose bare `Exception` becomes a ValueError naming it."""
  path = confined(os.path.dirname(path), os.path.basename(path), os.path.dirname(path))
  try:
    return tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f'{path} is not a readable tokenizer file: {" ".join(str(e).split())}'
                     ) from None


@contextlib.contextmanager
def naming(path: str):
  """Errors of the config mapping inside this context name `path` and stay ValueErrors."""
  try:
    yield
  except KeyError as e:
    raise ValueError(f'{path}: field {e.args[0]!r} is missing') from None
  except ValueError as e:
    if path in str(e):
      raise
    raise ValueError(f'{path}: {e}') from None
  except (TypeError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as e:
    raise ValueError(f'{path}: a field has an unusable value ({type(e).__name__}: {e})'
                     ) from None
