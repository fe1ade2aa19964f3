"""Hugging Face checkpoints as ctr_jax models, read with numpy safetensors (no torch).

    from ctr_jax.pretrained import hf
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

`config_mapping` turns config.json into a model config, `param_mapping` the checkpoint's
tensors into the parameter tree; this module reads the files and checks the result. A new
architecture is one entry in each: `config_mapping.ARCHITECTURES` / `CONFIGS` and
`param_mapping.PARAMS`.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import models
from ctr_jax.pretrained import checks
from ctr_jax.pretrained.hf.config_mapping import model_config_from_hf
from ctr_jax.pretrained.hf.param_mapping import convert_params

__all__ = ['load', 'model_config_from_hf', 'read_config', 'read_tensors', 'convert_params',
           'load_tokenizer']


def read_config(directory) -> dict:
  path = os.path.join(os.fspath(directory), 'config.json')
  if not os.path.exists(path):
    raise ValueError(f'{directory} has no config.json; expected a Hugging Face checkpoint '
                     'directory')
  return checks.read_config(path)


def read_tensors(directory) -> dict[str, np.ndarray]:
  """Every tensor of model.safetensors, or of all shards named by its index file."""
  directory = os.fspath(directory)
  index = os.path.join(directory, 'model.safetensors.index.json')
  single = os.path.join(directory, 'model.safetensors')
  if os.path.exists(index):
    files = checks.shard_files(directory, index)
  elif os.path.exists(single):
    files = ['model.safetensors']
  else:
    raise ValueError(f'{directory} has neither model.safetensors nor '
                     'model.safetensors.index.json')
  tensors = {}
  for name in files:
    tensors.update(checks.load_safetensors(directory, name))
  return tensors


def load_tokenizer(directory):
  """The checkpoint's `tokenizers.Tokenizer` (from tokenizer.json), or None if it has none."""
  path = os.path.join(os.fspath(directory), 'tokenizer.json')
  if not os.path.exists(path):
    return None
  return checks.read_tokenizer(path)


def load(directory, *, dtype: str = 'float32', param_dtype: str | None = None):
  """(model, variables) of a Hugging Face checkpoint directory.

  `dtype` is the compute dtype and `param_dtype` (default: dtype) the parameters' dtype;
  'float32' reproduces the checkpoint's float32 logits. The parameter tree is checked leaf by
  leaf against the model's own. (`ctr_jax.pretrained.load` also takes a .gguf file.)
  """
  hf = read_config(directory)
  with checks.naming(os.path.join(os.fspath(directory), 'config.json')):
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
