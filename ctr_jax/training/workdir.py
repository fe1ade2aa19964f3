"""The workdir: its path (local or cloud), an exclusive lock, write checks and failure cleanup.

Every workdir file goes through `etils.epath`, so `--workdir=gs://bucket/run` works once
`pip install -e ".[gcs]"` has brought gcsfs (epath's GCS backend) and google-cloud-storage
(TensorBoard's), with the machine's credentials; orbax's tensorstore reads GCS itself
(launch/README.md, "Workdirs"; data dirs are another matter: local or shared POSIX only). Local
paths keep the POSIX guarantees (atomic rename, `fcntl` locks); on object stores a single object
write is atomic, and the lock is a lock file naming its holder.
"""

import fcntl
import json
import os
import socket
import sys
import time

from etils import epath

LOCK_NAME = '.ctr_jax.lock'


class WorkdirError(ValueError):
  """A workdir the run cannot use (reported as one line, exit code 2)."""


def resolve(workdir) -> epath.Path:
  """The workdir as an epath.Path: local paths absolute, `file://` URLs local, cloud URIs as is."""
  text = os.fspath(workdir) if not isinstance(workdir, str) else workdir
  if not text.strip():
    raise WorkdirError(f'--workdir={text!r} is empty; name a directory (e.g. --workdir=runs/x)')
  text = text.strip()
  if text.startswith('file://'):
    text = text[len('file://'):]
  if is_uri(text):
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))


def is_uri(path) -> bool:
  return '://' in os.fspath(path)


def is_local(path) -> bool:
  return not is_uri(path)


def ensure_writable(path: epath.Path) -> None:
  """Creates `path` (and parents) and writes a probe file: fails early, before any training."""
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f'.write_probe_{socket.gethostname()}_{os.getpid()}'
    probe.write_text('ok')
    probe.unlink()
  except OSError as e:
    raise WorkdirError(f'--workdir={path} is not writable: {e.strerror or e}') from None


def write_bytes_atomic(path: epath.Path, data: bytes) -> None:
  """A crash never leaves a half-written file: a local temp file renamed over the target, or
  one object upload (atomic on GCS / S3)."""
  path = epath.Path(path)
  if not is_local(path):
    path.write_bytes(data)
    return
  tmp = path.parent / f'{path.name}.tmp.{os.getpid()}'
  with open(tmp, 'wb') as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_json(path, payload: dict) -> None:
  write_bytes_atomic(epath.Path(path), json.dumps(payload, indent=2, sort_keys=True).encode())


# ------------------------------------------------------------------------------------------------
# The lock: one run per workdir.
# ------------------------------------------------------------------------------------------------


def _holder_text(info: dict) -> str:
  return f"host {info.get('host', '?')} pid {info.get('pid', '?')} (since {info.get('time', '?')})"


def _pid_alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, ValueError, TypeError):
    return True  # exists but not ours, or unreadable: assume alive
  return True


class Lock:
  """An exclusive lock on a workdir for the life of a run (taken by process 0 only).

  Local workdirs: an advisory `fcntl.flock` on `<workdir>/.ctr_jax.lock` (the kernel drops it
  when the holder dies, so a killed run never blocks its rerun); the file also names its holder
  for the error message. Cloud workdirs: the lock file alone, taken over when it names a dead
  process of this host.
  """

  def __init__(self, path: epath.Path):
    self.path = epath.Path(path) / LOCK_NAME
    self._fd = None
    self.note = None  # a line for the user when a stale lock was taken over

  def acquire(self) -> 'Lock':
    me = {'host': socket.gethostname(), 'pid': os.getpid(),
          'time': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
    if is_local(self.path):
      fd = self._flock()
      old = _read_info(os.pread(fd, 4096, 0))
      if old:  # the previous holder died without releasing: the kernel already did
        self.note = f'took over the stale lock of {_holder_text(old)}'
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(me).encode(), 0)
      self._fd = fd
    else:
      if self.path.exists():
        old = _read_info(self.path.read_bytes())
        if old.get('host') == me['host'] and not _pid_alive(old.get('pid')):
          self.note = f'took over the stale lock of {_holder_text(old)}'
        else:
          raise WorkdirError(
              f'{self.path.parent} is in use by another run ({_holder_text(old)}); if that run is '
              f'dead, delete {self.path}')
      self.path.write_text(json.dumps(me))
    if self.note:
      print(f'ctr_jax: note: {self.note}', file=sys.stderr, flush=True)
    return self

  def _flock(self) -> int:
    """An open descriptor of the lock file, flock'ed; a lock file that a failed run removed
    while this one waited to open it is opened again (a lock on a deleted file locks nothing)."""
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        holder = _read_info(os.read(fd, 4096))
        os.close(fd)
        raise WorkdirError(f'{self.path.parent} is in use by another run ({_holder_text(holder)});'
                           ' wait for it to finish or use another --workdir') from None
      try:
        if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
          return fd
      except FileNotFoundError:
        pass
      os.close(fd)

  def release(self, remove: bool = False) -> None:
    """Drops the lock; `remove` also deletes the lock file (before the lock is dropped, so that
    no other run can lock a file that is about to disappear)."""
    if self._fd is not None:
      if remove:
        try:
          os.unlink(self.path)
        except FileNotFoundError:
          pass
      else:
        os.ftruncate(self._fd, 0)  # an empty file: nobody to report as a stale holder
      os.close(self._fd)  # closing drops the flock
      self._fd = None
    elif not is_local(self.path):
      try:
        self.path.unlink()
      except FileNotFoundError:
        pass


