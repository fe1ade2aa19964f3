"""Stopping a multi-process run together (docs/reliability.md, rows 28 and 29).

Preemption (`Stopper`). One process reads the run's Python handler (`signals.Signals`) and stops
after the step in progress. In a multi-process run a signal reaches one process (or each at its own moment); a
process that stopped alone would enter orbax's collective save while the others run the next
step's collectives, and both would hang. There `Stopper` asks JAX's preemption sync point
(`multihost_utils.reached_preemption_sync_point`) after every step. `jax.distributed.initialize`
installs JAX's own SIGTERM handler (a Python handler would replace it, and JAX would never hear
the signal), which tells the coordination service; the service takes the furthest process's step
count plus one, and every process hears True after that same step. Checked on jax 0.10.2 with two
CPU processes (gloo), a signal to one of them or to both at different moments. The count given to
JAX is this run's steps (1, 2, ...), not the global step: a signal that arrives before the loop
(during the restore or data set-up) is synchronised at count 1, which a resumed run's global steps
would never meet. SIGINT (Ctrl-C) is sent on to JAX's handler as a SIGTERM during the loop (by
`signals.Signals`), so it stops every process the same way; a second Ctrl-C interrupts at once.
A SIGTERM outside the loop (set-up, final evaluation) reaches JAX's handler only: the run stops
after its first step if one is left, else it ends as it would have.

A lost process (`watch_peers`). A process that is killed (SIGKILL, the OOM killer, a lost host)
leaves the others blocked in a collective, or failing in one (gloo: "Connection reset by peer"),
until JAX's coordination service misses its heartbeats and aborts them with a long log. Here every
process writes a heartbeat to the distributed runtime's key-value store every `interval` seconds
(a tenth of `config.distributed.peer_timeout_seconds`, within [0.5, 5] s) and reads the others'.
A process whose heartbeat has not changed for `peer_timeout_seconds` is lost: each survivor prints
one line, `ctr_jax: error: process N (host H pid P) stopped responding (...); the last checkpoint
is step S in DIR`, and exits with status 3. The bound: at most `peer_timeout_seconds` plus two
intervals after the lost process's last heartbeat (70 s by default, 12 s at 10 s). JAX's own
heartbeat timeout is set to `HEARTBEAT_FACTOR` times that (see `heartbeat_seconds`), so JAX's abort
does not come first. Process 0 hosts the key-value store and JAX's coordination service: a survivor
that is process 0 waits (at most two intervals) for the others to read the verdict before it
exits, since its exit ends the service. When process 0 itself is lost, JAX ends the other
processes at once with its own fatal log ("Terminating process because the JAX distributed service
detected fatal errors"): its error callback cannot be replaced from Python on jax 0.10.2 (a Python
callback fails with std::bad_cast), so no line of ours comes first there.

A checkpoint being written when a process is lost is never taken for a finished one: orbax writes
into `checkpoints/N.orbax-checkpoint-tmp-*` and renames it to `N` only when every process has
written its part; the line names the newest finished step, and a rerun resumes from it (the
unfinished directory is ignored and replaced at the next save of that step).
"""

import json
import os
import socket
import sys
import threading
import time

import jax
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils

from ctr_jax.training import checkpointing, signals
from ctr_jax.training import workdir as workdir_lib

DEFAULT_PEER_TIMEOUT = 60
PEER_TIMEOUT_RANGE = (5, 3600)  # below 5 s a busy host is taken for a lost one
# JAX's service may notice a dead process half its heartbeat timeout after the death: 3 x the
# bound keeps that (1.5 x) after ours (1 x plus two intervals).
HEARTBEAT_FACTOR = 3
EXIT_LOST_PEER = 3  # main.py's status for a failed run
_KEYS = 'ctr_jax/peers/'  # in the distributed runtime's key-value store


def check_peer_timeout(value) -> None:
  """Raises a one-line ValueError for an unusable `config.distributed.peer_timeout_seconds`."""
  low, high = PEER_TIMEOUT_RANGE
  if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
    raise ValueError(f'config.distributed.peer_timeout_seconds: must be an integer in '
                     f'[{low}, {high}] (seconds until a silent process counts as lost), got '
                     f'{value!r}')


def peer_timeout(dist_config) -> int:
  """`config.distributed.peer_timeout_seconds`, checked (configs saved before it: the default)."""
  value = dist_config.get('peer_timeout_seconds', DEFAULT_PEER_TIMEOUT)
  check_peer_timeout(value)
  return value


def heartbeat_seconds(dist_config) -> int:
  """`jax.distributed.initialize`'s heartbeat_timeout_seconds: after our bound, never before."""
  return HEARTBEAT_FACTOR * peer_timeout(dist_config)


