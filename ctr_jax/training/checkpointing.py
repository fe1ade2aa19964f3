"""Orbax checkpoints of {train state, data-iterator state, config} in `<workdir>/checkpoints`.

Restores go through explicit abstract targets carrying the *current* shardings, so a checkpoint
written on 8 devices restores on 1 (or on another mesh) without reshaping errors.

Safety (docs/reliability.md): a non-finite state is never saved (`health_*`: the first step whose
loss or gradient norm was NaN/Inf, kept on device and read only before a save or at a log step);
a full disk ends as one line and leaves no temporary checkpoint; a damaged checkpoint is moved
aside and the run resumes from the newest complete older one (unless `config.strict_resume`).

Saves are asynchronous on GPUs and TPUs (`config.async_checkpoints`, `use_async`): `save` returns
once the arrays are copied to host memory and the files are written while training goes on; the
next `save` or `finish` waits for them and reports a failed write (a full disk) as a synchronous
save would.
"""

import asyncio
import contextlib
import errno
import json
import logging
import shutil
import sys
import threading
from unittest import mock

from etils import epath
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src import asyncio_utils

from ctr_jax import models
from ctr_jax.training import compat, sharding
from ctr_jax.training import workdir as workdir_lib

DAMAGED_DIR = 'damaged_checkpoints'


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be saved or restored (reported as one line)."""


def _checkpoints_dir(workdir) -> epath.Path:
  return workdir_lib.resolve(workdir) / 'checkpoints'


ASYNC_SETTINGS = ('auto', 'on', 'off')


def use_async(setting: str, platform: str | None = None) -> bool:
  """`config.async_checkpoints` on devices of `platform` (default: JAX's default backend): 'auto'
  saves asynchronously off CPU (where device-to-host copies are cheap next to the file writes a
  step can hide) and synchronously on CPU; 'on' / 'off'."""
  if setting not in ASYNC_SETTINGS:
    raise ValueError(f'config.async_checkpoints: got {setting!r}, allowed {list(ASYNC_SETTINGS)}')
  return setting == 'on' or (setting == 'auto' and
                             (platform or jax.default_backend()) != 'cpu')


class _Manager(ocp.CheckpointManager):
  """orbax's manager, less its own question to JAX's preemption sync point.

  orbax asks `reached_preemption_sync_point(step)` with the global step during every save (for
  its logs and statistics); JAX keeps the last count it was given, and the train loop counts this
  run's steps instead (ctr_jax/training/preemption.py says why): orbax's count would move the
  step at which the processes agree to stop.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


def manager(workdir, max_to_keep: int = 3, async_save: bool = False) -> ocp.CheckpointManager:
  if async_save:  # a write fails in the background, between our calls: keep its logs quiet too
    _install_background_filter()
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=async_save)
  return _Manager(_checkpoints_dir(workdir), options=options,
                  item_names=('state', 'data_iter', 'meta'))


def save(mngr: ocp.CheckpointManager, step: int, state, data_iter_state, meta: dict, *,
         wait: bool = True) -> None:
  """Saves checkpoint `step`. An async manager (`manager(async_save=True)`) with `wait=False`
  returns once the arrays are on the host; the write goes on, and the next `save` or `finish`
  waits for it. The previous write's failure is reported here, under its own step."""
  finish(mngr)
  with _disk_full_is_one_line(mngr, step):
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data_iter=ocp.args.JsonSave(data_iter_state or {}),
        meta=ocp.args.JsonSave(meta)), force=True)
    if wait:
      mngr.wait_until_finished()


def finish(mngr: ocp.CheckpointManager) -> None:
  """Waits for a checkpoint write in flight (async saves); a full disk is reported as `save`
  reports it. A no-op for synchronous managers."""
  with _disk_full_is_one_line(mngr, mngr.latest_step()):
    mngr.wait_until_finished()


@contextlib.contextmanager
def _disk_full_is_one_line(mngr: ocp.CheckpointManager, step):
  quiet = _DropDiskFullLogs()  # orbax logs each failing writer thread's traceback: we report once
  logging.getLogger('absl').addFilter(quiet)
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if not _is_disk_full(e):
      raise
    quiet.active = True  # the other writer threads now fail too: their logs say nothing new
    _join_orbax_threads()  # they must end before their temporary files are removed
    directory = epath.Path(mngr.directory)
    _remove_temporaries(directory, step)
    raise CheckpointError(f'no space left on the device of {directory.parent} while saving the '
                          f'checkpoint of step {step} ({_free_space(directory)} free); the '
                          'partial checkpoint was removed, free some space and rerun to '
                          'resume') from None
  finally:
    logging.getLogger('absl').removeFilter(quiet)


class _DropDiskFullLogs(logging.Filter):

  active = False

  def filter(self, record):
    error = record.exc_info[1] if record.exc_info else None
    return not (self.active or 'No space left on device' in record.getMessage()
                or (error is not None and _is_disk_full(error)))


_BACKGROUND_FILTER = []


