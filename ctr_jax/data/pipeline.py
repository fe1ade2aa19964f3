"""The grain input pipeline: TFDS data source -> tokens -> packed, shuffled, sharded batches.

Each split is tokenized once into a flat int32 stream (documents joined by the EOT token)
and cached as `<data_dir>/tokenizers/<name>_<vocab>_<split>_<tokenizer hash>.npy`, loaded
memory-mapped; a damaged cache file is deleted and written again. The stream is cut into
consecutive, non-overlapping windows of `T + 1` tokens; the trainer uses `window[:-1]` as
inputs and `window[1:]` as targets.

Training batches come from a grain `MapDataset`: window indices are shuffled by seed
(reshuffled every epoch), repeated forever and grouped into *global* batches; each
process takes its contiguous slice `[i * B/P, (i + 1) * B/P)` of every global batch.
Concatenating the per-process batches in process order therefore gives exactly the
single-process batch, whatever the number of processes.

Iterator state (`get_state()`) is grain's plain dict `{'next_index': <int>}`: the number
of global batches consumed. It is JSON-serialisable, and independent of the number of
processes, so a run may resume on a different topology.
"""

from collections.abc import Iterator, Sequence
import dataclasses
import hashlib
import os
import struct
import tempfile

from absl import logging
import grain
import numpy as np
import tensorflow_datasets as tfds

from ctr_jax.data import common, kjv, openwebtext, wikipedia
from ctr_jax.data import tokenizer as tokenizer_lib

# config.data.name -> TFDS builder class.
BUILDERS = {
    'kjv_bible': kjv.KjvBible,
    'openwebtext': openwebtext.CtrOpenWebText,
    'wikipedia': wikipedia.CtrWikipedia,
}
# Builders that read their input from config.data.manual_dir.
_MANUAL_INPUT_MODULES = {
    'openwebtext': openwebtext,
    'wikipedia': wikipedia,
}
_READ_CHUNK = 512  # Documents decoded and tokenized per step.


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A tokenized dataset; the token arrays are read-only memory maps."""
  name: str
  tokenizer: tokenizer_lib.Tokenizer
  train_tokens: np.ndarray
  validation_tokens: np.ndarray


def _check_name(name: str) -> None:
  if name not in BUILDERS:
    raise ValueError(f'config.data.name={name!r} is not a known dataset; expected one of '
                     f'{sorted(BUILDERS)}.')


def _check_writable(data_dir: str) -> None:
  try:
    os.makedirs(data_dir, exist_ok=True)
    with tempfile.TemporaryFile(dir=data_dir):
      pass
  except OSError as e:
    raise ValueError(f'config.data.data_dir={data_dir!r} is not a writable directory: '
                     f'{e.strerror or e}.') from e


def _iter_texts(source) -> Iterator[str]:
  """Documents of a TFDS data source as `str`, in stored order."""
  for start in range(0, len(source), _READ_CHUNK):
    indices = list(range(start, min(start + _READ_CHUNK, len(source))))
    for record in source.__getitems__(indices):
      yield record['text'].decode('utf-8')


def _npy_header(length: int) -> bytes:
  """A .npy (format 1.0) header for an int32 vector, padded to a fixed 128 bytes.

  The fixed size lets us write the header before the length is known and patch it in
  place afterwards, so a split of any size is written in one streaming pass.
  """
  header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % length
  body = header.ljust(128 - 10 - 1) + '\n'
  return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(body)) + body.encode('latin1')


def _write_tokens(path: str, source, tok: tokenizer_lib.Tokenizer) -> None:
  """Tokenizes every document of `source`, each followed by EOT, into an .npy file."""
  with common.atomic_output(path, 'wb') as f:
    f.write(_npy_header(0))
    total = 0
    texts = _iter_texts(source)
    while True:
      batch = [t for _, t in zip(range(_READ_CHUNK), texts)]
      if not batch:
        break
      ids = [np.asarray(doc + [tok.eot_id], dtype='<i4') for doc in tok.encode_batch(batch)]
      chunk = np.concatenate(ids)
      f.write(chunk.tobytes())
      total += chunk.size
    f.seek(0)
    f.write(_npy_header(total))


def _tokens(name: str, split: str, source, tok, data_dir: str) -> np.ndarray:
  with open(tok.path, 'rb') as f:
    tok_hash = hashlib.sha256(f.read()).hexdigest()[:12]
  path = os.path.join(data_dir, 'tokenizers',
                      f'{name}_{tok.vocab_size}_{split}_{tok_hash}.npy')
  if os.path.exists(path):
    try:
      return _read_tokens(path)
    except tokenizer_lib.DamagedCacheError as e:  # derived data: build it again
      logging.warning('%s; deleting it and tokenizing the %s split again', e, split)
      os.remove(path)
  _check_writable(data_dir)
  _write_tokens(path, source, tok)
  return _read_tokens(path)


def _read_tokens(path: str) -> np.ndarray:
  """The memory-mapped int32 token vector of a cache file; DamagedCacheError if unreadable."""
  try:
    tokens = np.load(path, mmap_mode='r')
  except (ValueError, OSError, EOFError) as e:  # truncated: "mmap length is greater than ..."
    raise tokenizer_lib.DamagedCacheError(
        f'the token cache {path} is damaged ({" ".join(str(e).split())})') from None
  if tokens.dtype != np.dtype('<i4') or tokens.ndim != 1:
    raise tokenizer_lib.DamagedCacheError(
        f'the token cache {path} holds {tokens.dtype} of shape {tokens.shape}, not an int32 '
        'vector')
  return tokens


def default_data_dir() -> str:
  """Where datasets go when `config.data.data_dir` is empty: $TFDS_DATA_DIR or TFDS's default."""
  return os.path.expanduser(os.environ.get('TFDS_DATA_DIR', '~/tensorflow_datasets'))


