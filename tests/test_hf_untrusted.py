"""`hf.load` on damaged or hostile checkpoint directories (issue 17, item 12).

Every failure is a ValueError naming the file (and the field); shard names from an index file
never reach outside the checkpoint directory.
"""

import json
import os

import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy

from ctr_jax.pretrained import checks as hf_checks
from ctr_jax.pretrained import hf

V, C, P = 11, 8, 16


def gpt2_tensors(seed=0):
  r = np.random.default_rng(seed)
  t = {'wte.weight': (V, C), 'wpe.weight': (P, C), 'ln_f.weight': (C,), 'ln_f.bias': (C,)}
  for name, shape in (('ln_1.weight', (C,)), ('ln_1.bias', (C,)), ('ln_2.weight', (C,)),
                      ('ln_2.bias', (C,)), ('attn.c_attn.weight', (C, 3 * C)),
                      ('attn.c_attn.bias', (3 * C,)), ('attn.c_proj.weight', (C, C)),
                      ('attn.c_proj.bias', (C,)), ('mlp.c_fc.weight', (C, 4 * C)),
                      ('mlp.c_fc.bias', (4 * C,)), ('mlp.c_proj.weight', (4 * C, C)),
                      ('mlp.c_proj.bias', (C,))):
    t[f'h.0.{name}'] = shape
  return {k: r.normal(size=s).astype(np.float32) for k, s in t.items()}


def gpt2_config(**extra):
  return {'model_type': 'gpt2', 'vocab_size': V, 'n_embd': C, 'n_layer': 1, 'n_head': 2,
          'n_positions': P, **extra}


def write(directory, config=None, tensors=None):
  directory.mkdir(parents=True, exist_ok=True)
  text = config if isinstance(config, str) else json.dumps(gpt2_config() if config is None
                                                           else config)
  (directory / 'config.json').write_text(text)
  safetensors_numpy.save_file(gpt2_tensors() if tensors is None else tensors,
                              str(directory / 'model.safetensors'))
  return directory


def test_a_valid_checkpoint_loads(tmp_path):
  model, variables = hf.load(write(tmp_path / 'ok'))
  assert model.spec.vocab_size == V and 'blocks' in variables['params']


CONFIG_CASES = {
    # name: (config.json text, what the error must say besides the file name)
    'zero_heads': (json.dumps(gpt2_config(n_head=0)), 'n_head must be an integer in [1,'),
    'llama_zero_heads': (json.dumps({'model_type': 'llama', 'vocab_size': V, 'hidden_size': C,
                                     'num_hidden_layers': 1, 'num_attention_heads': 0,
                                     'intermediate_size': 16}),
                         'num_attention_heads must be an integer in [1,'),
    'list': ('[1, 2, 3]', 'must hold a JSON object (the model config), not a list'),
    'invalid_json': ('{"model_type": "gpt2", ', 'is not valid JSON: '),
    'not_utf8': ('\udcff', 'is not UTF-8 text'),
    'huge_vocab': (json.dumps(gpt2_config(vocab_size=10**12)), 'vocab_size must be an integer'),
    'nan_eps': (json.dumps({'model_type': 'llama', 'vocab_size': V, 'hidden_size': C,
                            'num_hidden_layers': 1, 'num_attention_heads': 2,
                            'intermediate_size': 16, 'rms_norm_eps': float('nan')}),
                'rms_norm_eps must be a finite number >= 0, got nan'),
    'nan_rope_factor': (json.dumps(gpt2_config(rope_scaling={'type': 'linear',
                                                             'factor': float('inf')})),
                        'rope_scaling.factor must be a finite number > 0'),
    'string_size': (json.dumps(gpt2_config(n_embd='8')), "n_embd must be an integer"),
    'missing_field': (json.dumps({'model_type': 'llama', 'vocab_size': V, 'hidden_size': C,
                                  'num_attention_heads': 2, 'intermediate_size': 16}),
                      "num_hidden_layers is missing (needed for model_type 'llama')"),
    'bad_model_type': (json.dumps(gpt2_config(model_type=['gpt2'])),
                       'model_type must be a string'),
}


