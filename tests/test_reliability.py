"""Failure cases of a training run (docs/reliability.md): what the user sees, what stays on disk."""

import errno
import glob
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from ctr_jax import config_lib, models, trainer
from ctr_jax.data import lock as data_lock
from ctr_jax.training import checkpointing, metrics
from ctr_jax.training import workdir as workdir_lib
from helpers import run_main, snapshot, tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  """A finished 4-step run with checkpoints 2 and 4 (tests copy it before changing it)."""
  path = str(tmp_path_factory.mktemp('trained') / 'run')
  trainer.train_and_evaluate(tiny_train_config(data_dir), path)
  assert sorted(os.listdir(os.path.join(path, 'checkpoints'))) == ['2', '4']
  return path


def _copy(src, tmp_path):
  dst = str(tmp_path / 'run')
  shutil.copytree(src, dst)
  return dst


def _tiny_flags(data_dir):
  """The same model as tiny_train_config (so the CLI can resume its checkpoints)."""
  return [f'--config={ROOT}/configs/quickstart.py', f'--config.data.data_dir={data_dir}',
          '--config.model.kind=context_ready', '--config.model.width=32',
          '--config.model.depth=1', '--config.model.num_heads=2', '--config.model.vocab_size=320',
          '--config.model.max_len=64', '--config.model.k_unroll=3', '--config.train.k_min=0',
          '--config.data.seq_len=16', '--config.batch_size=8', '--config.eval_batches=1',
          '--config.sample.num_tokens=0']


def _one_line_error(result, code, *needles):
  lines = result.stderr.strip().splitlines()
  assert result.returncode == code, result.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith('ctr_jax: error: '), result.stderr[-3000:]
  for needle in needles:
    assert needle in lines[0], lines[0]
  return lines[0]


# ------------------------------------------------------------------------------------------------
# Bad workdir and keep_checkpoints: one line, exit 2, nothing written.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize('flag,needle', [
    ('--workdir=', 'empty'),
    ('--workdir=   ', 'empty'),
    ('--config.keep_checkpoints=0', 'config.keep_checkpoints'),
    ('--config.keep_checkpoints=-1', 'config.keep_checkpoints'),
])
def test_cli_refuses_empty_workdir_and_bad_keep_checkpoints(flag, needle, data_dir, tmp_path):
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  args = [*_tiny_flags(data_dir), '--config.total_steps=2']
  if not flag.startswith('--workdir'):
    args.append(f'--workdir={tmp_path}/run')
  result = run_main([*args, flag], cwd=cwd)
  line = _one_line_error(result, 2, needle)
  assert 'max_to_keep' not in line
  assert not any(cwd.iterdir()) and not (tmp_path / 'run').exists()


# ------------------------------------------------------------------------------------------------
# The workdir lock.
# ------------------------------------------------------------------------------------------------


def test_a_live_lock_refuses_a_second_run_and_a_stale_one_is_taken_over(
    data_dir, trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  holder = workdir_lib.Lock(workdir_lib.resolve(workdir)).acquire()  # this test's pid holds it
  try:
    before = snapshot(workdir)
    result = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=6'])
    _one_line_error(result, 2, 'in use by another run', socket.gethostname(),
                    f'pid {os.getpid()}')
    assert snapshot(workdir) == before
  finally:
    holder.release()
  # A holder that died (SIGKILL) leaves its name in the lock file: the rerun takes over.
  dead = subprocess.Popen(['true'])
  dead.wait()
  with open(os.path.join(workdir, workdir_lib.LOCK_NAME), 'w') as f:
    json.dump({'host': socket.gethostname(), 'pid': dead.pid, 'time': 'earlier'}, f)
  capfd.readouterr()
  summary = trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=6), workdir)
  assert summary['step'] == 6
  assert f'took over the stale lock of host {socket.gethostname()} pid {dead.pid}' in (
      capfd.readouterr().err)