def _sync_manager():
  return getattr(jax_distributed.global_state, 'preemption_sync_manager', None)


def synchronised() -> bool:
  """Whether the processes of this run stop together through JAX's preemption sync point: more
  than one process and JAX's preemption service on (warned about once when it is off)."""
  if jax.process_count() == 1:
    return False
  if _sync_manager() is None:
    if jax.process_index() == 0:
      print('ctr_jax: warning: JAX\'s preemption service is off (jax_enable_preemption_service'
            ' or no jax.distributed.initialize): a SIGTERM will not stop the processes together',
            file=sys.stderr, flush=True)
    return False
  return True


class Stopper:
  """Whether the train loop stops after a step for a signal: the same answer on every process.

  `after_step()` must be called once after every step, on every process (JAX's sync point counts
  the calls). One process (or several without JAX's preemption service) reads the run's
  `signals.Signals`; several ask JAX's sync point, which the SIGTERM to any of them (and a Ctrl-C,
  sent on by `Signals`) reaches.
  """

  def __init__(self, stop_signals: signals.Signals, active: bool):
    self.signalled = False  # a stop for a signal is due after this step
    self._signals = stop_signals
    self._active = active
    self._multi = active and stop_signals.forward_to_jax
    self._count = 0  # this run's steps, JAX's sync counter (the module docstring says why)

  def after_step(self) -> bool:
    if self._multi:
      self._count += 1
      if multihost_utils.reached_preemption_sync_point(self._count):
        self.signalled = True
    elif self._active and self._signals.received is not None:
      self.signalled = True
    return self.signalled


