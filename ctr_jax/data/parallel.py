"""Token caches on many cores: a corpus's units read, cleaned and tokenised by worker processes.

A corpus (OpenWebText, Wikipedia) comes as a sequence of *units* (a subset archive, a dump part, a
chunk of pages; see each module's `iter_units`). `tokenize_corpus` hands them to
`config.data.num_workers` worker processes (0: every core this process may use). Each worker reads
its unit, splits the documents by the stable hash of their names, tokenises them and writes its
tokens to a part file beside the cache; the main process reads the outer archives (where the
layout has one), hands out the units (at most two waiting per worker) and appends the part files
in unit order, so the caches are the same whatever the number of workers. The validation split
is written in the order of its documents' name hashes (not the corpus order), so the first
evaluation batches sample the whole corpus. With one worker, everything runs in this process.

Workers are fresh interpreters (`python -c 'from ctr_jax.data import parallel; parallel.serve()'`)
that import only the data layer: not forked from a process that may hold JAX threads, and not
re-importing the caller's `__main__` (as multiprocessing's spawn would, jax and the trainer
included). They speak length-prefixed pickles over their stdin / stdout; results are a few numbers
(the tokens go to files), so no pipe ever fills up both ways.

Progress goes to stdout every `report_every_s` seconds: MB of text read and tokenised per second.
Caches are written atomically (temporary files renamed at the end); the part files are removed
whatever happens.
"""

from collections.abc import Callable, Iterable, Iterator
import contextlib
import hashlib
import os
import pickle
import selectors
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

from ctr_jax.data import common
from ctr_jax.data import tokenizer as tokenizer_lib

_IN_FLIGHT_PER_WORKER = 2
_ENCODE_BATCH = 64  # training documents tokenised per call
_WORKER_ENV = {'TOKENIZERS_PARALLELISM': 'false', 'RAYON_NUM_THREADS': '1'}


def resolve_workers(num_workers: int) -> int:
  """`config.data.num_workers`: 0 means every core this process may use."""
  if num_workers < 0:
    raise ValueError(f'config.data.num_workers={num_workers}: must be >= 0 (0 = every core)')
  if num_workers:
    return num_workers
  return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


def token_dtype(vocab_size: int) -> np.dtype:
  """uint16 where every id fits (vocab_size <= 65,536), else int32."""
  return np.dtype('<u2') if vocab_size <= 2**16 else np.dtype('<i4')


def npy_header(length: int, dtype: np.dtype) -> bytes:
  """A .npy (format 1.0) header for a vector, padded to a fixed 128 bytes.

  The fixed size lets a writer put the header first and patch the length in place afterwards, so
  a split of any size is written in one streaming pass.
  """
  header = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (dtype.str, length)
  body = header.ljust(128 - 10 - 1) + '\n'
  return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(body)) + body.encode('latin1')


def _order_key(name: str) -> int:
  return int.from_bytes(hashlib.sha256(name.encode('utf-8')).digest()[8:16], 'little')


# ------------------------------------------------------------------------------------------------
# What a worker does with one unit.
# ------------------------------------------------------------------------------------------------

_STATE = {}


def init_worker(tokenizer_path: str, vocab_size: int) -> None:
  _STATE['tokenizer'] = tokenizer_lib.load(tokenizer_path, vocab_size)


def process_unit(documents: Callable, unit, prefix: str, fraction: float, dtype: str) -> dict:
  """Tokenises one unit: training tokens to `<prefix>.train`, validation documents to
  `<prefix>.validation` with their order keys and lengths in `<prefix>.index.npy`."""
  tok = _STATE['tokenizer']
  stats = {'documents': 0, 'text_bytes': 0, 'train_tokens': 0, 'validation_tokens': 0}
  keys, lengths, batch = [], [], []
  with open(prefix + '.train', 'wb') as train, open(prefix + '.validation', 'wb') as validation:

    def flush():
      if batch:
        ids = np.concatenate([np.asarray(doc + [tok.eot_id], dtype=dtype)
                              for doc in tok.encode_batch(batch)])
        train.write(ids.tobytes())
        stats['train_tokens'] += ids.size
        batch.clear()

    for name, text in documents(unit):
      if not text:
        continue
      stats['documents'] += 1
      stats['text_bytes'] += len(text.encode('utf-8'))
      if common.is_validation(name, fraction):
        ids = np.asarray(tok.encode(text) + [tok.eot_id], dtype=dtype)
        validation.write(ids.tobytes())
        keys.append(_order_key(name))
        lengths.append(ids.size)
        stats['validation_tokens'] += ids.size
      else:
        batch.append(text)
        if len(batch) >= _ENCODE_BATCH:
          flush()
    flush()
  np.save(prefix + '.index.npy', np.array([keys, lengths], dtype=np.uint64).reshape(2, -1))
  return stats


# ------------------------------------------------------------------------------------------------
# The workers: fresh interpreters speaking length-prefixed pickles.
# ------------------------------------------------------------------------------------------------


