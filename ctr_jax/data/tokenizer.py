"""Byte-level BPE tokenizer trained offline with HF `tokenizers`, cached as JSON.

The tokenizer for dataset `name` and vocabulary size `V` lives in
`<data_dir>/tokenizers/<name>_<V>.json`. It is trained once, on at most
`max_train_bytes` (50 MB by default) of training-split text taken in stored order,
and reused afterwards; a damaged cache file is deleted and trained again. The training
text order is the TFDS record order, which is itself a hash-shuffle of the documents,
so the cap samples the whole corpus rather than its first files.
"""

from collections.abc import Callable, Iterable, Iterator, Sequence
import dataclasses
import os

from absl import logging
import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from ctr_jax.data import common

EOT_TOKEN = '<|endoftext|>'
DEFAULT_MAX_TRAIN_BYTES = 50 * 2**20
# 256 byte symbols plus the end-of-text token.
MIN_VOCAB_SIZE = 257


def tokenizer_path(dataset_name: str, vocab_size: int, data_dir: str | os.PathLike) -> str:
  return os.path.join(os.fspath(data_dir), 'tokenizers', f'{dataset_name}_{vocab_size}.json')


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A trained byte-level BPE.

  Attributes:
    hf: the underlying `tokenizers.Tokenizer`.
    vocab_size: the requested size; every id is below it, so it is the embedding size.
      Tiny corpora can run out of merges, leaving `trained_vocab_size` smaller.
    eot_id: id of the end-of-text token that separates documents.
    path: the JSON file it was loaded from.
  """
  hf: tokenizers.Tokenizer
  vocab_size: int
  eot_id: int
  path: str

  @property
  def trained_vocab_size(self) -> int:
    return self.hf.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; a literal "<|endoftext|>" in it is encoded as plain text."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for many texts at once, using the library's thread pool."""
    # HF tokenizers always match special tokens in the input. Only the separators the
    # pipeline inserts may be EOT, so texts that spell it out are encoded piecewise.
    special = [i for i, t in enumerate(texts) if EOT_TOKEN in t]
    result = [e.ids for e in self.hf.encode_batch(list(texts))] if texts else []
    for i in special:
      head, *rest = texts[i].split(EOT_TOKEN)
      ids = self.hf.encode(head).ids
      for part in rest:
        # Neither half contains the whole special token, so both stay plain text.
        ids += self.hf.encode(EOT_TOKEN[:2]).ids + self.hf.encode(EOT_TOKEN[2:] + part).ids
      result[i] = ids
    return result

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids` (a list or array); EOT tokens are kept as "<|endoftext|>" by default."""
    return self.hf.decode([int(i) for i in np.asarray(ids).reshape(-1)],
                          skip_special_tokens=skip_special_tokens)


class DamagedCacheError(ValueError):
  """A cache file that cannot be read (truncated, overwritten): derived data, so rebuildable."""


def read_hf_tokenizer(path: str) -> tokenizers.Tokenizer:
  """`tokenizers.Tokenizer.from_file`, whose bare `Exception` becomes a ValueError naming `path`."""
  try:
    return tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except  (the library raises bare Exception)
    raise DamagedCacheError(f'{path} is not a readable tokenizer file ({" ".join(str(e).split())})'
                            ) from None


def _load(path: str, vocab_size: int) -> Tokenizer:
  hf = read_hf_tokenizer(path)
  eot_id = hf.token_to_id(EOT_TOKEN)
  if eot_id is None or hf.get_vocab_size() > vocab_size:
    raise ValueError(f'{path} is not a tokenizer written by ctr_jax.data.tokenizer for '
                     f'vocab_size={vocab_size}; delete it to retrain.')
  return Tokenizer(hf=hf, vocab_size=vocab_size, eot_id=eot_id, path=path)


def load(path: str, vocab_size: int) -> Tokenizer:
  """The tokenizer cached at `path` (a worker process loads the one its parent trained)."""
  return _load(path, vocab_size)


def _capped(texts: Iterable[str], max_bytes: int) -> Iterator[str]:
  seen = 0
  for text in texts:
    if seen >= max_bytes:
      return
    seen += len(text.encode('utf-8'))
    yield text


def train(texts: Iterable[str], vocab_size: int, max_train_bytes: int = DEFAULT_MAX_TRAIN_BYTES
          ) -> tokenizers.Tokenizer:
  """Trains a byte-level BPE on (at most `max_train_bytes` of) `texts`."""
  hf = tokenizers.Tokenizer(models.BPE())
  # GPT-2 style: split on the byte-level regex, no prefix space so decode(encode(s)) == s.
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=[EOT_TOKEN],
      # All 256 bytes, so any text is encodable even if the sample never saw a byte.
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  hf.train_from_iterator(_capped(texts, max_train_bytes), trainer=trainer)
  return hf


def get_tokenizer(dataset_name: str,
                  vocab_size: int,
                  data_dir: str | os.PathLike,
                  texts: Iterable[str] | Callable[[], Iterable[str]] | None = None,
                  max_train_bytes: int = DEFAULT_MAX_TRAIN_BYTES) -> Tokenizer:
  """Loads the cached tokenizer, or trains and caches it on the training `texts`.

  Args:
    dataset_name: names the cache file.
    vocab_size: vocabulary size (at least 257: 256 bytes and the EOT token).
    data_dir: the cache goes to `<data_dir>/tokenizers/<dataset_name>_<vocab_size>.json`.
    texts: training-split documents, or a function returning them (called only when
      training is needed). Required when no cached tokenizer exists.
    max_train_bytes: cap on the UTF-8 bytes of text used for training.

  Returns:
    The tokenizer.
  """
  if vocab_size < MIN_VOCAB_SIZE:
    raise ValueError(f'vocab_size={vocab_size} is too small for a byte-level BPE; it must be '
                     f'at least {MIN_VOCAB_SIZE} (256 bytes plus the end-of-text token).')
  path = tokenizer_path(dataset_name, vocab_size, data_dir)
  if os.path.exists(path):
    try:
      return _load(path, vocab_size)
    except DamagedCacheError as e:
      if texts is None:
        raise DamagedCacheError(f'{e}; delete it to retrain, or pass the training texts') from None
      # A cache: derived data. Retrain (training is deterministic, so token caches still match).
      logging.warning('%s; deleting it and training the tokenizer again', e)
      os.remove(path)
  if not os.path.exists(path):
    if texts is None:
      raise ValueError(f'No cached tokenizer at {path} and no training text was given.')
    if callable(texts):
      texts = texts()
    hf = train(texts, vocab_size, max_train_bytes)
    with common.atomic_output(path, 'w') as f:
      f.write(hf.to_str())
  return _load(path, vocab_size)