# ------------------------------------------------------------------------------------------------
# NaN / Inf: never checkpointed, the first bad step named; a failed run removes what it created.
# ------------------------------------------------------------------------------------------------


def test_a_non_finite_state_is_never_saved_and_the_first_bad_step_is_named(data_dir, tmp_path):
  nan = {'optim.lr': 1e6, 'total_steps': 20, 'log_every': 25, 'checkpoint_every': 10}
  # With this lr the state after step 3 is finite and a later step (4 or 5, depending on the
  # last bits of the arithmetic) is the first whose loss is NaN, before the checkpoint at 10.
  good = str(tmp_path / 'good')
  trainer.train_and_evaluate(tiny_train_config(data_dir, **{**nan, 'total_steps': 3,
                                                          'checkpoint_every': 3}), good)
  with pytest.raises(checkpointing.CheckpointError,
                     match=r'NaN or Inf at step [4-9]; .*last good checkpoint is step 3 in '):
    trainer.train_and_evaluate(tiny_train_config(data_dir, **nan), good)
  assert checkpointing.steps(good) == [3]  # no NaN checkpoint at step 10 or 20
  # A fresh workdir (and its new parents) is removed; in an existing one only the new entries.
  fresh = tmp_path / 'new' / 'parent' / 'run'
  with pytest.raises(checkpointing.CheckpointError, match='at step [1-9]; .*no checkpoint'):
    trainer.train_and_evaluate(tiny_train_config(data_dir, **nan), str(fresh))
  assert not (tmp_path / 'new').exists()
  existing = tmp_path / 'existing'
  existing.mkdir()
  (existing / 'notes.txt').write_text('mine')
  with pytest.raises(checkpointing.CheckpointError):
    trainer.train_and_evaluate(tiny_train_config(data_dir, **nan), str(existing))
  assert sorted(os.listdir(existing)) == ['notes.txt']


# ------------------------------------------------------------------------------------------------
# Cleanup after a failure removes only what the failed run created (docs/reliability.md row 23).
# ------------------------------------------------------------------------------------------------


def test_a_failed_run_leaves_a_shared_new_parent_and_the_other_runs_files(tmp_path):
  sweep = tmp_path / 'sweep'
  b = workdir_lib.Run(sweep / 'b')  # creates sweep/ and sweep/b
  a = workdir_lib.Run(sweep / 'a')  # then another run uses the new parent
  (a.path / 'checkpoints' / '2.orbax-checkpoint-tmp-1').mkdir(parents=True)  # being written
  (a.path / 'metrics.jsonl').write_text('{"step": 1}\n')
  (b.path / 'metrics.jsonl').write_text('{"step": 1}\n')
  before = snapshot(sweep / 'a')
  b.fail()
  assert os.listdir(sweep) == ['a'] and snapshot(sweep / 'a') == before
  with pytest.raises(workdir_lib.WorkdirError, match='in use by another run'):
    workdir_lib.Run(sweep / 'a')  # A's lock still holds: a third run cannot take A's workdir
  a.fail()
  assert os.listdir(sweep) == []  # B created it, but A was in it then: an empty leftover
  # A finished checkpoint is kept even if the failure came before the run heard its save end
  # (a lost peer, a signal: `saved` was never set).
  c = workdir_lib.Run(sweep / 'c')
  (c.path / 'checkpoints' / '4').mkdir(parents=True)
  c.fail()
  assert os.listdir(sweep / 'c' / 'checkpoints') == ['4']
  # Another run's workdir inside a failed run's (it holds a lock) is left, with what holds it.
  outer = workdir_lib.Run(tmp_path / 'outer')
  nested = workdir_lib.Run(tmp_path / 'outer' / 'inner' / 'run')
  (outer.path / 'config.json').write_text('{}')
  outer.fail()
  assert os.listdir(tmp_path / 'outer') == ['inner']
  nested.fail()
  assert os.listdir(tmp_path / 'outer') == []


