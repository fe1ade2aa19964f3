"""The grain input pipeline: raw corpus -> tokens -> packed, shuffled, sharded batches.

Each split is tokenized once into a flat token stream (documents joined by the EOT token) and
cached as `<data_dir>/tokenizers/<name>_<vocab>_<split>_<tokenizer hash>.npy`, loaded
memory-mapped: uint16 when every id fits (vocab_size <= 65,536), int32 otherwise (int32 caches
written before are read as they are). A damaged cache file is deleted and written again.
OpenWebText and Wikipedia are read and tokenised straight from `manual_dir` by
`config.data.num_workers` processes (ctr_jax/data/parallel.py, with MB/s on stdout as it goes);
the embedded KJV goes through its TFDS builder. Preparation holds the data directory's lock
(ctr_jax/data/lock.py), so two processes preparing one data_dir take turns and the second only
reads; a data_dir already prepared is read without the lock.

The stream is cut into consecutive, non-overlapping windows of `T + 1` tokens; the trainer uses
`window[:-1]` as inputs and `window[1:]` as targets.

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
import tempfile

from absl import logging
import grain
import numpy as np
import tensorflow_datasets as tfds

from ctr_jax.data import common, kjv, lock, openwebtext, parallel, wikipedia
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


def _write_tokens(path: str, source, tok: tokenizer_lib.Tokenizer) -> None:
  """Tokenizes every document of `source`, each followed by EOT, into an .npy file."""
  dtype = parallel.token_dtype(tok.vocab_size)
  with common.atomic_output(path, 'wb') as f:
    f.write(parallel.npy_header(0, dtype))
    total = 0
    texts = _iter_texts(source)
    while True:
      batch = [t for _, t in zip(range(_READ_CHUNK), texts)]
      if not batch:
        break
      ids = [np.asarray(doc + [tok.eot_id], dtype=dtype) for doc in tok.encode_batch(batch)]
      chunk = np.concatenate(ids)
      f.write(chunk.tobytes())
      total += chunk.size
    f.seek(0)
    f.write(parallel.npy_header(total, dtype))


def _cache_path(name: str, split: str, tok: tokenizer_lib.Tokenizer, data_dir: str) -> str:
  with open(tok.path, 'rb') as f:
    tok_hash = hashlib.sha256(f.read()).hexdigest()[:12]
  return os.path.join(data_dir, 'tokenizers', f'{name}_{tok.vocab_size}_{split}_{tok_hash}.npy')


def _cached(path: str, split: str) -> np.ndarray | None:
  """The cache at `path`, or None when it is missing or damaged (deleted, with a warning)."""
  if not os.path.exists(path):
    return None
  try:
    return _read_tokens(path)
  except tokenizer_lib.DamagedCacheError as e:  # derived data: build it again
    logging.warning('%s; deleting it and tokenizing the %s split again', e, split)
    os.remove(path)
    return None


def _tokens(name: str, split: str, source, tok, data_dir: str) -> np.ndarray:
  path = _cache_path(name, split, tok, data_dir)
  tokens = _cached(path, split)
  if tokens is not None:
    return tokens
  _check_writable(data_dir)
  _write_tokens(path, source, tok)
  return _read_tokens(path)


# Token caches are uint16 where every id fits, else int32 (and int32 from before uint16 caches).
_CACHE_DTYPES = (np.dtype('<u2'), np.dtype('<i4'))


def _read_tokens(path: str) -> np.ndarray:
  """The memory-mapped token vector of a cache file; DamagedCacheError if unreadable."""
  try:
    tokens = np.load(path, mmap_mode='r')
  except (ValueError, OSError, EOFError) as e:  # truncated: "mmap length is greater than ..."
    raise tokenizer_lib.DamagedCacheError(
        f'the token cache {path} is damaged ({" ".join(str(e).split())})') from None
  if tokens.dtype not in _CACHE_DTYPES or tokens.ndim != 1:
    raise tokenizer_lib.DamagedCacheError(
        f'the token cache {path} holds {tokens.dtype} of shape {tokens.shape}, not a uint16 or '
        'int32 vector')
  return tokens


def default_data_dir() -> str:
  """Where datasets go when `config.data.data_dir` is empty: $TFDS_DATA_DIR or TFDS's default."""
  return os.path.expanduser(os.environ.get('TFDS_DATA_DIR', '~/tensorflow_datasets'))


def check_locations(data_dir, manual_dir) -> None:
  """Refuses cloud storage for data_dir / manual_dir in one line (the caches are memory-mapped
  and the archives read as local files); `gs://` is for workdirs (docs/notes.md)."""
  for field, value in (('data_dir', data_dir), ('manual_dir', manual_dir)):
    text = os.fspath(value) if value else ''
    if '://' in text and not text.startswith('file://'):
      raise ValueError(
          f'config.data.{field}={text!r} is on cloud storage, which the data pipeline does not '
          'read (token caches are memory-mapped, archives read as local files): copy it to a '
          'local or shared POSIX disk (or mount the bucket, e.g. with gcsfuse) and pass that '
          'path; workdirs may be gs:// (pip install -e ".[gcs]")')


def _local_path(value):
  text = os.fspath(value)
  return text[len('file://'):] if text.startswith('file://') else text


