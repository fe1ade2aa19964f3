"""Training and evaluation: `train_and_evaluate(config, workdir)`, read top to bottom.

Resume order (the first that applies wins):
  1. the latest checkpoint in `workdir` (a restarted or preempted run continues);
  2. `config.init_from`: a transformer checkpoint, converted to a context-ready model (a
     transformer run instead continues its weights, or grows them by pass-through blocks on top
     when it is deeper), with a fresh optimiser and schedule;
  3. a fresh initialisation from `config.seed`.

What a crash, a full disk, a damaged checkpoint or a second run on the same workdir do is listed in
docs/reliability.md (ctr_jax/training/workdir.py and ctr_jax/training/checkpointing.py).
"""

import contextlib
import dataclasses
import functools
import json
import time

import jax
import numpy as np
from tqdm import tqdm

from ctr_jax import config_lib, models, tasks
from ctr_jax.reporting import peaks
from ctr_jax.training import (
  aot,
  checkpointing,
  compat,
  init_from,
  metrics,
  optim,
  preemption,
  resume,
  sharding,
  signals,
  train_step,
)
from ctr_jax.training import program as program_lib
from ctr_jax.training import workdir as workdir_lib


class UserError(ValueError):
  """A problem with the user's input: reported as one line, without a traceback."""


def prepare_workdir(config, workdir: str) -> str:
  """Validates everything that can be checked before a file is written; returns the abs path."""
  config_lib.validate(config)
  workdir = workdir_lib.resolve(workdir)
  workdir_lib.ensure_writable(workdir)
  workdir = str(workdir)
  meta = checkpointing.read_meta(workdir)
  if meta is not None:
    # A field the saved config lacks was added later; the checkpoint has its old default.
    defaults = json.loads(json.dumps(compat.LEGACY_DEFAULTS))  # as JSON stores them
    saved, moved = compat.split_moved_fields(meta.get('config', {}).get('model', {}))
    saved = {**defaults, **saved}
    _note_recipe_change(workdir, moved, dataclasses.asdict(
        train_step.Recipe.from_config(config.train)))  # remat by name (True -> 'iteration')
    current = json.loads(config.model.to_json())
    diff = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    if diff:
      raise UserError(f'the checkpoint in {workdir} was trained with a different model config '
                      f'(fields {diff}); use a new --workdir')
    config_lib.check_resumable(meta.get('config', {}), config, workdir)
    resume.check_data_position(meta.get('config', {}), config, workdir)
  elif config.job not in ('train', 'prepare', 'compile'):
    raise UserError(f'config.job={config.job!r} needs a checkpoint, but {workdir} has none')
  return workdir


def _note_recipe_change(workdir, saved_recipe: dict, current: dict) -> None:
  # A checkpoint from before config.train kept the recipe in its model config; changing the
  # recipe on resume is allowed, but say so.
  changed = {k: (v, current.get(k)) for k, v in saved_recipe.items() if current.get(k) != v}
  if changed and jax.process_index() == 0:
    text = ', '.join(f'train.{k}: {old!r} -> {new!r}' for k, (old, new) in sorted(changed.items()))
    print(f'ctr_jax: note: the checkpoint in {workdir} keeps its training recipe in its model '
          f'config (an older version); resuming with the current config.train ({text})',
          flush=True)


def train_and_evaluate(config, workdir: str, devices=None) -> dict:
  """Runs `config.job` in `workdir` (locked for the run; see docs/reliability.md).

  SIGTERM and SIGINT stop the run: in the train loop after saving the step in progress, elsewhere
  at once (ctr_jax/training/signals.py); the summary then has `interrupted` and `signal`.
  """
  # Before anything touches the workdir, with the devices the mesh will use.
  config_lib.validate(config, devices if devices is not None else jax.devices())
  # Several processes: JAX's own SIGTERM handler tells them all (ctr_jax/training/preemption.py).
  stop, run = signals.Signals(forward_to_jax=preemption.synchronised()), None
  try:
    with stop:
      run = workdir_lib.Run(workdir, active=jax.process_index() == 0)
      summary = _train_and_evaluate(config, str(run), devices, run, stop)
  except signals.Interrupted as interrupted:
    return _stopped_outside_the_loop(interrupted, stop.phase, run, config.job)
  except BaseException:
    if run is not None:
      run.fail()  # removes what this run created if it saved nothing
    raise
  run.finish()
  return summary