@pytest.mark.slow
def test_two_cli_runs_in_a_new_parent_where_one_fails(data_dir, tmp_path):
  sweep = tmp_path / 'sweep'
  waiting_data = tmp_path / 'data_b'
  with data_lock.preparing(waiting_data):  # run B creates sweep/b, then waits for its data
    b = subprocess.Popen(
        [sys.executable, '-m', 'ctr_jax.main', *_tiny_flags(str(waiting_data)),
         f'--workdir={sweep}/b', f'--config.init_from={tmp_path}/no_such_run'],
        cwd=ROOT, env={**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
                       'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while b.poll() is None and time.time() < deadline and not _waits_for_a_lock(b):
      time.sleep(0.2)
    assert b.poll() is None and (sweep / 'b').exists(), b.communicate()
    a = run_main([*_tiny_flags(data_dir), f'--workdir={sweep}/a', '--config.total_steps=2',
                  '--config.checkpoint_every=2'])
    assert a.returncode == 0, a.stderr[-3000:]
    before = snapshot(sweep / 'a')
    shutil.copytree(data_dir, waiting_data, dirs_exist_ok=True)  # B then fails at init_from
  _, err = b.communicate(timeout=240)
  assert b.returncode == 2 and 'init_from' in err.strip().splitlines()[-1], err[-3000:]
  assert os.listdir(sweep) == ['a'] and snapshot(sweep / 'a') == before


def _waits_for_a_lock(proc) -> bool:
  # /proc/PID/wchan names the kernel function a process sleeps in: flock waits in a lock call.
  try:
    with open(f'/proc/{proc.pid}/wchan') as f:
      return 'lock' in f.read()
  except OSError:
    return False


# ------------------------------------------------------------------------------------------------
# config.json: the training run's record survives evaluate jobs and changed resumes.
# ------------------------------------------------------------------------------------------------


def test_config_json_is_kept_by_evaluate_jobs_and_versioned_by_a_changed_resume(
    data_dir, trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  with open(os.path.join(workdir, 'config.json')) as f:
    original = json.load(f)
  trainer.train_and_evaluate(tiny_train_config(data_dir, job='evaluate'), workdir)
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f) == original
  with open(os.path.join(workdir, 'evaluate_config.json')) as f:
    assert json.load(f)['job'] == 'evaluate'
  trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=6), workdir)
  with open(os.path.join(workdir, 'config.step4.json')) as f:
    assert json.load(f) == original
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['total_steps'] == 6


# ------------------------------------------------------------------------------------------------
# A resume that would mix up the data (docs/reliability.md row 24).
# ------------------------------------------------------------------------------------------------


def test_a_resume_with_another_batch_size_seq_len_or_seed_is_refused(data_dir, trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  before = snapshot(workdir)
  flags = [f for f in _tiny_flags(data_dir) if not f.startswith('--config.batch_size=')]
  result = run_main([*flags, '--config.batch_size=4', f'--workdir={workdir}',
                     '--config.total_steps=6'])
  line = _one_line_error(result, 2, 'config.batch_size=4 (the checkpoint has 8)',
                         'pass --config.batch_size=8 to resume', workdir)
  assert 'data position' in line
  assert snapshot(workdir) == before
  for field, value in (('data.seq_len', 8), ('seed', 1)):
    with pytest.raises(ValueError, match=rf'config\.{field}={value} \(the checkpoint has '):
      trainer.prepare_workdir(tiny_train_config(data_dir, total_steps=6, **{field: value}),
                              workdir)
  # Evaluation does not read the training stream; the same values resume.
  trainer.prepare_workdir(tiny_train_config(data_dir, batch_size=4, job='evaluate'), workdir)
  trainer.prepare_workdir(tiny_train_config(data_dir, total_steps=6), workdir)
  assert snapshot(workdir) == before


# ------------------------------------------------------------------------------------------------
# Damaged checkpoints.
# ------------------------------------------------------------------------------------------------


def test_missing_metadata_does_not_skip_the_model_check_and_falls_back(
    data_dir, trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  os.remove(os.path.join(workdir, 'checkpoints', '4', 'meta', 'metadata'))
  with pytest.raises(trainer.UserError, match='different model config'):
    trainer.train_and_evaluate(tiny_train_config(data_dir, **{'model.width': 64}), workdir)
  with pytest.raises(checkpointing.CheckpointError,
                     match='checkpoint step 4 in .* is damaged: meta/metadata is missing'):
    trainer.train_and_evaluate(tiny_train_config(data_dir, strict_resume=True), workdir)
  capfd.readouterr()
  summary = trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=6), workdir)
  assert summary['step'] == 6
  assert 'warning: checkpoint step 4' in capfd.readouterr().err
  assert checkpointing.steps(workdir) == [2, 4, 6]
  assert os.listdir(os.path.join(workdir, checkpointing.DAMAGED_DIR)) == ['4']