def _ready(name: str, data_dir: str, vocab_size: int) -> Dataset | None:
  """The dataset, if its tokenizer and both caches are already there and readable."""
  tok_path = tokenizer_lib.tokenizer_path(name, vocab_size, data_dir)
  if not os.path.exists(tok_path):
    return None
  try:
    tok = tokenizer_lib.load(tok_path, vocab_size)
    paths = [_cache_path(name, split, tok, data_dir) for split in ('train', 'validation')]
    if not all(os.path.exists(p) for p in paths):
      return None
    train, validation = (_read_tokens(p) for p in paths)
  except (ValueError, OSError):  # damaged: rebuilt (with a warning) under the lock
    return None
  return Dataset(name=name, tokenizer=tok, train_tokens=train, validation_tokens=validation)


def load(name: str,
         data_dir: str | os.PathLike | None,
         manual_dir: str | os.PathLike | None = None,
         vocab_size: int = 4096,
         max_tokenizer_train_bytes: int = tokenizer_lib.DEFAULT_MAX_TRAIN_BYTES,
         num_workers: int = 0,
         progress: bool = True) -> Dataset:
  """Prepares (first time only) and loads a tokenized dataset.

  Args:
    name: config.data.name, one of `BUILDERS`.
    data_dir: data directory ('' or None: `default_data_dir()`); tokenizer and token caches go to
      its `tokenizers/`, the KJV's TFDS dataset beside it.
    manual_dir: directory with the raw input of 'openwebtext' and 'wikipedia'.
    vocab_size: tokenizer vocabulary size.
    max_tokenizer_train_bytes: cap on the training text used to fit the tokenizer.
    num_workers: processes that read and tokenise 'openwebtext' / 'wikipedia' (0: every core).
    progress: print MB/s lines while tokenising those.

  Returns:
    The dataset with its tokenizer and token streams.

  Concurrent callers (several processes or hosts sharing `data_dir`) are safe: preparation holds
  the data directory's lock, and whoever comes second finds the caches and only reads them.
  """
  _check_name(name)
  check_locations(data_dir, manual_dir)
  data_dir = _local_path(data_dir or default_data_dir())
  manual_dir = _local_path(manual_dir) if manual_dir else None
  workers = parallel.resolve_workers(num_workers)
  ready = _ready(name, data_dir, vocab_size)
  if ready is not None:
    return ready
  module = _MANUAL_INPUT_MODULES.get(name)
  if module is not None:  # the input, checked before any work (and before waiting for the lock)
    if manual_dir is None:
      raise common.manual_dir_error(None, module.EXPECTED, module.SOURCE)
    module.find_inputs(manual_dir)  # Raises a one-line ValueError if unusable.
  _check_writable(data_dir)
  with lock.preparing(data_dir):
    if module is None:
      return _prepare_builder(name, data_dir, vocab_size, max_tokenizer_train_bytes)
    return _prepare_manual(name, module, data_dir, manual_dir, vocab_size,
                           max_tokenizer_train_bytes, workers, progress)


def _prepare_builder(name, data_dir, vocab_size, max_tokenizer_train_bytes) -> Dataset:
  """A TFDS builder's dataset (the embedded KJV), its tokenizer and token caches."""
  builder = BUILDERS[name](data_dir=data_dir, file_format='array_record')
  # TFDS writes a version directory only once it is complete (via a rename).
  if not builder.data_path.exists():
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig())
  sources = builder.as_data_source()
  tok = tokenizer_lib.get_tokenizer(
      name, vocab_size, data_dir, texts=lambda: _iter_texts(sources['train']),
      max_train_bytes=max_tokenizer_train_bytes)
  return Dataset(
      name=name,
      tokenizer=tok,
      train_tokens=_tokens(name, 'train', sources['train'], tok, data_dir),
      validation_tokens=_tokens(name, 'validation', sources['validation'], tok, data_dir),
  )


def _training_texts(module, manual_dir) -> Iterator[str]:
  """Training-split documents from the start of the corpus, to fit the tokenizer on."""
  for unit in module.iter_units(manual_dir):
    for doc_name, text in module.unit_documents(unit):
      if text and not common.is_validation(doc_name, module.VALIDATION_FRACTION):
        yield text


def _prepare_manual(name, module, data_dir, manual_dir, vocab_size, max_tokenizer_train_bytes,
                    workers, progress) -> Dataset:
  """OpenWebText / Wikipedia: tokenizer, then both caches in one parallel pass over the input."""
  tok = tokenizer_lib.get_tokenizer(
      name, vocab_size, data_dir, texts=lambda: _training_texts(module, manual_dir),
      max_train_bytes=max_tokenizer_train_bytes)
  paths = {split: _cache_path(name, split, tok, data_dir) for split in ('train', 'validation')}
  tokens = {split: _cached(path, split) for split, path in paths.items()}
  if any(t is None for t in tokens.values()):
    parallel.tokenize_corpus(
        module.iter_units(manual_dir), module.unit_documents, module.unit_size,
        module.VALIDATION_FRACTION, tok, paths['train'], paths['validation'], workers=workers,
        label=name, progress=progress)
    tokens = {split: _read_tokens(path) for split, path in paths.items()}
  return Dataset(name=name, tokenizer=tok, train_tokens=tokens['train'],
                 validation_tokens=tokens['validation'])


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
