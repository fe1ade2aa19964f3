"""Pretrained checkpoints as ctr_jax models: Hugging Face directories, GGUF files, packaged models.

    from ctr_jax import pretrained
    model, variables = pretrained.load('/path/to/gemma-3-1b-it')        # or a .gguf file
    tokenizer = pretrained.load_tokenizer('/path/to/gemma-3-1b-it')     # tokenizers.Tokenizer
    model, variables, tokenizer = pretrained.pretrained('gemma3_270m')  # a pip-packaged model

Every file is treated as untrusted input (`checks`): a damaged or hostile file ends in one
ValueError naming the file. The readers: `hf` (config.json + safetensors), `gguf_reader` (llama.cpp's
format, dequantized to float32) and `gguf_tokenizer`; `packaged` finds the pip-installed files.
"""

import os

from ctr_jax.pretrained import checks, gguf_reader, gguf_tokenizer, hf, packaged
from ctr_jax.pretrained.packaged import MODELS, path, pretrained

__all__ = ['MODELS', 'checks', 'gguf_reader', 'gguf_tokenizer', 'hf', 'load', 'load_tokenizer',
           'packaged', 'path', 'pretrained']


def _is_gguf(path_or_dir) -> bool:
  return os.fspath(path_or_dir).endswith('.gguf')


def load(path_or_dir, *, dtype: str = 'float32', param_dtype: str | None = None):
  """(model, variables) of a Hugging Face checkpoint directory or a .gguf file.

  `dtype` is the compute dtype and `param_dtype` (default: dtype) the parameters' dtype;
  'float32' reproduces the checkpoint's float32 logits.
  """
  reader = gguf_reader if _is_gguf(path_or_dir) else hf
  return reader.load(path_or_dir, dtype=dtype, param_dtype=param_dtype)


def load_tokenizer(path_or_dir):
  """The `tokenizers.Tokenizer` of a .gguf file or a checkpoint directory (None if it has none)."""
  reader = gguf_reader if _is_gguf(path_or_dir) else hf
  return reader.load_tokenizer(path_or_dir)