def _data_files(workdir, step):
  root = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return [os.path.join(b, f) for b, _, fs in os.walk(root) for f in fs
          if os.path.basename(b) == 'd']  # tensorstore's OCDBT data files


@pytest.mark.slow
def test_a_truncated_checkpoint_is_reported_and_the_run_falls_back(
    data_dir, trained, tmp_path, capfd):
  workdir = _copy(trained, tmp_path)
  files = _data_files(workdir, 4)
  assert files
  for path in files:
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2)
  before = snapshot(workdir)
  strict = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=4',
                  '--config.strict_resume=True'])
  _one_line_error(strict, 3, f'checkpoint step 4 in {workdir}/checkpoints is damaged')
  assert snapshot(workdir) == before
  capfd.readouterr()
  summary = trainer.train_and_evaluate(tiny_train_config(data_dir), workdir)
  assert summary['step'] == 4
  err = capfd.readouterr().err
  assert 'warning: checkpoint step 4' in err and 'resuming from step 2' in err
  # The metrics rows the damaged checkpoint covered are written again, once.
  assert [r['step'] for r in metrics.read_metrics(workdir) if 'train_loss' in r] == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------------------
# metrics.jsonl cut short by a crash (docs/reliability.md row 25).
# ------------------------------------------------------------------------------------------------


def test_a_torn_last_metrics_line_is_dropped_with_a_warning_and_one_inside_is_named(
    data_dir, trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  path = os.path.join(workdir, 'metrics.jsonl')
  with open(path) as f:
    rows = f.read()
  # Damage in the middle: one line naming the file and the line, exit 3, nothing changed.
  lines = rows.splitlines(True)
  with open(path, 'w') as f:
    f.write(''.join([lines[0], '{"step": 2, "train_lo\n', *lines[1:]]))
  before = snapshot(workdir)
  result = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=4'])
  _one_line_error(result, 3, f'{path} line 2 is not a metrics row')
  assert snapshot(workdir) == before
  # A crash while the last row was written: dropped with a warning, and the resume goes on.
  with open(path, 'w') as f:
    f.write(rows + '{"step": 4, "val_loss": 1.2')
  result = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=4'])
  assert result.returncode == 0, result.stderr[-3000:]
  warning = f'ctr_jax: warning: {path} line {len(lines) + 1}, the last, is cut short'
  assert warning in result.stderr, result.stderr[-3000:]
  with open(path) as f:
    resumed = f.read()
  assert resumed.startswith(rows)  # the rows before it byte for byte
  # The torn row is gone, not glued to the next (a '1.2' search also hit other floats).
  assert all(json.loads(line) for line in resumed.splitlines())
  assert [r['step'] for r in metrics.read_metrics(workdir) if 'train_loss' in r] == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------------------
# config.init_from: the whole model compared, the parameters only read, damage named (row 26).
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def transformer_source(data_dir, tmp_path_factory):
  """A 2-step transformer run trained without gradient clipping (its optimizer state has no
  clipping node), the model of _tiny_flags otherwise."""
  path = str(tmp_path_factory.mktemp('source') / 'run')
  config = tiny_train_config(data_dir, total_steps=2, **{'optim.grad_clip': 0.0})
  config.model = models.model_config(kind='transformer', width=32, depth=1, num_heads=2,
                                     vocab_size=320, max_len=64)
  trainer.train_and_evaluate(config, path)
  return path


def test_init_from_compares_the_whole_model_and_reads_only_the_parameters(
    data_dir, transformer_source, tmp_path):
  # Four heads of 8 instead of two of 16: every parameter shape is the same, the model is not.
  flags = [f for f in _tiny_flags(data_dir) if not f.startswith('--config.model.num_heads=')]
  result = run_main([*flags, '--config.model.num_heads=4', f'--workdir={tmp_path}/heads',
                     f'--config.init_from={transformer_source}'])
  _one_line_error(result, 2, f'config.init_from={transformer_source!r} was trained with another '
                  'model: model.num_heads=4 (the source has 2)', '--config.model.num_heads=2')
  assert not (tmp_path / 'heads').exists()
  # Only the parameters are read: the source's optimizer state (no clipping node, unlike the
  # default grad_clip=1's) is not asked for. (The slow T test converts and continues exactly.)
  cfg, params = checkpointing.load_params(transformer_source)
  assert cfg.num_heads == 2 and set(params) >= {'embed', 'ln_f'}
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(params))