def _read_info(raw: bytes) -> dict:
  try:
    info = json.loads(raw.decode() or '{}')
    return info if isinstance(info, dict) else {}
  except (ValueError, UnicodeDecodeError):
    return {}


# ------------------------------------------------------------------------------------------------
# Cleanup: a run that fails before its first checkpoint removes what it created, and only that.
# ------------------------------------------------------------------------------------------------


class Created:
  """What existed before a run: which directories it creates and the workdir's entries then.

  Other runs may share the parents the run creates (`--workdir=sweep/a` and `sweep/b` started
  together in a new `sweep/`), so cleanup removes a directory only once it is empty.
  """

  def __init__(self, path: epath.Path):
    self.path = epath.Path(path)
    # mkdir(parents=True) creates the workdir and the ancestors that do not exist yet.
    self.new_dirs = []  # deepest first
    node = self.path
    while not node.exists() and not _is_bucket(node):
      self.new_dirs.append(node)
      if node.parent == node:
        break
      node = node.parent
    self.before = set() if self.new_dirs else {p.name for p in self.path.iterdir()}

  def remove_entries(self, keep: tuple[str, ...] = ()) -> None:
    """Deletes the workdir's entries that are new since the run began, except `keep` and any
    directory holding a workdir lock (another run's workdir inside this one)."""
    try:
      for entry in list(self.path.iterdir()) if self.path.exists() else ():
        if entry.name in self.before or entry.name in keep:
          continue
        if not entry.is_dir():
          entry.unlink()
        elif not _holds_a_lock(entry):
          entry.rmtree()
    except OSError as e:  # cleanup must never hide the error that caused it
      print(f'ctr_jax: warning: could not clean up {self.path}: {e}', file=sys.stderr)

  def remove_new_dirs(self) -> None:
    """Removes the directories the run created, deepest first, each only while it is empty."""
    for directory in self.new_dirs:
      if not _remove_if_empty(directory):
        return


def _is_bucket(path: epath.Path) -> bool:
  """gs://bucket itself: never created or removed by a run (only paths inside it)."""
  return is_uri(path) and '/' not in os.fspath(path).split('://', 1)[1].strip('/')


def _holds_a_lock(directory: epath.Path) -> bool:
  try:
    return any(LOCK_NAME in files for _, _, files in directory.walk())
  except OSError:
    return True  # unreadable: not known to be this run's


def _remove_if_empty(directory: epath.Path) -> bool:
  """True when `directory` is gone (removed now or already); False when it holds anything."""
  try:
    if is_local(directory):
      os.rmdir(directory)  # refuses a non-empty directory, atomically
    elif directory.exists():
      directory.rmdir()
  except FileNotFoundError:
    return True
  except (OSError, ValueError):  # not empty (epath's cloud rmdir raises ValueError)
    return False
  return True


# ------------------------------------------------------------------------------------------------
# One run's hold on its workdir: creation record, lock, cleanup on failure.
# ------------------------------------------------------------------------------------------------


class Run:
  """Resolves and checks the workdir, locks it (process 0) and cleans up after a failure.

  `fail()` removes what this run created (its new top-level entries; the workdir and the parents
  it created, once they are empty) when nothing was saved yet; once a checkpoint exists
  (`saved = True`) the workdir is left for a resume.
  """

  def __init__(self, workdir, active: bool = True):
    self.path = resolve(workdir)
    self.active = active
    self.saved = False
    self._created = Created(self.path) if active else None
    self._lock = None
    ensure_writable(self.path)
    if active:
      self._lock = Lock(self.path).acquire()

  def __str__(self) -> str:
    return str(self.path)

  def _has_finished_checkpoint(self) -> bool:
    """A step directory of orbax's (a number; unfinished ones are `N.orbax-checkpoint-tmp*`)."""
    checkpoints = self.path / 'checkpoints'
    return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())

  def finish(self) -> None:
    if self._lock is not None:
      self._lock.release()
      self._lock = None

  def fail(self) -> None:
    # `saved` is set after a save returns; a failure between orbax's final rename and that (a
    # lost peer, a signal) has a finished checkpoint on disk all the same: keep it.
    if self._lock is None or self.saved or self._has_finished_checkpoint():
      self.finish()
      return
    # Entries first, while the lock keeps other runs out of this workdir; then the lock file
    # (if this run made it); then the directories this run made, if nobody else uses them.
    self._created.remove_entries(keep=(LOCK_NAME,))
    self._lock.release(remove=LOCK_NAME not in self._created.before)
    self._lock = None
    self._created.remove_new_dirs()


def write_config(path: epath.Path, payload: dict, restored_step: int | None) -> str:
  """config.json of a training run, written after a successful restore.

  A resumed run whose config differs keeps the earlier record as `config.step<N>.json` (N: the
  step it resumed from); evaluate / generate jobs write `<job>_config.json` beside it.
  """
  path = epath.Path(path)
  job = payload.get('job', 'train')
  if job != 'train':
    target = path / f'{job}_config.json'
  else:
    target = path / 'config.json'
    if restored_step is not None and target.exists():
      old = _read_info(target.read_bytes())
      if old != json.loads(json.dumps(payload)):
        write_bytes_atomic(path / f'config.step{restored_step}.json', target.read_bytes())
  write_json(target, payload)
  return str(target)