def _install_background_filter() -> None:
  """Drops absl log records about a full disk for the whole process (a background write's
  failure is reported once, as a CheckpointError, by the next `save` or `finish`)."""
  if not _BACKGROUND_FILTER:
    _BACKGROUND_FILTER.append(_DropDiskFullLogs())
    logging.getLogger('absl').addFilter(_BACKGROUND_FILTER[0])


def _join_orbax_threads(timeout: float = 60.0) -> None:
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and type(thread).__module__.startswith('orbax'):
      thread.join(timeout)


def _is_disk_full(error: BaseException) -> bool:
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
      return True
    if 'No space left on device' in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


def _remove_temporaries(directory: epath.Path, step: int) -> None:
  if not directory.exists():
    return
  for entry in directory.iterdir():
    if entry.name.startswith(f'{step}.') and 'tmp' in entry.name:
      entry.rmtree() if entry.is_dir() else entry.unlink()


def _free_space(directory: epath.Path) -> str:
  if not workdir_lib.is_local(directory):
    return 'unknown free space'
  try:
    free = shutil.disk_usage(directory if directory.exists() else directory.parent).free
  except OSError:
    return 'unknown free space'
  return f'{free / 2**20:,.1f} MiB'


def steps(workdir) -> list[int]:
  path = _checkpoints_dir(workdir)
  if not path.exists():
    return []
  return sorted(int(d.name) for d in path.iterdir() if d.name.isdigit())


def latest_finished_step(workdir) -> int | None:
  """The newest checkpoint that orbax finished and that has its metadata, or None.

  orbax writes a checkpoint under a temporary name (`N.orbax-checkpoint-tmp`) and renames it to
  `N` once every process has written its part; on object stores, which cannot rename, it writes
  into `N` and adds `commit_success.txt` last. A save cut short by a lost process is never listed
  here, and `restore_latest` skips it too. Plain listing, no orbax helper: this also runs from a
  watchdog thread while the interpreter may be shutting down (no new thread pools then).
  """
  path = _checkpoints_dir(workdir)
  local = workdir_lib.is_local(path)
  finished = [s for s in steps(workdir)  # names of digits only: not the temporary ones
              if (path / str(s) / 'meta' / 'metadata').exists()
              and (local or (path / str(s) / 'commit_success.txt').exists())]
  return max(finished, default=None)


def read_meta(workdir) -> dict | None:
  """The metadata (config, step) of the newest checkpoint in `workdir` that has it, or None.

  A checkpoint without metadata (or with metadata that is not JSON) is incomplete:
  `restore_latest` never restores it, so the model check of the caller is made against the
  checkpoint that can actually be restored.
  """
  found = _newest_meta(workdir)
  return found[1] if found else None


def _newest_meta(workdir) -> tuple[int, dict] | None:
  path = _checkpoints_dir(workdir)
  for step in reversed(steps(workdir)):
    meta_file = path / str(step) / 'meta' / 'metadata'
    if meta_file.exists():
      try:
        return step, json.loads(meta_file.read_text())
      except (ValueError, UnicodeDecodeError):
        continue  # damaged: as if missing
  return None


def newest_meta(workdir) -> tuple[int, dict]:
  """(step, metadata) of the newest checkpoint in `workdir` with readable metadata.

  Raises ValueError when `workdir` holds no checkpoint, CheckpointError when it holds some but
  none with readable metadata.
  """
  found = _newest_meta(workdir)
  if found is None and steps(workdir):
    raise CheckpointError(f'no checkpoint in {_checkpoints_dir(workdir)} has readable metadata '
                          '(<step>/meta/metadata, JSON): they are damaged')
  if found is None:
    raise ValueError(f'{workdir} holds no checkpoint (give the workdir of a training run)')
  return found


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """Restores (state, data-iterator state, meta) onto the shardings of `abstract_state`."""
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      data_iter=ocp.args.JsonRestore(),
      meta=ocp.args.JsonRestore()))
  return restored['state'], restored['data_iter'], restored['meta']


def restore_latest(mngr: ocp.CheckpointManager, abstract_state, *, strict: bool):
  """(step, state, data-iterator state, meta) of the newest checkpoint that restores, or None.

  A damaged checkpoint (truncated or missing files) is moved to `<workdir>/damaged_checkpoints`
  with a one-line warning and the next older one is tried; `strict` raises instead.
  """
  directory = epath.Path(mngr.directory)
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      if not (directory / str(step) / 'meta' / 'metadata').exists():
        raise FileNotFoundError('meta/metadata is missing')
      return (step, *_restore_draining(mngr, step, abstract_state))
    except Exception as e:  # pylint: disable=broad-except  (orbax / tensorstore error types vary)
      reason = _first_line(e)
      older = [s for s in mngr.all_steps() if s < step]
      message = f'checkpoint step {step} in {directory} is damaged: {reason}'
      if strict or not older:
        hint = ('; config.strict_resume=False resumes from the older one' if older else
                '; no older checkpoint exists: use a new --workdir or delete it')
        raise CheckpointError(message + hint) from None
      if jax.process_index() == 0:
        aside = directory.parent / DAMAGED_DIR
        aside.mkdir(parents=True, exist_ok=True)
        (directory / str(step)).rename(aside / str(step))
      _sync_processes(f'ctr_jax_damaged_{step}')
      mngr.reload()
      print(f'ctr_jax: warning: {message}; moved it to {directory.parent / DAMAGED_DIR} and '
            f'resuming from step {max(older)}', file=sys.stderr, flush=True)
  return None