def load(name: str,
         data_dir: str | os.PathLike | None,
         manual_dir: str | os.PathLike | None = None,
         vocab_size: int = 4096,
         max_tokenizer_train_bytes: int = tokenizer_lib.DEFAULT_MAX_TRAIN_BYTES) -> Dataset:
  """Prepares (first time only) and loads a tokenized dataset.

  Args:
    name: config.data.name, one of `BUILDERS`.
    data_dir: TFDS data directory ('' or None: `default_data_dir()`); tokenizer and token
      caches go to its `tokenizers/`.
    manual_dir: directory with the raw input of 'openwebtext' and 'wikipedia'.
    vocab_size: tokenizer vocabulary size.
    max_tokenizer_train_bytes: cap on the training text used to fit the tokenizer.

  Returns:
    The dataset with its tokenizer and token streams.

  Every cache is written atomically, so concurrent callers (e.g. several hosts sharing
  `data_dir`) are safe but each repeats the work; on many hosts, prepare once first.
  """
  _check_name(name)
  data_dir = os.fspath(data_dir or default_data_dir())
  builder = BUILDERS[name](data_dir=data_dir, file_format='array_record')
  # TFDS writes a version directory only once it is complete (via a rename).
  if not builder.data_path.exists():
    module = _MANUAL_INPUT_MODULES.get(name)
    if module is not None:
      if manual_dir is None:
        raise common.manual_dir_error(None, module.EXPECTED, module.SOURCE)
      module.find_inputs(manual_dir)  # Raises a one-line ValueError if unusable.
    _check_writable(data_dir)
    config = tfds.download.DownloadConfig(
        manual_dir=os.fspath(manual_dir) if manual_dir is not None else None)
    builder.download_and_prepare(download_config=config)
  sources = builder.as_data_source()
  tok_path = tokenizer_lib.tokenizer_path(name, vocab_size, data_dir)
  if not os.path.exists(tok_path):
    _check_writable(data_dir)
  tok = tokenizer_lib.get_tokenizer(
      name, vocab_size, data_dir, texts=lambda: _iter_texts(sources['train']),
      max_train_bytes=max_tokenizer_train_bytes)
  return Dataset(
      name=name,
      tokenizer=tok,
      train_tokens=_tokens(name, 'train', sources['train'], tok, data_dir),
      validation_tokens=_tokens(name, 'validation', sources['validation'], tok, data_dir),
  )