def _stopped_outside_the_loop(interrupted, phase: str, run, job: str) -> dict:
  """Says what a signal that did not wait for a save left on disk; removes only what a run
  stopped during its set-up created (nothing a user could want)."""
  name = signals.name(interrupted.signum)
  summary = {'step': None, 'interrupted': True, 'signal': name}
  if run is None:  # before the workdir was locked: nothing was written
    if jax.process_index() == 0:
      print(f'ctr_jax: stopped by {name} before the run started; nothing was written', flush=True)
    return summary
  saved = checkpointing.steps(run.path)
  latest = f'the latest checkpoint is step {saved[-1]} in {run}' if saved else (
      f'{run} holds no checkpoint')
  summary['step'] = saved[-1] if saved else None
  if phase == signals.TRAINING:  # a second signal: it does not wait for the save
    what = f'a second signal does not wait for a save: the steps since it are lost; {latest}'
  elif saved:
    again = 'resume' if job == 'train' else f'run the {job} job again'
    what = f'nothing new to save: {latest}; rerun to {again}'
  elif phase == signals.SET_UP:
    what = f'nothing was trained, so nothing needed saving; removed what this run created in {run}'
  else:
    what = f'nothing to save; {latest}'
  if run.active:
    print(f'ctr_jax: stopped by {name} during {phase}; {what}', flush=True)
  if phase == signals.SET_UP and not saved:
    run.fail()
  else:
    run.finish()
  return summary