def _send(stream, message) -> None:
  data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
  view = memoryview(struct.pack('<Q', len(data)) + data)
  while view:  # an unbuffered pipe may take part of it
    written = stream.write(view)
    view = view[written or 0:]
  stream.flush()


def _read_exact(stream, size: int) -> bytes:
  parts = []
  while size:
    part = stream.read(size)
    if not part:
      break
    parts.append(part)
    size -= len(part)
  return b''.join(parts)


def _recv(stream):
  """One message, or None at the end of the stream. The parent reads unbuffered pipes: a buffer
  could hold a second reply that `select` would then never report."""
  head = _read_exact(stream, 8)
  if len(head) < 8:
    return None
  (size,) = struct.unpack('<Q', head)
  data = _read_exact(stream, size)
  return pickle.loads(data) if len(data) == size else None


def _one_line(error: BaseException) -> str:
  return ' '.join(str(error).split()) or type(error).__name__


def serve() -> None:
  """A worker's loop: (function, args) to initialise, then (task id, function, args) until EOF."""
  out = os.fdopen(os.dup(1), 'wb')
  os.dup2(2, 1)  # a stray print must not corrupt the protocol
  sys.stdout = sys.stderr
  source = sys.stdin.buffer
  first = _recv(source)
  if first is None:
    return
  fn, args = first
  fn(*args)
  while (message := _recv(source)) is not None:
    task_id, fn, args = message
    try:
      reply = (task_id, 'ok', fn(*args))
    except Exception as e:  # pylint: disable=broad-except  (sent back and raised there)
      reply = (task_id, 'value_error' if isinstance(e, ValueError) else 'error', _one_line(e))
    _send(out, reply)


class _Workers:
  """`count` worker processes; `run` maps tasks over them and yields results in task order."""

  def __init__(self, count: int, initializer: Callable, initargs: tuple):
    env = {**os.environ, **_WORKER_ENV}
    command = [sys.executable, '-c', 'from ctr_jax.data import parallel; parallel.serve()']
    self.procs = []
    for _ in range(count):
      proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                              bufsize=0)
      self.procs.append(proc)
      _send(proc.stdin, (initializer, initargs))

  def run(self, fn: Callable, tasks: Iterable[tuple], describe: Callable) -> Iterator:
    load = [0] * len(self.procs)
    pending, done, described = {}, {}, {}
    next_id = next_out = 0
    tasks = iter(tasks)
    exhausted = False
    with selectors.DefaultSelector() as selector:
      for index, proc in enumerate(self.procs):
        selector.register(proc.stdout, selectors.EVENT_READ, index)
      while True:
        while (not exhausted and min(load) < _IN_FLIGHT_PER_WORKER
               and len(done) < 4 * len(self.procs)):
          args = next(tasks, None)
          if args is None:
            exhausted = True
            break
          worker = load.index(min(load))
          described[next_id] = describe(args)
          _send(self.procs[worker].stdin, (next_id, fn, args))
          load[worker] += 1
          pending[next_id] = worker
          next_id += 1
        while next_out in done:
          yield done.pop(next_out)
          described.pop(next_out, None)
          next_out += 1
        if not pending:
          # Everything sent has been yielded: end, or hand out more. (Waiting here would hang
          # when the results in hand had stopped the hand-out above and were all yielded.)
          if exhausted:
            return
          continue
        for key, _ in selector.select():
          worker = key.data
          reply = _recv(self.procs[worker].stdout)
          if reply is None:
            code = self.procs[worker].wait()
            busy = [described[t] for t, w in pending.items() if w == worker]
            raise RuntimeError(f'a preparation worker (pid {self.procs[worker].pid}) ended with '
                               f'exit code {code} while reading {", ".join(busy) or "nothing"}')
          task_id, status, payload = reply
          load[worker] -= 1
          del pending[task_id]
          if status == 'value_error':
            raise ValueError(payload)
          if status != 'ok':
            raise RuntimeError(f'preparing {described[task_id]} failed: {payload}')
          done[task_id] = payload

  def close(self, kill: bool = False) -> None:
    for proc in self.procs:
      with contextlib.suppress(OSError):
        if kill:
          proc.kill()
        else:
          proc.stdin.close()
    for proc in self.procs:
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
      with contextlib.suppress(OSError):
        proc.stdout.close()


@contextlib.contextmanager
def _sequential_tokenizer() -> Iterator[None]:
  """One worker in this process: the tokenizer's own thread pool off, as in a worker process."""
  saved = {k: os.environ.get(k) for k in _WORKER_ENV}
  os.environ.update(_WORKER_ENV)
  try:
    yield
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value


def _map(workers: int, fn: Callable, tasks: Iterable[tuple], init: tuple,
         describe: Callable) -> Iterator:
  if workers == 1:
    with _sequential_tokenizer():
      init[0](*init[1])
      for args in tasks:
        yield fn(*args)
    return
  pool = _Workers(workers, *init)
  try:
    yield from pool.run(fn, tasks, describe)
  except BaseException:
    pool.close(kill=True)
    raise
  pool.close()


# ------------------------------------------------------------------------------------------------
# The caches.
# ------------------------------------------------------------------------------------------------