def _num_windows(tokens: np.ndarray, seq_len: int, split: str) -> int:
  if seq_len < 1:
    raise ValueError(f'seq_len={seq_len} must be positive.')
  n = len(tokens) // (seq_len + 1)
  if n == 0:
    raise ValueError(f'The {split} split has {len(tokens)} tokens, fewer than one window of '
                     f'seq_len + 1 = {seq_len + 1}.')
  return n


def _local_slice(global_batch_size: int, process_index: int, process_count: int) -> slice:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} must be in [0, process_count='
                     f'{process_count}).')
  if global_batch_size < 1 or global_batch_size % process_count:
    raise ValueError(f'global_batch_size={global_batch_size} must be a positive multiple of '
                     f'process_count={process_count}.')
  local = global_batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


class _Windows:
  """Maps a global batch of window indices to this process's int32 token windows."""

  def __init__(self, tokens: np.ndarray, seq_len: int, local: slice):
    self._tokens = tokens
    self._offsets = np.arange(seq_len + 1, dtype=np.int64)
    self._local = local

  def __call__(self, indices: np.ndarray) -> np.ndarray:
    starts = np.asarray(indices, dtype=np.int64)[self._local] * len(self._offsets)
    return np.asarray(self._tokens[starts[:, None] + self._offsets], dtype=np.int32)


def train_iterator(ds: Dataset,
                   seq_len: int,
                   global_batch_size: int,
                   seed: int = 0,
                   process_index: int = 0,
                   process_count: int = 1,
                   num_threads: int = 2,
                   prefetch: int = 8) -> grain.DatasetIterator:
  """An endless iterator of int32 `[global_batch_size / process_count, seq_len + 1]` batches.

  Windows are shuffled with `seed` and reshuffled each epoch; a batch may span two
  epochs. The iterator is grain's: `get_state()` returns `{'next_index': int}` (JSON-
  serialisable) and `set_state()` on a fresh iterator resumes the exact batch sequence.
  """
  local = _local_slice(global_batch_size, process_index, process_count)
  n = _num_windows(ds.train_tokens, seq_len, 'train')
  dataset = (grain.MapDataset.range(n)
             .shuffle(seed=seed)
             .repeat()
             .batch(global_batch_size)
             .map(_Windows(ds.train_tokens, seq_len, local)))
  options = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)
  return iter(dataset.to_iter_dataset(options))


class EvalBatches(Sequence):
  """A fixed, re-iterable sequence of evaluation batches (read lazily, in order)."""

  def __init__(self, dataset: grain.MapDataset):
    self._dataset = dataset

  def __len__(self) -> int:
    return len(self._dataset)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    if not -len(self) <= index < len(self):
      raise IndexError(index)
    return self._dataset[index % len(self)]


def eval_batches(ds: Dataset,
                 seq_len: int,
                 global_batch_size: int,
                 num_batches: int | None = None,
                 process_index: int = 0,
                 process_count: int = 1) -> EvalBatches:
  """Validation windows in stored order, as int32 `[global_batch_size / P, seq_len + 1]`.

  The last incomplete global batch is dropped; `num_batches` caps the count. Every call
  (and every process) sees the same global batches, so evaluation is deterministic.
  """
  local = _local_slice(global_batch_size, process_index, process_count)
  n = _num_windows(ds.validation_tokens, seq_len, 'validation')
  if n < global_batch_size:
    raise ValueError(f'The validation split has {n} windows of {seq_len + 1} tokens, fewer '
                     f'than global_batch_size={global_batch_size}.')
  dataset = grain.MapDataset.range(n).batch(global_batch_size, drop_remainder=True)
  if num_batches is not None:
    dataset = dataset[:num_batches]
  return EvalBatches(dataset.map(_Windows(ds.validation_tokens, seq_len, local)))