def test_a_damaged_init_from_source_is_one_line_naming_it(data_dir, transformer_source, tmp_path):
  source = _copy(transformer_source, tmp_path)
  files = _data_files(source, 2)
  assert files
  for path in files:
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2)
  result = run_main([*_tiny_flags(data_dir), f'--workdir={tmp_path}/converted',
                     f'--config.init_from={source}'])
  _one_line_error(result, 3, f'config.init_from: checkpoint step 2 in {source}/checkpoints is '
                  'damaged: ')
  assert 'Traceback' not in result.stderr and not (tmp_path / 'converted').exists()
  with open(os.path.join(source, 'checkpoints', '2', 'meta', 'metadata'), 'w') as f:
    f.write('{"step": 2, "con')
  result = run_main([*_tiny_flags(data_dir), f'--workdir={tmp_path}/converted',
                     f'--config.init_from={source}'])
  _one_line_error(result, 3, f'config.init_from: no checkpoint in {source}/checkpoints has '
                  'readable metadata')


# ------------------------------------------------------------------------------------------------
# SIGINT like SIGTERM, in every phase of a run (docs/reliability.md row 27).
# ------------------------------------------------------------------------------------------------

# python -m ctr_jax.main, except that the run sends itself a signal at a chosen point (`{patch}`
# wraps a function the trainer calls): a real signal, delivered at a known moment.
SIGNALLING_MAIN = r'''
import os
import signal

from absl import app

from ctr_jax import main, tasks
from ctr_jax.tasks import language_modelling
from ctr_jax.training import metrics


def signal_when(owner, attribute, signum, condition):
  original = getattr(owner, attribute)

  def wrapper(*args, **kwargs):
    if condition(*args, **kwargs):
      os.kill(os.getpid(), signum)
    return original(*args, **kwargs)

  setattr(owner, attribute, wrapper)


{patch}
app.run(main.main, flags_parser=main.parse_flags)
'''