class _Progress:
  def __init__(self, label: str, workers: int, every_s: float, enabled: bool):
    self.label, self.workers, self.every_s, self.enabled = label, workers, every_s, enabled
    self.start = self.last = time.perf_counter()
    self.totals = {'documents': 0, 'text_bytes': 0, 'input_bytes': 0, 'train_tokens': 0,
                   'validation_tokens': 0, 'units': 0}

  def add(self, stats: dict, input_bytes: int) -> None:
    for key in ('documents', 'text_bytes', 'train_tokens', 'validation_tokens'):
      self.totals[key] += stats[key]
    self.totals['input_bytes'] += input_bytes
    self.totals['units'] += 1
    now = time.perf_counter()
    if now - self.last >= self.every_s:
      self.last = now
      self.say('preparing')

  def result(self) -> dict:
    seconds = time.perf_counter() - self.start
    return {**self.totals, 'seconds': seconds, 'workers': self.workers,
            'text_mb_per_s': self.totals['text_bytes'] / 1e6 / max(seconds, 1e-9),
            'input_mb_per_s': self.totals['input_bytes'] / 1e6 / max(seconds, 1e-9)}

  def say(self, what: str) -> None:
    if not self.enabled:
      return
    r = self.result()
    tokens = r['train_tokens'] + r['validation_tokens']
    print(f"ctr_jax: {what} {self.label}: {r['text_bytes'] / 1e6:,.1f} MB of text in "
          f"{r['seconds']:,.0f} s, {r['text_mb_per_s']:,.2f} MB/s ({self.workers} worker"
          f"{'s' if self.workers > 1 else ''}); {r['documents']:,} documents, {tokens:,} tokens, "
          f"{r['input_bytes'] / 1e6:,.1f} MB of input", flush=True)


def _append(out, path: str) -> None:
  with open(path, 'rb') as f:
    shutil.copyfileobj(f, out, 2**22)
  os.remove(path)


def tokenize_corpus(units: Iterable, documents: Callable, unit_size: Callable, fraction: float,
                    tok: tokenizer_lib.Tokenizer, train_path: str, validation_path: str, *,
                    workers: int, label: str, progress: bool = True,
                    report_every_s: float = 10.0) -> dict:
  """Writes the train and validation token caches of a corpus; returns the totals and the rate.

  Args:
    units: the corpus's units in order (read lazily: the main process reads outer archives here).
    documents: `documents(unit)` yields `(name, text)`; a module-level function (workers import it).
    unit_size: input bytes of a unit, for the progress lines.
    fraction: the share of documents (by name hash) that goes to validation.
    tok: the trained tokenizer.
    train_path, validation_path: the .npy caches to write (atomically).
    workers: worker processes (1: this process alone).
    label: the corpus's name in the progress lines.
  """
  dtype = token_dtype(tok.vocab_size)
  directory = os.path.dirname(train_path)
  os.makedirs(directory, exist_ok=True)
  parts = tempfile.mkdtemp(dir=directory, prefix=f'.{os.path.basename(train_path)}.parts-')
  meter = _Progress(label, workers, report_every_s, progress)
  sizes = {}

  def tasks():
    for index, unit in enumerate(units):
      sizes[index] = unit_size(unit)
      yield (documents, unit, os.path.join(parts, str(index)), fraction, dtype.str)

  def describe(args) -> str:  # the unit's file (or archive member) for error messages
    unit = args[1]
    return next((u for u in unit[1:3] if isinstance(u, str) and os.sep in u), str(unit[1]))

  try:
    with common.atomic_output(train_path) as train, \
        common.atomic_output(validation_path) as validation:
      train.write(npy_header(0, dtype))
      total = 0
      results = _map(workers, process_unit, tasks(),
                     (init_worker, (tok.path, tok.vocab_size)), describe)
      for index, stats in enumerate(results):
        _append(train, os.path.join(parts, f'{index}.train'))
        total += stats['train_tokens']
        meter.add(stats, sizes.pop(index))
      train.seek(0)
      train.write(npy_header(total, dtype))
      _write_validation(validation, parts, meter.totals['units'], dtype)
  finally:
    shutil.rmtree(parts, ignore_errors=True)
  meter.say('prepared')
  return meter.result()


def _write_validation(out, parts: str, count: int, dtype: np.dtype) -> None:
  """The validation documents of every unit, in the order of their name hashes."""
  docs = []  # (order key, unit, offset, length)
  for unit in range(count):
    keys, lengths = np.load(os.path.join(parts, f'{unit}.index.npy'))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else []
    docs.extend(zip(keys.tolist(), [unit] * len(keys), list(map(int, offsets)),
                    lengths.tolist()))
  docs.sort()
  out.write(npy_header(sum(d[3] for d in docs), dtype))
  maps = {}
  for _, unit, offset, length in docs:
    if unit not in maps:
      path = os.path.join(parts, f'{unit}.validation')
      maps[unit] = np.memmap(path, dtype=dtype, mode='r') if os.path.getsize(path) else None
    out.write(np.asarray(maps[unit][offset:offset + length]).tobytes())