@pytest.mark.parametrize('case', sorted(CONFIG_CASES))
def test_bad_config_json_is_a_value_error_naming_file_and_field(case, tmp_path):
  text, message = CONFIG_CASES[case]
  directory = tmp_path / case
  directory.mkdir()
  if case == 'not_utf8':
    (directory / 'config.json').write_bytes(b'{"model_type": "\xff"}')
  else:
    (directory / 'config.json').write_text(text)
  safetensors_numpy.save_file(gpt2_tensors(), str(directory / 'model.safetensors'))
  with pytest.raises(ValueError) as info:
    hf.load(directory)
  assert type(info.value) is ValueError
  assert str(directory / 'config.json') in str(info.value), str(info.value)
  assert message in str(info.value), str(info.value)


def test_an_unusable_field_the_checks_do_not_know_is_named(tmp_path):
  # layer_types=7: the family mapping's TypeError becomes a ValueError naming config.json.
  directory = write(tmp_path / 'x', {'model_type': 'gemma3_text', 'vocab_size': V,
                                     'hidden_size': C, 'num_hidden_layers': 1,
                                     'num_attention_heads': 2, 'intermediate_size': 16,
                                     'head_dim': 4, 'layer_types': 7})
  with pytest.raises(ValueError, match='config.json: '):
    hf.load(directory)


def test_damaged_safetensors_is_named(tmp_path):
  directory = write(tmp_path / 'x')
  (directory / 'model.safetensors').write_bytes(b'\x08\x00\x00\x00\x00\x00\x00\x00{garbage')
  with pytest.raises(ValueError, match='model.safetensors is not a readable safetensors file'):
    hf.load(directory)


def test_damaged_tokenizer_is_named(tmp_path):
  directory = write(tmp_path / 'x')
  (directory / 'tokenizer.json').write_text('{"version": "1.0", "trunc')
  with pytest.raises(ValueError, match='tokenizer.json is not a readable tokenizer file'):
    hf.load_tokenizer(directory)


def _sharded(directory, names):
  directory.mkdir(parents=True)
  (directory / 'config.json').write_text(json.dumps(gpt2_config()))
  tensors = gpt2_tensors()
  weight_map = {k: names[i % len(names)] for i, k in enumerate(sorted(tensors))}
  (directory / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': weight_map}))
  return tensors, weight_map


@pytest.mark.parametrize('outside', ['../outside.safetensors', '/etc/passwd',
                                     'sub/../../outside.safetensors', 'link.safetensors'])
def test_shard_names_outside_the_directory_are_refused(tmp_path, outside, monkeypatch):
  tensors, weight_map = _sharded(tmp_path / 'ckpt', ['model-1.safetensors', outside])
  inside = {k: v for k, v in tensors.items() if weight_map[k] == 'model-1.safetensors'}
  safetensors_numpy.save_file(inside, str(tmp_path / 'ckpt' / 'model-1.safetensors'))
  rest = {k: v for k, v in tensors.items() if k not in inside}
  safetensors_numpy.save_file(rest, str(tmp_path / 'outside.safetensors'))  # a real file
  os.symlink(tmp_path / 'outside.safetensors', tmp_path / 'ckpt' / 'link.safetensors')
  opened = []
  real_load = safetensors_numpy.load_file
  monkeypatch.setattr(safetensors_numpy, 'load_file', lambda p: opened.append(p) or real_load(p))
  with pytest.raises(ValueError, match='outside the checkpoint directory'):
    hf.load(tmp_path / 'ckpt')
  assert opened == []  # refused before any shard was opened


def test_hub_cache_symlinks_into_blobs_are_followed(tmp_path):
  # huggingface_hub's layout: snapshots/<revision>/<file> -> ../../blobs/<hash>.
  repo = tmp_path / 'models--org--tiny'
  snapshot = repo / 'snapshots' / 'abc123'
  (repo / 'blobs').mkdir(parents=True)
  snapshot.mkdir(parents=True)
  write(tmp_path / 'plain')
  for name, blob in (('config.json', 'c0ffee'), ('model.safetensors', 'beef')):
    os.replace(tmp_path / 'plain' / name, repo / 'blobs' / blob)
    os.symlink(f'../../blobs/{blob}', snapshot / name)
  model, _ = hf.load(snapshot)
  assert model.spec.vocab_size == V


def test_confined_accepts_plain_names_and_refuses_escapes(tmp_path):
  assert hf_checks.confined(str(tmp_path), 'a/b.safetensors', 'x') == str(
      tmp_path / 'a' / 'b.safetensors')
  for bad in ('..', '../x', '/abs', 'a/../../x', '', None, 3):
    with pytest.raises(ValueError, match='x: '):
      hf_checks.confined(str(tmp_path), bad, 'x')
