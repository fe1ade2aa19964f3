"""One preparation of a data directory at a time: an exclusive `fcntl.flock` on
`<data_dir>/.ctr_jax_prepare.lock` while a dataset, its tokenizer or its token caches are built.

A second process (another process of the same run, or a second `prepare` job) waits for the lock,
then finds the caches built and only reads them. There is no time limit on the wait: it lasts as
long as the preparing process lives, and the kernel drops the lock when that process ends or dies
(the waiter then goes on, and builds what is still missing). The file names its holder for the
waiting message. The same pattern as the workdir lock (ctr_jax/training/workdir.py), kept here
because the data layer does not import the training layer.
"""

from collections.abc import Iterator
import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time

LOCK_NAME = '.ctr_jax_prepare.lock'
# Filesystems without flock support (some network mounts): go on unlocked, with a warning.
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _holder(fd: int) -> str:
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or '{}')
  except (ValueError, UnicodeDecodeError, OSError):
    info = {}
  if not isinstance(info, dict) or not info:
    return 'another process'
  return f"host {info.get('host', '?')} pid {info.get('pid', '?')} (since {info.get('time', '?')})"


@contextlib.contextmanager
def preparing(data_dir: str | os.PathLike) -> Iterator[None]:
  """Holds the data directory's preparation lock for the `with` block (waits for it if held)."""
  data_dir = os.fspath(data_dir)
  os.makedirs(data_dir, exist_ok=True)
  path = os.path.join(data_dir, LOCK_NAME)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  locked = False
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      locked = True
    except BlockingIOError:
      start = time.monotonic()
      print(f'ctr_jax: {data_dir} is being prepared by {_holder(fd)}; waiting for it to finish',
            file=sys.stderr, flush=True)
      fcntl.flock(fd, fcntl.LOCK_EX)  # releases the GIL while it waits
      locked = True
      print(f'ctr_jax: waited {time.monotonic() - start:.0f} s for the preparation of {data_dir}',
            file=sys.stderr, flush=True)
    except OSError as e:
      if e.errno not in _UNSUPPORTED:
        raise
      print(f'ctr_jax: warning: {path}: this filesystem has no file locks ({e.strerror}); '
            'preparing without one (two preparations of one data_dir at once may then fail)',
            file=sys.stderr, flush=True)
    if locked:
      me = {'host': socket.gethostname(), 'pid': os.getpid(),
            'time': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(me).encode(), 0)
    yield
  finally:
    if locked:
      os.ftruncate(fd, 0)
    os.close(fd)  # closing drops the flock