def _drain_then_close(coro):
  """orbax's `_run_sync_via_new_loop`, but the loop finishes its other tasks before it closes.

  When one read of a damaged checkpoint fails, tensorstore still completes the reads in flight;
  on a closed loop each prints an 'Event loop is closed' traceback (or 'Task exception was never
  retrieved'). Those say nothing about the damage, which is reported once.
  """
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coro)
  finally:
    pending = asyncio.all_tasks(loop)
    if pending:
      loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    asyncio.set_event_loop(None)
    loop.close()


def _restore_draining(mngr, step, abstract_state):
  return _draining(lambda: restore(mngr, step, abstract_state))


def _draining(read):
  """`read()` with orbax's event loop drained before it closes (`_drain_then_close`)."""
  if not hasattr(asyncio_utils, '_run_sync_via_new_loop'):  # another orbax: as it is
    return read()
  with mock.patch.object(asyncio_utils, '_run_sync_via_new_loop', _drain_then_close):
    return read()


def _sync_processes(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def _first_line(error: BaseException) -> str:
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  text = lines[0] if lines else type(error).__name__
  return text if len(text) <= 300 else text[:297] + '...'


def load_params(workdir, *, mesh: jax.sharding.Mesh | None = None,
                rules=sharding.DEFAULT_RULES, step: int | None = None):
  """(model config, params) of a training run's newest checkpoint (or `step`).

  Only the parameters are read, so the optimiser that wrote the checkpoint does not matter. They
  land on the shardings the trainer gives them on `mesh` (by their logical axis names and
  `rules`), or on the default device without a mesh. Every reader of trained weights (the
  studies, the benchmark, `config.init_from`) comes through here.
  """
  newest, meta = newest_meta(workdir)
  cfg = compat.saved_model_config(compat.split_moved_fields(meta['config']['model'])[0])
  model = models.build(cfg)
  dummy = jnp.zeros((1, 2), jnp.int32)
  abstract = jax.eval_shape(lambda rng: model.init(rng, dummy)['params'], jax.random.key(0))
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
  else:
    shardings = sharding.tree_shardings(abstract, mesh, rules,
                                        sharding.param_axes(model, dummy))
  target = {'params': abstract_with_shardings(abstract, shardings)}
  mngr = manager(workdir)
  step = newest if step is None else step
  args = ocp.args.Composite(state=ocp.args.PyTreeRestore(
      target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
      partial_restore=True))  # the parameters only: the optimizer state is not read
  try:
    restored = _draining(lambda: mngr.restore(step, args=args))
  except Exception as e:  # pylint: disable=broad-except  (orbax / tensorstore error types vary)
    raise CheckpointError(f'checkpoint step {step} in {mngr.directory} is damaged: '
                          f'{_first_line(e)}') from None
  return cfg, restored['state']['params']


def abstract_with_shardings(abstract_tree, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_tree, shardings)


# ------------------------------------------------------------------------------------------------
# Health: the first step whose loss or gradient norm was not finite (-1: none), on device.
# ------------------------------------------------------------------------------------------------


def health_init(sharding) -> jax.Array:
  return jax.device_put(np.int32(-1), sharding)


@jax.jit
def health_update(first_bad, step, loss, grad_norm):
  """Dispatched after every step; no host sync (read only before a save and at log steps)."""
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  return jnp.where((first_bad < 0) & ~finite, jnp.asarray(step, jnp.int32), first_bad)


def check_health(first_bad, last_good_step, workdir) -> None:
  bad = int(jax.device_get(first_bad))
  if bad >= 0:
    where = (f'the last good checkpoint is step {last_good_step} in {workdir}'
             if last_good_step is not None else 'no checkpoint was saved')
    raise CheckpointError(f'the loss or gradient norm became NaN or Inf at step {bad}; the '
                          f'state was not saved ({where}); lower optim.lr or check the data')


# ------------------------------------------------------------------------------------------------
# The partial logging window, saved with the checkpoint so that logged means do not depend on
# where a run stopped.
# ------------------------------------------------------------------------------------------------


def window_to_json(host_window: list[dict]) -> dict:
  if not host_window:
    return {'dtypes': {}, 'rows': []}
  dtypes = {k: str(np.asarray(v).dtype) for k, v in host_window[0].items()}
  rows = [{k: float(v) for k, v in row.items()} for row in host_window]
  return {'dtypes': dtypes, 'rows': rows}


def window_from_json(saved: dict | None) -> list[dict]:
  if not saved:
    return []
  dtypes = saved['dtypes']
  return [{k: np.asarray(v, dtypes[k]) for k, v in row.items()} for row in saved['rows']]