def _train_and_evaluate(config, workdir: str, devices, run, stop: signals.Signals) -> dict:
  # ----------------------------------------------------------------------------------------------
  # Workdir, processes, mesh.
  # ----------------------------------------------------------------------------------------------
  process_index, process_count = jax.process_index(), jax.process_count()
  is_chief = process_index == 0
  mesh = sharding.make_mesh(config.mesh, devices)
  platform = mesh.devices.flat[0].platform
  model_config = config_lib.model_config_for(config, platform)  # the compute dtype resolved
  if is_chief:  # the first line: which hardware the run got (a Colab GPU runtime may be a CPU)
    print(platform_line(mesh), flush=True)
  workdir = prepare_workdir(config, workdir)
  if is_chief:
    print(f'ctr_jax: {process_count} process(es), precision {config.get("precision", "auto")}: '
          f'{model_config.dtype} compute, {model_config.param_dtype} parameters, '
          f'workdir {workdir}', flush=True)

  if config.job == 'compile':  # memory and FLOPs of the step from shapes: no data, no state
    return aot.compile_job(config, model_config, mesh, workdir, is_chief)

  # ----------------------------------------------------------------------------------------------
  # Data.
  # ----------------------------------------------------------------------------------------------
  task = tasks.make(config, process_index, process_count)
  if config.job == 'prepare':  # dataset, tokenizer and token caches are built: nothing else
    return {'step': 0, 'prepared': config.data.name}

  # ----------------------------------------------------------------------------------------------
  # Model, optimizer, the sharded train state's shapes and the step (ctr_jax/training/program.py,
  # which the compile job builds too).
  # ----------------------------------------------------------------------------------------------
  program = program_lib.build(config, model_config, mesh, task)
  model, rules, repl = program.model, program.rules, program.replicated
  abstract_state, state_shardings = program.abstract_state, program.state_shardings

  def to_global(local_batch):  # an array, or a dict of arrays sharing the batch axis
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(program.batch_sharding, np.asarray(x)),
        local_batch)

  # ----------------------------------------------------------------------------------------------
  # Restore (see the resume order in the module docstring).
  # ----------------------------------------------------------------------------------------------
  mngr = checkpointing.manager(workdir, config.keep_checkpoints, async_save=(
      config.job == 'train'
      and checkpointing.use_async(config.get('async_checkpoints', 'auto'), platform)))
  earlier_seconds = 0.0  # time spent by earlier runs of this workdir; None if unknown
  window = []  # per-step metrics of the logging window in progress (restored with the state)
  with jax.set_mesh(mesh):
    restored = checkpointing.restore_latest(
        mngr, checkpointing.abstract_with_shardings(abstract_state, state_shardings),
        strict=config.get('strict_resume', False))
    latest = restored[0] if restored else None
    if latest is not None:
      _, state, iter_state, restored_meta = restored
      window = checkpointing.window_from_json((restored_meta or {}).get('metrics_window'))
      if iter_state:
        task.train_iter.set_state(iter_state)
      # Checkpoints written before this field existed do not know their training time.
      earlier_seconds = (restored_meta or {}).get('train_seconds')
      if is_chief:
        print(f'ctr_jax: resumed from the checkpoint at step {latest}', flush=True)
    else:
      state = program.init(jax.random.key(config.seed))
      if config.init_from:
        state = init_from.load_into(config, state, state_shardings, mesh, rules)
  num_params = models.count_params(state['params'])
  if is_chief:
    # Rows past the restored step were written after its checkpoint: the resumed run rewrites them.
    metrics.drop_rows_after(workdir, latest or 0)
    workdir_lib.write_config(workdir, json.loads(config.to_json()), latest)

  run_start = time.perf_counter()

  def run_eval(state, final=False):
    with program.context():
      return task.evaluate(model, state['params'], to_global=to_global, final=final)

  writer = metrics.MetricWriter(workdir, active=is_chief)
  schedule = optim.learning_rate_schedule(config.optim, config.total_steps)
  step = int(jax.device_get(state['step']))
  summary = {'step': step, 'num_params': num_params}

  # ----------------------------------------------------------------------------------------------
  # Train loop.
  # ----------------------------------------------------------------------------------------------
  # A signal stops every process after the same step (ctr_jax/training/preemption.py).
  stopper = preemption.Stopper(stop, active=config.job == 'train')
  progress = _progress_bar(is_chief and config.job == 'train', step, config.total_steps)
  # Tokens/s (per device too) and MFU: model FLOPs over the mesh's peak in the compute dtype.
  peak = (peaks.mesh_peak_flops(mesh, model_config.dtype)
          if is_chief and config.job == 'train' else None)
  throughput = metrics.Throughput(config.batch_size * config.data.seq_len, mesh.size, peak)
  flops_per_step = functools.cache(functools.partial(metrics.flops_per_step, config))
  profiler = metrics.Profiler(workdir, metrics.profile_range(config.get('profile_steps', ''), step),
                              active=is_chief)
  health = checkpointing.health_init(repl)  # first step with a NaN/Inf loss or gradient norm
  last_saved = latest
  stop.phase = signals.TRAINING
  stop.deferring = True  # a signal in the loop ends the step in progress, which is saved
  try:
    while config.job == 'train' and step < config.total_steps:
      batch = to_global(next(task.train_iter))
      k = train_step.k_for_step(config.train, config.model, config.seed, step)
      profiler.before_step(step)
      with program.context():  # one jitted step per K value (random depth draws K per batch)
        state, step_metrics = program.step(k)(state, batch)
      step += 1
      throughput.step(flops_per_step(k))
      profiler.after_step(step, step_metrics)
      window.append(step_metrics)
      health = checkpointing.health_update(health, step, step_metrics['loss'],
                                           step_metrics['grad_norm'])
      if step % config.log_every == 0 or step == config.total_steps:
        checkpointing.check_health(health, last_saved, workdir)
        host = jax.device_get(window)
        mean = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
        if not all(np.isfinite(v) for v in mean.values()):
          raise RuntimeError(f'a training metric became NaN or Inf somewhere within steps '
                             f'[{step - len(host) + 1}, {step}]: {mean}')
        # Speed of the steps this run took in the window (not those restored with it).
        speed = throughput.read()
        # The loss's own metrics under the task's names ('loss' first), then the optimiser's.
        own = sorted(set(mean) - {'loss', *OPTIMIZER_METRICS})
        logged = {tasks.metric_name(task, k): mean[k] for k in ['loss', *own]}
        writer.write(step, {**logged, **{k: mean[k] for k in OPTIMIZER_METRICS},
                            'learning_rate': float(schedule(step - 1)), **speed})
        summary.update(train_loss=mean['loss'], **speed)
        progress.set_postfix(_progress_fields(mean['loss'], speed))
        window = []
      progress.update(1)
      done_early = False
      if step % config.eval_every == 0 and step < config.total_steps:
        eval_start = time.perf_counter()
        evaluation = run_eval(state)
        writer.write(step, _scalars(evaluation))
        _report(is_chief, step, evaluation, progress)
        done_early = task.stop_early(evaluation)
        throughput.exclude(time.perf_counter() - eval_start)  # not training throughput
      stopping = stopper.after_step() or step == config.exit_at_step  # after_step: every step
      if (stopping or done_early or step % config.checkpoint_every == 0
          or step == config.total_steps):
        checkpointing.check_health(health, last_saved, workdir)  # never save a NaN state
        meta = _meta(config, step, _total_seconds(earlier_seconds, run_start))
        meta['metrics_window'] = checkpointing.window_to_json(jax.device_get(window))
        # Asynchronous saves (GPU/TPU) return once the state is on the host; a stop waits.
        checkpointing.save(mngr, step, state, task.train_iter.get_state(), meta, wait=stopping)
        run.saved, last_saved = True, step
      if stopping:
        if is_chief:
          reason = (signals.name(stop.received) if stop.received else
                    'SIGTERM' if stopper.signalled else 'config.exit_at_step')
          print(f'ctr_jax: saved step {step} and stopped ({reason}); rerun to resume', flush=True)
        summary.update(step=step, interrupted=True)
        if stop.received or stopper.signalled:
          summary['signal'] = signals.name(stop.received) if stop.received else 'SIGTERM'
        return summary
      if done_early:
        # The task says it is done (e.g. pointer chasing's stop_accuracy): the final
        # evaluation and the summary follow as after the last step.
        summary['stopped_early_at_step'] = step
        if is_chief:
          progress.write(f'ctr_jax: step {step}: the task is done; stopping early')
        break
  except BaseException:
    with contextlib.suppress(Exception):  # a write in flight ends; the first error is the one
      checkpointing.finish(mngr)
    raise
  finally:
    stop.deferring = False
    profiler.stop(state)
    progress.close()
  checkpointing.finish(mngr)  # the last asynchronous write is complete (or reported) from here
  stop.phase = 'the end of training (its last step is saved)'
  stop.raise_if_received()  # a signal after the last step's check

  # ----------------------------------------------------------------------------------------------
  # Final evaluation, a sample, summary.json and curves.png.
  # ----------------------------------------------------------------------------------------------
  summary['step'] = step
  # Over every run of this workdir (resumes included), up to the final evaluation.
  summary['wall_time_seconds'] = _total_seconds(earlier_seconds, run_start)
  if 'train_loss' not in summary:  # resumed at the last step: report the last logged loss
    logged = [r for r in metrics.read_metrics(workdir) if 'train_loss' in r]
    if logged:
      summary['train_loss'] = logged[-1]['train_loss']
  if config.job in ('train', 'evaluate'):
    stop.phase = 'the final evaluation'
    evaluation = run_eval(state, final=True)
    writer.write(step, _scalars(evaluation))
    _report(is_chief, step, evaluation, progress)
    summary.update(evaluation)
  if config.sample.num_tokens > 0 and task.has_sample:
    stop.phase = 'the sample'
    with jax.set_mesh(mesh):
      text = task.sample(model, state['params'], config, jax.random.key(config.seed + 2))
    summary['sample'] = text
    writer.write_text(step, 'sample', text)
    if is_chief:
      print(f'\n--- sample (step {step}) ---\n{text}\n---', flush=True)
  stop.phase = 'writing summary.json and curves.png'
  writer.close()
  if is_chief:
    # Only training writes summary.json; evaluate / generate jobs leave it intact.
    summary_name = {'train': 'summary.json'}.get(config.job, f'{config.job}.json')
    metrics.write_json(workdir_lib.resolve(workdir) / summary_name, summary)
    metrics.plot_curves(workdir)
  return summary