class _Watch:
  """Heartbeats through the key-value store and the verdict on a lost process (module docstring).

  Two daemon threads: one talks to the store (an RPC to a lost host may block), the other judges
  from what the first saw and ends the process.
  """

  def __init__(self, client, timeout: int, workdir: str, *, index: int, count: int):
    self.client = client
    self.index, self.count = index, count
    self.timeout = timeout
    self.interval = min(5.0, max(0.5, timeout / 10))
    self.workdir = workdir
    now = time.monotonic()
    self.reached = now  # the last time the key-value store answered
    self.seen = {j: now for j in range(self.count) if j != self.index}  # a peer's last beat
    # The read before the one that saw that beat: the beat was written after it. (A beat seen
    # just now may have been written just before the peer died.)
    self.written_after = dict.fromkeys(self.seen, -1.0)
    self.beats, self.who, self.exited, self.verdict = {}, {}, set(), None
    self.lock = threading.Lock()
    self.stopped = threading.Event()
    self.writing = threading.Lock()  # this process's last word ('exit', 'lost') stays the last
    self.ending = threading.Lock()
    self.threads = [threading.Thread(target=self._beat, name='ctr_jax_beat', daemon=True),
                    threading.Thread(target=self._judge, name='ctr_jax_judge', daemon=True)]

  def start(self) -> None:
    self.client.key_value_set(f'{_KEYS}who/{self.index}',
                              f'host {socket.gethostname()} pid {os.getpid()}',
                              allow_overwrite=True)
    for thread in self.threads:
      thread.start()

  def stop(self) -> None:
    self._last_word('exit')  # peers no longer count this process's silence
    for thread in self.threads:
      thread.join(timeout=self.interval + 1)

  def alive_since(self, start: float) -> bool:
    with self.lock:
      return all(self.written_after[j] >= start or j in self.exited for j in self.seen)

  def _beat(self) -> None:
    count = 0
    while not self.stopped.is_set():
      try:
        with self.writing:
          if self.stopped.is_set():
            return
          self.client.key_value_set(f'{_KEYS}beat/{self.index}', str(count),
                                    allow_overwrite=True)
        count += 1
        entries = self.client.key_value_dir_get(_KEYS)
      except Exception:  # pylint: disable=broad-except  (the judge counts the silence)
        self.stopped.wait(self.interval)
        continue
      self._read(entries)
      self.stopped.wait(self.interval)

  def _read(self, entries) -> None:
    now = time.monotonic()
    with self.lock:
      previous, self.reached = self.reached, now
      for key, value in entries:
        kind, _, name = key[len(_KEYS):].partition('/')
        if kind == 'verdict':
          self.verdict = json.loads(value)
        elif not name.isdigit() or int(name) == self.index:
          continue
        elif kind == 'who':
          self.who[int(name)] = value
        elif kind == 'beat':
          j = int(name)
          if value in ('exit', 'lost'):
            self.exited.add(j)
          elif self.beats.get(j) != value:
            self.beats[j], self.seen[j], self.written_after[j] = value, now, previous

  def _judge(self) -> None:
    while not self.stopped.wait(self.interval / 2):
      lost = self._lost()
      if lost is not None:
        self._end(*lost)

  def _lost(self):
    """(process, reason, publish) of a lost process, or None."""
    now = time.monotonic()
    with self.lock:
      if self.verdict is not None:
        return self.verdict['process'], self.verdict['reason'], False
      if now - self.reached > self.timeout:
        return 0, (f'this process has not reached the key-value store it hosts for more '
                   f'than {self.timeout} s'), False
      for j, seen in sorted(self.seen.items()):
        if j not in self.exited and now - seen > self.timeout:
          return j, (f'no heartbeat for more than {self.timeout} s: killed, crashed, or its '
                     f'host is down'), True
    return None

  def _end(self, process: int, reason: str, publish: bool) -> None:
    if not self.ending.acquire(blocking=False):
      return
    who = self.who.get(process, 'host and pid unknown')
    print(f'ctr_jax: error: process {process} ({who}) stopped responding ({reason}); '
          f'{_last_checkpoint(self.workdir)}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    # The store may not answer (a lost host): the farewell gets a bounded time, then we go.
    farewell = threading.Thread(target=self._farewell, args=(process, reason, publish),
                                name='ctr_jax_farewell', daemon=True)
    farewell.start()
    farewell.join(timeout=3 * self.interval + 2)
    os._exit(EXIT_LOST_PEER)  # not sys.exit: the main thread may be in a collective for good

  def _farewell(self, process: int, reason: str, publish: bool) -> None:
    if publish:
      try:  # the first verdict stays: the others report the same process
        self.client.key_value_set(f'{_KEYS}verdict',
                                  json.dumps({'process': process, 'reason': reason}))
      except Exception:  # pylint: disable=broad-except  (a verdict already there, or no store)
        pass
    self._last_word('lost')
    if self.index == 0:
      self._wait_for_the_others(process)

  def _last_word(self, word: str) -> None:
    self.stopped.set()
    if not self.writing.acquire(timeout=self.interval + 1):  # a heartbeat stuck in its RPC
      return
    try:
      self.client.key_value_set(f'{_KEYS}beat/{self.index}', word, allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except  (the store may be gone already)
      pass
    finally:
      self.writing.release()

  def _wait_for_the_others(self, lost: int) -> None:
    # Process 0's exit ends the key-value store and JAX's service; the others read the verdict
    # first, or JAX ends them with its own log.
    deadline = time.monotonic() + 2 * self.interval + 1
    while time.monotonic() < deadline:
      try:
        beats = dict(self.client.key_value_dir_get(f'{_KEYS}beat/'))
      except Exception:  # pylint: disable=broad-except
        return
      waiting = [j for j in range(1, self.count) if j != lost
                 and beats.get(f'{_KEYS}beat/{j}') not in ('exit', 'lost')]
      if not waiting:
        return
      time.sleep(self.interval / 4)


def _last_checkpoint(workdir: str) -> str:
  try:
    directory = workdir_lib.resolve(workdir)
    step = checkpointing.latest_finished_step(directory)
  except Exception as e:  # pylint: disable=broad-except  (the line must still be printed)
    return f'the checkpoints in {workdir} could not be listed ({type(e).__name__}: {e})'
  if step is None:
    return f'no checkpoint was saved in {directory}'
  return f'the last checkpoint is step {step} in {directory}'


_WATCH = None  # this process's watch, if any (one per process, like JAX's distributed state)


def watch_peers(dist_config, workdir: str) -> bool:
  """Starts watching the other processes of an initialised multi-process run; True if started."""
  global _WATCH
  client = jax_distributed.global_state.client
  if _WATCH is not None or client is None or jax.process_count() < 2:
    return False
  _WATCH = _Watch(client, peer_timeout(dist_config), workdir, index=jax.process_index(),
                  count=jax.process_count())
  _WATCH.start()
  return True


def settle() -> None:
  """Before an error is reported: waits until every other process has shown a sign of life.

  A collective fails at once when a peer dies (gloo: "Connection reset by peer"); the lost process
  is the error to report, and the watch ends this process with its line (status 3) within the
  bound. Returns at once without a watch, and once the others are alive.
  """
  watch = _WATCH
  if watch is None:
    return
  start = time.monotonic()
  # A backstop only: the watch decides within its bound, and returning before it would end it.
  deadline = start + 2 * (watch.timeout + watch.interval)
  while time.monotonic() < deadline and not watch.alive_since(start):
    time.sleep(watch.interval / 4)


def stop_watching() -> None:
  """Ends the watch (this process finished or failed by itself): its silence is no loss."""
  global _WATCH
  if _WATCH is not None:
    _WATCH.stop()
    _WATCH = None
