"""A multi-process run stops together (docs/reliability.md rows 28 and 29).

Two local CPU processes of the real CLI (`python -m ctr_jax.main` with an explicit coordinator on
127.0.0.1), one device each: SIGTERM to process 1 only stops both after the same step, and the
rerun resumes to the uninterrupted result; SIGKILL of one ends the other in one line within the
bound. Every wait is bounded, so a failure cannot hang the suite.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from unittest import mock

import jax
import portpicker
import pytest

from ctr_jax import config_lib, trainer
from ctr_jax.training import checkpointing, distributed, preemption, signals
from helpers import tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_TIMEOUT = 10  # seconds: the bound the tests give config.distributed.peer_timeout_seconds
# A constant learning rate: a run stopped with total_steps=100000 resumes like a shorter one.
CONSTANT_LR = {'optim.warmup_steps': 0, 'optim.min_lr_ratio': 1.0, 'optim.lr': 3e-3}


def _flags(data_dir, workdir, **overrides):
  config = {'data.data_dir': data_dir, 'model.width': 32, 'model.depth': 1,
            'model.num_heads': 2, 'model.vocab_size': 320, 'model.max_len': 64,
            'model.k_unroll': 2, 'train.k_min': 2, 'data.seq_len': 16, 'batch_size': 8,
            'eval_batches': 2, 'eval_every': 100000, 'log_every': 1, 'checkpoint_every': 2,
            'sample.num_tokens': 0, 'train.convergence_weight': 0.0, **CONSTANT_LR,
            **overrides}
  return ['--config=configs/quickstart.py', f'--workdir={workdir}',
          *[f'--config.{k}={v}' for k, v in config.items()]]


class TwoProcesses:
  """Processes 0 and 1 of one run, their output in files (a pipe could fill and block them)."""

  def __init__(self, tmp_path, name, flags):
    port = portpicker.pick_unused_port()
    # TF_CPP_MIN_LOG_LEVEL=1: JAX's C++ warnings (its SIGTERM handler's) as a user sees them.
    env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
           'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT, 'TF_CPP_MIN_LOG_LEVEL': '1'}
    env.pop('CTR_JAX_TRACEBACK', None)
    self.logs, self.procs = [], []
    for index in range(2):
      out, err = (tmp_path / f'{name}.{index}.{kind}' for kind in ('out', 'err'))
      self.logs.append((out, err))
      with open(out, 'w') as o, open(err, 'w') as e:
        self.procs.append(subprocess.Popen(
            [sys.executable, '-m', 'ctr_jax.main', *flags,
             f'--config.distributed.coordinator_address=127.0.0.1:{port}',
             '--config.distributed.num_processes=2', f'--config.distributed.process_id={index}',
             f'--config.distributed.peer_timeout_seconds={PEER_TIMEOUT}'],
            cwd=ROOT, env=env, stdout=o, stderr=e))

  def output(self, index):
    out, err = self.logs[index]
    return out.read_text(), err.read_text()

  def wait(self, index, timeout):
    try:
      return self.procs[index].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f'process {index} still runs after {timeout} s: {self.output(index)[1][-3000:]}')

  def kill(self):
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def _wait_for(predicate, run, timeout, what):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return
    if any(p.poll() is not None for p in run.procs):
      break
    time.sleep(0.1)
  run.kill()
  pytest.fail(f'{what}: not within {timeout} s; process 0: {run.output(0)[1][-2000:]}; '
              f'process 1: {run.output(1)[1][-2000:]}')


def _logged_steps(workdir):
  path = workdir / 'metrics.jsonl'
  return len(path.read_text().splitlines()) if path.exists() else 0


def _sigterm(run, workdir, after_steps, targets=(1,)):
  _wait_for(lambda: _logged_steps(workdir) >= after_steps, run, 240, 'training did not start')
  sent = time.monotonic()
  for target in targets:  # several: at different moments
    time.sleep(0.0 if target == targets[0] else 0.3)
    run.procs[target].send_signal(signal.SIGTERM)
  codes = [run.wait(i, 120) for i in range(2)]
  elapsed = time.monotonic() - sent
  assert codes == [0, 0], (run.output(0)[1][-3000:], run.output(1)[1][-3000:])
  stopped = re.findall(r'saved step (\d+) and stopped \(SIGTERM\)', run.output(0)[0])
  assert len(stopped) == 1, run.output(0)
  for target in targets:  # JAX's handler heard it, not a Python one
    assert 'SIGTERM caught' in run.output(target)[1]
  step = int(stopped[0])
  # One collective save, of the step both processes stopped after (a stop at different steps
  # hangs in the save, or saves twice).
  assert checkpointing.latest_finished_step(workdir) == step
  assert not [d for d in os.listdir(workdir / 'checkpoints') if 'tmp' in d]
  print(f'SIGTERM to process(es) {targets} after {after_steps} logged step(s): both stopped '
        f'after step {step}, {elapsed:.1f} s after the first signal')
  return step


@pytest.mark.parametrize('targets', [(1,), pytest.param((0, 1), marks=pytest.mark.slow)])
def test_sigterm_to_one_process_stops_both_after_the_same_step(targets, data_dir, tmp_path):
  workdir = tmp_path / 'run'
  run = TwoProcesses(tmp_path, 'run', _flags(data_dir, workdir, total_steps=100000))
  try:
    _sigterm(run, workdir, after_steps=1, targets=targets)
  finally:
    run.kill()


@pytest.mark.slow
def test_sigterm_stop_then_rerun_gives_the_uninterrupted_losses(data_dir, tmp_path):
  workdir = tmp_path / 'run'
  run = TwoProcesses(tmp_path, 'run', _flags(data_dir, workdir, total_steps=100000))
  try:
    stop = _sigterm(run, workdir, after_steps=3)
  finally:
    run.kill()
  total = stop + 3
  for name in ('rerun', 'uninterrupted'):
    target = workdir if name == 'rerun' else tmp_path / name
    again = TwoProcesses(tmp_path, name, _flags(data_dir, target, total_steps=total))
    try:
      assert [again.wait(i, 240) for i in range(2)] == [0, 0], again.output(0)[1][-3000:]
    finally:
      again.kill()
    if name == 'rerun':
      assert f'resumed from the checkpoint at step {stop}' in again.output(0)[0]
  # Row by row and field by field, less the wall-clock fields (as row 5 for one process).
  assert _metric_rows(workdir) == _metric_rows(tmp_path / 'uninterrupted')
  assert len(_metric_rows(workdir)) == total + 1  # a train row per step, the final evaluation
  summaries = [json.loads((d / 'summary.json').read_text())
               for d in (workdir, tmp_path / 'uninterrupted')]
  for key in ('step', 'train_loss', 'val_loss'):
    assert summaries[0][key] == summaries[1][key], key


def _metric_rows(workdir):
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [{k: v for k, v in r.items() if k != 'tokens_per_second' and not k.endswith('_seconds')}
          for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize('lost', [1, 0])
def test_a_killed_process_ends_the_other_in_one_line_within_the_bound(lost, data_dir,
                                                                      tmp_path):
  workdir = tmp_path / 'run'
  run = TwoProcesses(tmp_path, 'run', _flags(data_dir, workdir, total_steps=100000))
  survivor = 1 - lost
  try:
    # Step 3 logged: process 0 is past its first save (a failure within it would let
    # workdir.Run.fail remove the new workdir: "nothing saved yet").
    _wait_for(lambda: _logged_steps(workdir) >= 3, run, 240, 'no checkpoint')
    run.procs[lost].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    code = run.wait(survivor, 3 * PEER_TIMEOUT + 30)
    elapsed = time.monotonic() - killed
  finally:
    run.kill()
  out, err = run.output(survivor)
  last = checkpointing.latest_finished_step(workdir)
  print(f'SIGKILL of process {lost}: process {survivor} ended with status {code} after '
        f'{elapsed:.1f} s; the last checkpoint is step {last}')
  assert 'Terminating process because the JAX distributed service' not in err or lost == 0
  if lost == 1:
    errors = [line for line in err.splitlines() if line.startswith('ctr_jax: error:')]
    assert errors == [
        f'ctr_jax: error: process 1 (host {socket.gethostname()} pid {run.procs[1].pid}) '
        f'stopped responding (no heartbeat for more than {PEER_TIMEOUT} s: killed, crashed, or '
        f'its host is down); the last checkpoint is step {last} in {workdir}'], err[-3000:]
    assert code == 3
    # The bound: peer_timeout_seconds and two heartbeat intervals (1 s each here), with room
    # for a loaded machine; JAX's own heartbeat (3 x 10 s) would end it with a long log.
    assert elapsed < PEER_TIMEOUT + 2 + 8, elapsed
  else:
    # Process 0 hosts JAX's coordination service: JAX ends the other at once (its own fatal
    # log; its error callback cannot be replaced from Python on jax 0.10.2).
    assert code != 0 and elapsed < 20, (code, elapsed)
  # The last checkpoint is whole: it restores.
  model_config, params = checkpointing.load_params(str(workdir))
  assert model_config.width == 32 and params


def test_an_unfinished_checkpoint_is_not_taken_for_a_finished_one(data_dir, tmp_path):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=2), str(workdir))
  # What a process lost during the save of step 4 leaves (as seen after a SIGKILL in
  # test_a_killed_process_ends_the_other_in_one_line_within_the_bound): orbax's temporary name.
  partial = workdir / 'checkpoints' / '4.orbax-checkpoint-tmp'
  (partial / 'state').mkdir(parents=True)
  (partial / 'state' / 'half_written').write_bytes(b'\0' * 100)
  assert checkpointing.latest_finished_step(workdir) == 2
  assert preemption._last_checkpoint(str(workdir)) == (
      f'the last checkpoint is step 2 in {workdir}')
  resumed = trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=4), str(workdir))
  assert resumed['step'] == 4 and checkpointing.latest_finished_step(workdir) == 4


def test_single_process_sigterm_is_a_python_flag_and_the_handler_comes_back():
  before = signal.getsignal(signal.SIGTERM)
  assert not preemption.synchronised()  # one process: the Python handler
  with signals.Signals() as stop:
    stopper = preemption.Stopper(stop, active=True)
    stop.deferring = True
    assert not stopper.after_step()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stopper.after_step() and stopper.signalled and stop.received == signal.SIGTERM
    stop.deferring = False
  assert signal.getsignal(signal.SIGTERM) is before
  with signals.Signals() as stop:
    idle = preemption.Stopper(stop, active=False)  # evaluate / generate jobs never stop here
    assert not idle.after_step()


def test_several_processes_leave_sigterm_to_jax_and_send_ctrl_c_on():
  before = signal.getsignal(signal.SIGTERM)
  received = []

  def jax_handler(signum, frame):  # what jax.distributed.initialize installs, here a recorder
    del frame
    received.append(signum)
  signal.signal(signal.SIGTERM, jax_handler)
  try:
    with signals.Signals(forward_to_jax=True) as stop:
      assert signal.getsignal(signal.SIGTERM) is jax_handler  # left in place
      stop.deferring = True
      os.kill(os.getpid(), signal.SIGINT)
      assert stop.received == signal.SIGINT and received == [signal.SIGTERM]
      with pytest.raises(signals.Interrupted):  # a second Ctrl-C does not wait
        os.kill(os.getpid(), signal.SIGINT)
  finally:
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize('value', [4, 3601, -1])
def test_peer_timeout_is_validated_before_anything_starts(value):
  config = config_lib.get_base()
  config.distributed.peer_timeout_seconds = value
  with pytest.raises(ValueError, match=r'^config\.distributed\.peer_timeout_seconds: must be an '
                     r'integer in \[5, 3600\]'):
    config_lib.validate(config)
  # main.py initialises before the config is validated: the check comes first there too.
  config.distributed.coordinator_address = '127.0.0.1:1'
  config.distributed.num_processes, config.distributed.process_id = 2, 0
  with mock.patch.object(jax.distributed, 'initialize') as initialize:
    with pytest.raises(ValueError, match='peer_timeout_seconds'):
      distributed.maybe_initialize(config.distributed)
  initialize.assert_not_called()


class FakeStore:
  """The distributed client's key-value calls that the watch uses, in memory."""

  def __init__(self):
    self.values, self.lock = {}, threading.Lock()

  def key_value_set(self, key, value, allow_overwrite=False):
    with self.lock:
      if key in self.values and not allow_overwrite:
        raise RuntimeError(f'ALREADY_EXISTS: {key}')
      self.values[key] = value

  def key_value_dir_get(self, prefix):
    with self.lock:
      return sorted((k, v) for k, v in self.values.items() if k.startswith(prefix))


def test_the_watch_names_a_silent_peer_and_a_live_one_settles_at_once(tmp_path):
  store, ended = FakeStore(), []
  watches = [preemption._Watch(store, 5, str(tmp_path), index=i, count=3) for i in range(3)]
  with mock.patch.object(preemption.os, '_exit', side_effect=ended.append):
    for watch in watches:
      watch.start()
    try:
      start = time.monotonic()
      while not all(w.alive_since(start) for w in watches) and time.monotonic() < start + 10:
        time.sleep(0.1)
      assert all(w.alive_since(start) for w in watches), 'live peers must settle in seconds'
      watches[2].stopped.set()  # process 2 goes silent without saying so: killed
      deadline = time.monotonic() + 5 + 2 * watches[0].interval + 10
      while len(ended) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    finally:
      for watch in watches:
        watch.stopped.set()
  assert ended == [3, 3]
  verdict = json.loads(store.values['ctr_jax/peers/verdict'])
  assert verdict['process'] == 2 and 'no heartbeat' in verdict['reason']
  assert store.values['ctr_jax/peers/beat/1'] == 'lost'