def platform_line(mesh: jax.sharding.Mesh) -> str:
  """'ctr_jax: 8 x NVIDIA H100 80GB HBM3 (gpu), mesh data=1 fsdp=8 tensor=1': the devices of
  `mesh` (all processes') by kind, their platform and the mesh's axis sizes."""
  devices = list(mesh.devices.flat)
  kinds = {}
  for d in devices:
    kinds[d.device_kind] = kinds.get(d.device_kind, 0) + 1
  what = ' + '.join(f'{n} x {kind}' for kind, n in kinds.items())
  axes = ' '.join(f'{name}={size}' for name, size in mesh.shape.items())
  return f'ctr_jax: {what} ({devices[0].platform}), mesh {axes}'


# What make_train_step adds to the loss's metrics (logged under these names).
OPTIMIZER_METRICS = ('grad_norm', 'param_norm', 'update_norm')


def _scalars(evaluation: dict) -> dict:
  """Flattens nested evaluation results ({'level_accuracy': {'L0': ..}}) to scalar metrics."""
  flat = {}
  for key, value in evaluation.items():
    if isinstance(value, dict):
      flat.update({f'{key}/{k}': v for k, v in value.items()})
    else:
      flat[key] = value
  return flat


def _report(active, step, evaluation, progress):
  if active:
    text = ', '.join(f'{k} {v:.4g}' for k, v in _scalars(evaluation).items()
                     if isinstance(v, (int, float)))
    progress.write(f'ctr_jax: step {step}: {text}')


def _meta(config, step: int, train_seconds: float | None) -> dict:
  return {'step': step, 'config': json.loads(config.to_json()), 'train_seconds': train_seconds}


def _total_seconds(earlier_seconds: float | None, run_start: float) -> float | None:
  if earlier_seconds is None:
    return None
  return earlier_seconds + time.perf_counter() - run_start


def _progress_fields(loss: float, speed: dict) -> dict:
  fields = {'loss': f'{loss:.3f}', 'tok_s': f"{speed['tokens_per_second']:,.0f}"}
  if speed['tokens_per_second_per_device'] != speed['tokens_per_second']:
    fields['tok_s_dev'] = f"{speed['tokens_per_second_per_device']:,.0f}"
  if 'mfu' in speed:
    fields['mfu'] = f"{100 * speed['mfu']:.3g}%"
  return fields


def _progress_bar(active: bool, initial: int, total: int):
  return tqdm(total=total, initial=initial, disable=not active, unit='step', dynamic_ncols=True)