def _run_signalled(patch: str, args) -> subprocess.CompletedProcess:
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
         'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT}
  env.pop('CTR_JAX_TRACEBACK', None)
  return subprocess.run([sys.executable, '-c', SIGNALLING_MAIN.format(patch=patch), *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_ctrl_c_in_the_train_loop_saves_the_step_like_sigterm(data_dir, tmp_path):
  workdir = tmp_path / 'run'
  result = _run_signalled(  # Ctrl-C while step 1 is logged, long before the first checkpoint
      "signal_when(metrics.MetricWriter, 'write', signal.SIGINT, lambda w, step, row: step == 1)",
      [*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=100',
       '--config.log_every=1', '--config.checkpoint_every=100', '--config.eval_every=100'])
  assert result.returncode == 130, result.stderr[-3000:]  # 128 + SIGINT, as shells expect
  assert 'ctr_jax: saved step 1 and stopped (SIGINT); rerun to resume' in result.stdout
  assert 'Traceback' not in result.stderr and 'KeyboardInterrupt' not in result.stderr
  assert checkpointing.steps(workdir) == [1]


def test_signals_outside_the_train_loop_say_what_is_saved(data_dir, trained, tmp_path):
  # SIGTERM during the final evaluation (was: the run ended without a word): the last step is
  # saved already.
  workdir = _copy(trained, tmp_path)
  result = _run_signalled(
      "signal_when(language_modelling.LanguageModelling, 'evaluate', signal.SIGTERM,"
      " lambda *args, final, **kwargs: final)",
      [*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=4'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f'ctr_jax: stopped by SIGTERM during the final evaluation; nothing new to save: the '
          f'latest checkpoint is step 4 in {workdir}; rerun to resume') in result.stdout
  assert 'Traceback' not in result.stderr and checkpointing.steps(workdir) == [2, 4]
  # Ctrl-C during the set-up of a new run (was: a traceback): nothing to save, nothing left.
  fresh = tmp_path / 'new' / 'run'
  result = _run_signalled(
      "signal_when(tasks, 'make', signal.SIGINT, lambda *args: True)",
      [*_tiny_flags(data_dir), f'--workdir={fresh}'])
  assert result.returncode == 130, result.stderr[-3000:]
  assert (f'ctr_jax: stopped by SIGINT during the set-up (data, model, restore); nothing was '
          f'trained, so nothing needed saving; removed what this run created in {fresh}'
          ) in result.stdout
  assert 'Traceback' not in result.stderr and not (tmp_path / 'new').exists()


# ------------------------------------------------------------------------------------------------
# Disk full while saving.
# ------------------------------------------------------------------------------------------------


def _fill_the_disk_after_the_first_checkpoint(monkeypatch) -> None:
  """orbax's JSON writes fail with ENOSPC from the second checkpoint on."""
  from orbax.checkpoint._src.handlers import json_checkpoint_handler as json_handler
  original = json_handler.JsonCheckpointHandler._save_fn
  calls = []

  async def fill_the_disk(self, item, directory):
    calls.append(directory)
    if len(calls) > 2:  # the first checkpoint (two JSON items) is written, the second is not
      raise OSError(errno.ENOSPC, 'No space left on device')
    return await original(self, item, directory)

  monkeypatch.setattr(json_handler.JsonCheckpointHandler, '_save_fn', fill_the_disk)


def test_disk_full_while_saving_is_one_line_and_leaves_no_temporary(
    data_dir, tmp_path, monkeypatch, capfd):
  _fill_the_disk_after_the_first_checkpoint(monkeypatch)
  workdir = str(tmp_path / 'run')
  capfd.readouterr()
  with pytest.raises(checkpointing.CheckpointError) as failure:
    trainer.train_and_evaluate(tiny_train_config(data_dir), workdir)
  message = str(failure.value)
  assert f'no space left on the device of {workdir} ' in message and 'MiB free' in message
  assert '\n' not in message and 'Traceback' not in capfd.readouterr().err
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']  # no *-tmp-* left


# ------------------------------------------------------------------------------------------------
# Cloud workdirs: every workdir file goes through epath.
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_gcs(monkeypatch):
  """gs:// served by fsspec's in-memory filesystem (offline; epath's fsspec backend uses it)."""
  from fsspec.implementations.memory import MemoryFileSystem
  registry = importlib.import_module('fsspec.registry')
  for name in ('gs', 'gcs'):
    monkeypatch.setitem(registry._registry, name, MemoryFileSystem)
  yield 'gs://ctr-jax-test-bucket'
  MemoryFileSystem.store.clear()
  MemoryFileSystem.pseudo_dirs[:] = ['']


def test_workdir_files_on_a_cloud_path(fake_gcs):
  uri = f'{fake_gcs}/runs/a'
  run = workdir_lib.Run(uri)
  path = run.path
  assert str(path) == uri and (path / workdir_lib.LOCK_NAME).exists()
  with pytest.raises(workdir_lib.WorkdirError, match=f'in use by another run .*pid {os.getpid()}'):
    workdir_lib.Run(uri)  # a live holder on this host
  writer = metrics.MetricWriter(path, tensorboard=False)  # tensorboardX talks to GCS itself
  for step in (1, 2, 3):
    writer.write(step, {'train_loss': 1.0 / step})
  writer.write(3, {'val_loss': 0.5})
  writer.close()
  assert metrics.drop_rows_after(path, 2) == 2
  assert [r['step'] for r in metrics.read_metrics(path)] == [1, 2]
  workdir_lib.write_config(path, {'job': 'train', 'seed': 0}, None)
  metrics.write_json(path / 'summary.json', {'step': 2})
  assert metrics.plot_curves(path) == f'{uri}/curves.png'
  assert checkpointing.read_meta(uri) is None
  assert json.loads((path / 'summary.json').read_text()) == {'step': 2}
  assert (path / 'curves.png').read_bytes().startswith(b'\x89PNG')
  run.finish()
  assert not (path / workdir_lib.LOCK_NAME).exists()
  # A stale lock file (a dead pid of this host) is taken over; a failed new run leaves nothing.
  dead = subprocess.Popen(['true'])
  dead.wait()
  other = f'{fake_gcs}/runs/b'
  workdir_lib.resolve(other).mkdir(parents=True)
  (workdir_lib.resolve(other) / workdir_lib.LOCK_NAME).write_text(
      json.dumps({'host': socket.gethostname(), 'pid': dead.pid}))
  assert 'stale' in workdir_lib.Run(other).__dict__['_lock'].note
  fresh = workdir_lib.Run(f'{fake_gcs}/runs/c')
  fresh.fail()
  assert not workdir_lib.resolve(f'{fake_gcs}/runs/c').exists()


def test_a_file_url_workdir_trains_like_a_local_path(data_dir, tmp_path):
  workdir = tmp_path / 'run'
  summary = trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=2),
                                     f'file://{workdir}')
  assert summary['step'] == 2
  for name in ('config.json', 'metrics.jsonl', 'summary.json', 'curves.png', 'checkpoints'):
    assert (workdir / name).exists(), name


def test_keep_checkpoints_is_validated_with_the_config_field_name(data_dir):
  for bad in (0, -1):
    with pytest.raises(ValueError, match='config.keep_checkpoints: must be an integer >= 1'):
      config_lib.validate(tiny_train_config(data_dir, keep_checkpoints=bad))


# ------------------------------------------------------------------------------------------------
# Token ids the model has no embedding for (issue 41 item 7): one line, not a NaN loss.
# ------------------------------------------------------------------------------------------------


def test_a_token_cache_with_ids_past_the_vocabulary_is_one_line(data_dir, tmp_path):
  data = tmp_path / 'data'
  shutil.copytree(data_dir, data)
  [cache] = glob.glob(str(data / 'tokenizers' / 'kjv_bible_320_train_*.npy'))
  tokens = np.load(cache)
  tokens[::5] = 400  # what a cache written for a larger vocabulary holds
  np.save(cache, tokens)
  workdir = tmp_path / 'run'
  result = run_main([*_tiny_flags(str(data)), f'--workdir={workdir}', '--config.total_steps=2'])
  # Found in the first batch, once the progress bar has drawn its 0/2 line: then one error line.
  assert result.returncode == 2, result.stderr[-3000:]
  *progress, last = [l for l in result.stderr.strip().splitlines() if l.strip()]
  assert all('0/2' in l and '?step/s' in l for l in progress), result.stderr[-3000:]
  assert last.startswith('ctr_jax: error: config.model.vocab_size=320: a training batch holds '
                         'token id 400 (at ['), last
  assert 'outside [0, 320)' in last and 'Traceback' not in result.stderr
  assert not workdir.exists()


# ------------------------------------------------------------------------------------------------
# Asynchronous checkpoints (the default on GPU/TPU), forced on CPU.
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def async_managers(monkeypatch):
  """Records the async_save of every checkpoint manager the trainer makes."""
  made, original = [], checkpointing.manager

  def spy(workdir, max_to_keep=3, async_save=False):
    made.append(async_save)
    return original(workdir, max_to_keep, async_save)
  monkeypatch.setattr(checkpointing, 'manager', spy)
  return made


def _train_losses(workdir):
  return {r['step']: r['train_loss'] for r in metrics.read_metrics(workdir) if 'train_loss' in r}


def test_async_checkpoints_resume_exactly_and_never_save_a_nan(data_dir, tmp_path, async_managers):
  options = dict(total_steps=6, log_every=1, eval_every=2, checkpoint_every=2)
  sync = str(tmp_path / 'sync')
  trainer.train_and_evaluate(tiny_train_config(data_dir, **options), sync)
  assert async_managers == [False]  # 'auto' on CPU
  split = str(tmp_path / 'split')
  forced = {**options, 'async_checkpoints': 'on'}
  first = trainer.train_and_evaluate(tiny_train_config(data_dir, **forced, exit_at_step=5), split)
  assert first.get('interrupted') and checkpointing.steps(split) == [2, 4, 5]
  trainer.train_and_evaluate(tiny_train_config(data_dir, **forced), split)
  assert async_managers == [False, True, True]
  assert checkpointing.steps(split) == [4, 5, 6] and not glob.glob(f'{split}/checkpoints/*tmp*')
  assert _train_losses(split) == _train_losses(sync)  # bit for bit, across the stop
  # Step 4 was written while steps 5 and 6 trained on (donated) buffers: the same bits.
  for step in (4, 6):
    written = checkpointing.load_params(split, step=step)[1]
    expected = checkpointing.load_params(sync, step=step)[1]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(written),
                                                      jax.tree.leaves(expected))), step
  # The NaN guard holds: the state after step 6 is the last one saved.
  nan = {**forced, 'optim.lr': 1e6, 'total_steps': 20, 'log_every': 25, 'checkpoint_every': 10}
  with pytest.raises(checkpointing.CheckpointError,
                     match=r'NaN or Inf at step ([7-9]|1\d); .*last good checkpoint is step 6 in '):
    trainer.train_and_evaluate(tiny_train_config(data_dir, **nan), split)
  assert checkpointing.steps(split) == [4, 5, 6]


