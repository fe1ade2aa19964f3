"""The checks of a bench config (configs/bench/, fields in ctr_jax.bench.configs): each bad field
raises a ValueError that names it and what is allowed, before anything runs."""

from ctr_jax.bench import suite

SECTIONS = ('train', 'decode', 'generate', 'prefill', 'chunked', 'ttft', 'scaling')
DTYPES = ('float32', 'bfloat16')


def with_dtype(fields: dict, dtype: str) -> dict:
  """Model-config fields with the bench's dtype (a field the entry sets wins)."""
  return {'dtype': dtype, **dict(fields)}


def validate(config) -> None:
  """Raises ValueError naming the first bad field."""
  sections = [s for s in config.sections.split(',') if s]
  bad = sorted(set(sections) - set(SECTIONS))
  if bad or not sections:
    raise ValueError(f'bench.sections: got {config.sections!r}, allowed a comma-separated '
                     f'subset of {list(SECTIONS)}')
  if config.dtype not in DTYPES:
    raise ValueError(f'bench.dtype: got {config.dtype!r}, allowed {list(DTYPES)}')
  for field in ('warmup', 'repeats'):
    if config[field] < 1:
      raise ValueError(f'bench.{field}: got {config[field]}, must be >= 1')
  if 'decode' in sections and any(b < 1 for b in config.decode.batches):
    raise ValueError(f'bench.decode.batches: got {list(config.decode.batches)}, each must be >= 1')
  for i, entry in enumerate(config.train):
    suite.model_config(with_dtype(entry['model'], config.dtype))  # raises on a bad model field
    k, m = entry.get('k', 0), entry.get('m', 0)
    if m and not (entry['model'].get('kind') == 'context_ready' and 0 < m <= k):
      raise ValueError(f'bench.train[{i}].m: got {m}, allowed 0 (all iterations) or 1..k={k} '
                       'for a context-ready model')
  if 'chunked' in sections:
    _validate_chunked(config.chunked)
  if 'ttft' in sections:
    _validate_ttft(config.ttft)


def _validate_ttft(t) -> None:
  for field in ('models', 'prompt_lens'):
    if not list(t[field]):
      raise ValueError(f'bench.ttft.{field}: got an empty list, allowed a non-empty one')
  if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in t.prompt_lens):
    raise ValueError(f'bench.ttft.prompt_lens: got {list(t.prompt_lens)}, allowed ints >= 1')
  for field in ('chunk', 'passes', 'warmup', 'repeats'):
    if t[field] < 1:
      raise ValueError(f'bench.ttft.{field}: got {t[field]}, must be >= 1')
  if not t.tolerance >= 0:
    raise ValueError(f'bench.ttft.tolerance: got {t.tolerance}, allowed >= 0')
  for name in t.models:
    kind = suite.model_config({'name': name, 'vocab_size': t.vocab_size}).kind
    for method in t.methods[kind]:
      if method not in suite.FIRST_TOKEN_METHODS[kind]:
        raise ValueError(f'bench.ttft.methods.{kind}: got {method!r}, allowed '
                         f'{list(suite.FIRST_TOKEN_METHODS[kind])}')


def _validate_chunked(ch) -> None:
  for field in ('sizes', 'chunks', 'passes'):
    if not list(ch[field]):
      raise ValueError(f'bench.chunked.{field}: got an empty list, allowed a non-empty one')
  for field in ('chunks', 'passes'):
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in ch[field]):
      raise ValueError(f'bench.chunked.{field}: got {list(ch[field])}, allowed ints >= 1')
  if ch.tolerance_passes < 1:
    raise ValueError(f'bench.chunked.tolerance_passes: got {ch.tolerance_passes}, must be >= 1')
  if ch.prompt_len < 1:
    raise ValueError(f'bench.chunked.prompt_len: got {ch.prompt_len}, must be >= 1')
  if not ch.tolerance >= 0:
    raise ValueError(f'bench.chunked.tolerance: got {ch.tolerance}, allowed >= 0 (0: no '
                     'tolerance rows)')
  for name in ch.sizes:
    suite.model_config({'name': name, 'vocab_size': ch.vocab_size})  # raises on a bad size name
