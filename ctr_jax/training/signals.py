"""SIGTERM (preemption) and SIGINT (Ctrl-C) during a run: both stop it the same way.

Inside the train loop (`Signals.deferring` set) a signal only sets `received`: the step in progress
ends, its state is saved and the run stops. Anywhere else (data preparation, compilation, the
restore, the final evaluation, the sample) nothing is in progress that a checkpoint could keep, so
the signal raises `Interrupted` at once and the trainer says what is on disk. A second signal
inside the loop also raises at once, so that a save that hangs can still be interrupted.

Handlers are installed only in the main thread (Python delivers signals there alone) and the
previous ones come back when the run ends.

A run of several processes (`forward_to_jax`) leaves SIGTERM to the handler that
`jax.distributed.initialize` installs: it tells JAX's coordination service, and the train loop
asks JAX's sync point after every step, so that every process stops after the same step
(ctr_jax/training/preemption.py). A Ctrl-C inside the loop is sent on to it as a SIGTERM.
"""

import os
import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Phases the trainer's messages name (`Signals.phase`); others are said as they are.
SET_UP = 'the set-up (data, model, restore)'
TRAINING = 'training'


def name(signum: int) -> str:
  return signal.Signals(signum).name


class Interrupted(BaseException):
  """A stop signal outside the train loop (a BaseException, like KeyboardInterrupt, so that no
  `except Exception` on the way turns it into an error)."""

  def __init__(self, signum: int):
    super().__init__(f'stopped by {name(signum)}')
    self.signum = signum


class Signals:
  """The run's handler of STOP_SIGNALS, as a context manager; `phase` says what the run is doing
  (for the message after an interruption)."""

  def __init__(self, forward_to_jax: bool = False):
    self.received = None  # the first signal received inside the train loop
    self.phase = SET_UP
    self.deferring = False  # set by the train loop
    self.forward_to_jax = forward_to_jax
    self._previous = {}

  def __enter__(self) -> 'Signals':
    if threading.current_thread() is threading.main_thread():
      for signum in (signal.SIGINT,) if self.forward_to_jax else STOP_SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    if self.deferring and self.received is None:
      self.received = signum
      if self.forward_to_jax:  # JAX's handler: every process stops after the same step
        os.kill(os.getpid(), signal.SIGTERM)
      return
    raise Interrupted(signum)

  def raise_if_received(self) -> None:
    """After the loop: a signal that came after its last check stops the run now."""
    if self.received is not None:
      raise Interrupted(self.received)