def test_async_disk_full_is_still_one_line_and_leaves_no_temporary(
    data_dir, tmp_path, monkeypatch, capfd, async_managers):
  _fill_the_disk_after_the_first_checkpoint(monkeypatch)
  workdir = str(tmp_path / 'run')
  capfd.readouterr()
  with pytest.raises(checkpointing.CheckpointError) as failure:
    # Step 4's write fails in the background (orbax's writer threads); the save of step 6
    # reports it.
    trainer.train_and_evaluate(tiny_train_config(data_dir, async_checkpoints='on',
                                                 total_steps=6), workdir)
  assert async_managers == [True]
  message = str(failure.value)
  assert (f'no space left on the device of {workdir} while saving the checkpoint of step 4 '
          in message and 'MiB free' in message)
  assert '\n' not in message and 'Traceback' not in capfd.readouterr().err
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2']  # no *-tmp-* left


def test_async_checkpoints_setting_is_validated(data_dir):
  with pytest.raises(ValueError, match=r"config.async_checkpoints: got 'yes', allowed"):
    config_lib.validate(tiny_train_config(data_dir, async_checkpoints='yes'))
  assert not checkpointing.use_async('auto')  # this backend is a CPU
  assert checkpointing.use_async('auto', 'gpu') and checkpointing.use_async('auto', 'tpu')
  assert not checkpointing.use_async('auto', 'cpu')
  assert checkpointing.use_async('on') and not checkpointing.use_async('off')
