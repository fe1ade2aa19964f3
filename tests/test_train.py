"""End-to-end training runs: files, resume, device counts, multi-process, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from ctr_jax import models, tasks, trainer
from ctr_jax.training import checkpointing, sharding, train_step
from helpers import run_main, snapshot, tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return {r['step']: r['train_loss'] for r in rows if 'train_loss' in r}


def test_train_evaluate_generate_end_to_end(data_dir, tmp_path, capsys):
  workdir = str(tmp_path / 'run')
  full = {'train.k_min': 2, 'eval_sequential': True, 'sample.num_tokens': 4}
  summary = trainer.train_and_evaluate(tiny_train_config(data_dir, **full), workdir)
  # The first line names the hardware and the mesh (8 fake CPU devices, mesh.data=-1 takes all).
  first, second = capsys.readouterr().out.splitlines()[:2]
  n, device = len(jax.devices()), jax.devices()[0]
  assert first == f'ctr_jax: {n} x {device.device_kind} (cpu), mesh data={n} fsdp=1 tensor=1'
  assert second.startswith('ctr_jax: 1 process(es), precision auto: float32 compute, float32 '
                           'parameters, workdir '), second
  for name in ('config.json', 'metrics.jsonl', 'summary.json', 'curves.png', 'tensorboard'):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    logged = [json.loads(line) for line in f]
  assert {'train_loss', 'train_ce', 'convergence_loss', 'grad_norm', 'param_norm', 'update_norm',
          'learning_rate', 'tokens_per_second'} <= set(logged[0])  # the names notebooks read
  with open(os.path.join(workdir, 'summary.json')) as f:
    written = json.load(f)
  for key in ('step', 'train_loss', 'val_loss', 'val_ppl', 'val_ppl_sequential',
              'tokens_per_second', 'num_params'):
    assert key in written, key
  assert written['step'] == 4 and summary['num_params'] == written['num_params']
  # Parallel K=3 on 16-token windows is not exact, but close to the exact scan.
  assert abs(written['val_ppl'] - written['val_ppl_sequential']) / written['val_ppl'] < 0.05
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4']
  # The parameters alone, as every reader of trained weights gets them, score the same.
  config = tiny_train_config(data_dir, **full)
  model_cfg, params = checkpointing.load_params(workdir)
  assert model_cfg.to_dict() == config.model.to_dict()
  again = tasks.make(config, 0, 1).evaluate(models.build(model_cfg), params, to_global=None,
                                            final=True)
  assert again['val_loss'] == pytest.approx(written['val_loss'], rel=1e-6)
  evaluated = trainer.train_and_evaluate(tiny_train_config(data_dir, job='evaluate', **full),
                                       workdir)
  assert evaluated['val_loss'] == pytest.approx(written['val_loss'], rel=1e-6)
  assert os.path.exists(os.path.join(workdir, 'evaluate.json'))
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f) == written  # the training summary is left alone
  generated = trainer.train_and_evaluate(tiny_train_config(data_dir, job='generate', **full),
                                       workdir)
  assert isinstance(generated['sample'], str) and generated['sample']
  assert os.path.exists(os.path.join(workdir, 'generate.json'))


WALL_CLOCK = ('tokens_per_second', 'tokens_per_second_per_device', 'mfu')


def metric_lines(workdir):
  """metrics.jsonl as written, less the wall-clock fields (the only ones allowed to differ)."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  return [json.dumps({k: v for k, v in r.items()
                      if k not in WALL_CLOCK and not k.endswith('_seconds')}) for r in rows]


def test_interrupted_and_resumed_run_reproduces_losses(data_dir, tmp_path):
  """Stopped at a non-log step, then killed after logging a step it never checkpointed."""
  options = dict(total_steps=6, log_every=4, eval_every=2, checkpoint_every=3)
  full = str(tmp_path / 'full')
  trainer.train_and_evaluate(tiny_train_config(data_dir, **options), full)
  split = str(tmp_path / 'split')
  first = trainer.train_and_evaluate(tiny_train_config(data_dir, **options, exit_at_step=3), split)
  assert first.get('interrupted') and first['step'] == 3
  # A SIGKILL after step 4 was logged but before its checkpoint: the row exists, the state not.
  with open(os.path.join(full, 'metrics.jsonl')) as f:
    step_4 = [line for line in f if json.loads(line)['step'] == 4]
  with open(os.path.join(split, 'metrics.jsonl'), 'a') as f:
    f.writelines(step_4)
  trainer.train_and_evaluate(tiny_train_config(data_dir, **options), split)
  assert train_losses(split) == train_losses(full)  # bit-for-bit on CPU
  # Every row and field (the step-4 mean covers steps 1-4 across the stop), in the same order.
  assert metric_lines(split) == metric_lines(full)


def test_checkpoint_from_before_a_new_model_field_resumes_only_with_its_old_default(
    data_dir, tmp_path):
  """A saved config lacking kernel_layout describes an [in, out] checkpoint."""
  cfg = tiny_train_config(data_dir)
  saved = json.loads(cfg.model.to_json())
  del saved['kernel_layout']
  meta_dir = tmp_path / 'checkpoints' / '4' / 'meta'
  meta_dir.mkdir(parents=True)
  (meta_dir / 'metadata').write_text(json.dumps({'config': {'model': saved}, 'step': 4}))
  with pytest.raises(trainer.UserError, match='kernel_layout'):
    trainer.prepare_workdir(cfg, str(tmp_path))
  cfg.model.kernel_layout = 'in_out'
  assert trainer.prepare_workdir(cfg, str(tmp_path)) == str(tmp_path)


def test_checkpoint_with_the_recipe_in_its_model_config_resumes_with_a_note(
    data_dir, tmp_path, capsys):
  """Checkpoints from before config.train kept remat, k_min, convergence_weight, train_mode in
  their model config; they resume, and a changed recipe is reported, not refused."""
  cfg = tiny_train_config(data_dir)
  saved = {**json.loads(cfg.model.to_json()), 'remat': False, 'k_min': 2,
           'convergence_weight': 0.1, 'train_mode': 'unroll'}
  meta_dir = tmp_path / 'checkpoints' / '4' / 'meta'
  meta_dir.mkdir(parents=True)
  (meta_dir / 'metadata').write_text(json.dumps({'config': {'model': saved}, 'step': 4}))
  assert trainer.prepare_workdir(cfg, str(tmp_path)) == str(tmp_path)
  assert 'train.k_min: 2 -> 0' in capsys.readouterr().out
  cfg.train.k_min = 2
  trainer.prepare_workdir(cfg, str(tmp_path))
  assert 'note' not in capsys.readouterr().out


def test_bptt_recipe_trains_a_language_model_through_bptt(data_dir, tmp_path):
  """--config.train.mode=bptt: the logged loss of step 1 is the BPTT loss, not the unroll's."""
  from ctr_jax import models, tasks  # pylint: disable=g-import-not-at-top
  from ctr_jax.inference import bptt  # pylint: disable=g-import-not-at-top
  from ctr_jax.tasks import losses  # pylint: disable=g-import-not-at-top
  cfg = tiny_train_config(data_dir, total_steps=1, **{'train.mode': 'bptt', 'train.k_min': 2})
  trainer.train_and_evaluate(cfg, str(tmp_path))
  logged = train_losses(str(tmp_path))[1]
  model = models.build(cfg.model)
  params = model.init(jax.random.key(cfg.seed), np.zeros((1, 16), np.int32))['params']
  batch = jax.numpy.asarray(next(tasks.make(cfg, 0, 1).train_iter))
  logits = bptt.bptt_logits(model, params, batch[:, :-1])
  expected = float(losses.next_token_loss(logits, batch[:, 1:])[0])
  # The K = 1 unroll (a different function) is far off; the logged loss is BPTT's to rounding.
  unroll = float(train_step.objective_loss(model, params, batch, losses.NextToken(), k_unroll=1)[1]['ce_loss'])
  assert abs(logged - expected) <= 1e-6 * expected < 1e-2 * abs(unroll - expected)
  with open(os.path.join(str(tmp_path), 'metrics.jsonl')) as f:
    row = json.loads(f.readline())
  assert 'train_ce' in row and 'convergence_loss' not in row  # BPTT has no convergence term


@pytest.mark.slow
def test_one_and_eight_devices_give_the_same_losses(data_dir, tmp_path):
  assert len(jax.devices()) == 8
  one = str(tmp_path / 'one')
  trainer.train_and_evaluate(tiny_train_config(data_dir), one, devices=jax.devices()[:1])
  eight = str(tmp_path / 'eight')
  cfg = tiny_train_config(data_dir, **{'mesh.data': 2, 'mesh.fsdp': 2, 'mesh.tensor': 2})
  trainer.train_and_evaluate(cfg, eight)
  a, b = train_losses(one), train_losses(eight)
  assert a.keys() == b.keys()
  np.testing.assert_allclose(list(a.values()), list(b.values()), rtol=1e-5)
  # A checkpoint written on 8 devices resumes on 1.
  resumed = trainer.train_and_evaluate(tiny_train_config(data_dir, total_steps=6), eight,
                                     devices=jax.devices()[:1])
  assert resumed['step'] == 6


def test_random_depth_draws_are_reproducible():
  cfg = tiny_train_config('/unused', **{'train.k_min': 2})
  draws = [train_step.k_for_step(cfg.train, cfg.model, 0, s) for s in range(200)]
  assert set(draws) == {2, 3}
  assert draws == [train_step.k_for_step(cfg.train, cfg.model, 0, s) for s in range(200)]
  # The draws of runs made before the recipe moved to config.train (resumes reproduce them).
  assert draws[:12] == [3, 2, 3, 3, 2, 2, 2, 3, 3, 2, 3, 3]  # trainer.k_for_step at ee5ded6
  cfg.train.mode = 'bptt'  # BPTT has no K: one compiled step
  assert {train_step.k_for_step(cfg.train, cfg.model, 0, s) for s in range(20)} == {3}


def _tiny_flags(data_dir):
  return ['--config=configs/quickstart.py', f'--config.data.data_dir={data_dir}',
          '--config.model.width=32', '--config.model.depth=1', '--config.model.num_heads=2',
          '--config.model.vocab_size=320', '--config.data.seq_len=16', '--config.batch_size=4',
          '--config.eval_batches=1', '--config.sample.num_tokens=2']


BAD_INPUTS = {
    'unknown_key': (['--config.modle.width=3'], 'modle'),
    'invalid_value': (['--config.model.k_unroll=0'], 'k_unroll'),
    'unknown_dataset': (['--config.data.name=c4'], 'data.name'),
    'missing_manual_dir': (['--config.data.name=openwebtext',
                            '--config.data.manual_dir=/nonexistent/owt'], 'manual_dir'),
    'bad_config_arg': (['--config=configs/quickstart.py:bogus=1'], 'bogus'),
    'moved_model_field': (['--config.model.k_min=2'], 'config.train.k_min'),
    'bptt_transformer': (['--config.model.kind=transformer', '--config.train.mode=bptt'],
                         'config.train.mode'),
}


@pytest.mark.parametrize('case', sorted(BAD_INPUTS))
def test_bad_input_is_one_line_without_traceback(case, data_dir, tmp_path):
  extra, needle = BAD_INPUTS[case]
  workdir = tmp_path / 'work'
  result = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', *extra])
  assert result.returncode != 0
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert needle in result.stderr, result.stderr[-2000:]
  assert not workdir.exists() or not any(workdir.iterdir())


@pytest.mark.slow
def test_unwritable_workdir_and_incompatible_checkpoint(data_dir, tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  result = run_main([*_tiny_flags(data_dir), f'--workdir={blocker}/sub'])
  assert result.returncode != 0 and 'Traceback' not in result.stderr
  assert 'not writable' in result.stderr
  workdir = tmp_path / 'run'
  ok = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.total_steps=2',
                  '--config.checkpoint_every=2'])
  assert ok.returncode == 0, ok.stderr[-3000:]
  # As a user sees it on one CPU device (run_main): the platform line first.
  kind = jax.devices()[0].device_kind
  assert ok.stdout.splitlines()[0] == f'ctr_jax: 1 x {kind} (cpu), mesh data=1 fsdp=1 tensor=1'
  before = snapshot(workdir)
  clash = run_main([*_tiny_flags(data_dir), f'--workdir={workdir}', '--config.model.width=64'])
  assert clash.returncode != 0 and 'Traceback' not in clash.stderr
  assert 'different model config' in clash.stderr and 'width' in clash.stderr
  assert snapshot(workdir) == before


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(data_dir, tmp_path):
  workdir = tmp_path / 'run'
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}
  proc = subprocess.Popen(
      [sys.executable, '-m', 'ctr_jax.main', *_tiny_flags(data_dir), f'--workdir={workdir}',
       '--config.total_steps=100000', '--config.log_every=1', '--config.checkpoint_every=100000'],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics_file = workdir / 'metrics.jsonl'
  deadline = time.time() + 180
  while time.time() < deadline and not (metrics_file.exists() and metrics_file.stat().st_size):
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert 'stopped (SIGTERM)' in out
  steps = [int(d) for d in os.listdir(workdir / 'checkpoints') if d.isdigit()]
  assert len(steps) == 1 and steps[0] >= 1


TWO_PROCESS_DRIVER = r'''
import json
import jax
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
jax.distributed.initialize(coordinator_address='127.0.0.1:{port}', num_processes=2,
                           process_id={pid})
from ctr_jax import trainer
from ctr_jax.training import train_step
from helpers import tiny_train_config
cfg = tiny_train_config({data_dir!r}, total_steps=3, eval_every=100, checkpoint_every=3)
cfg.sample.num_tokens = 0
summary = trainer.train_and_evaluate(cfg, {workdir!r})
print('RESULT', json.dumps({{'train_loss': summary['train_loss'], 'val_loss': summary['val_loss'],
                            'processes': jax.process_count(), 'devices': jax.device_count()}}))
'''


@pytest.mark.slow
def test_two_processes_train_together_and_agree(data_dir, tmp_path):
  import portpicker
  port = portpicker.pick_unused_port()
  workdir = str(tmp_path / 'shared')
  procs = []
  for pid in range(2):
    code = TWO_PROCESS_DRIVER.format(port=port,
                                     pid=pid, data_dir=data_dir, workdir=workdir)
    # The driver imports the tests' helpers: the tests directory is on its import path.
    env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
           'JAX_PLATFORMS': 'cpu',
           'PYTHONPATH': os.pathsep.join([ROOT, os.path.join(ROOT, 'tests')])}
    procs.append(subprocess.Popen([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
  results = []
  for proc in procs:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    line = [l for l in out.splitlines() if l.startswith('RESULT')][0]
    results.append(json.loads(line.split(' ', 1)[1]))
  assert results[0] == results[1]
  assert results[0]['processes'] == 2 and results[0]['devices'] == 2
  # The same global batches on one process with two devices give the same losses.
  single = trainer.train_and_evaluate(
      tiny_train_config(data_dir, total_steps=3, eval_every=100, checkpoint_every=3),
      str(tmp_path / 'single'), devices=jax.devices()[:2])
  assert results[0]['train_loss'] == pytest.approx(single['train_loss'], rel=1e-5)


@pytest.mark.slow
def test_init_from_converts_or_continues_a_transformer_exactly(data_dir, tmp_path):
  # Also grows it (a deeper transformer run). A learning rate of ~0 leaves the weights as loaded: the first evaluation then shows whether
  # the converted model (zero-initialised correction) and the continued transformer reproduce
  # the source transformer's validation loss.
  source = str(tmp_path / 'source')
  shape = dict(width=32, depth=1, num_heads=2, vocab_size=320, max_len=64)
  t_cfg = tiny_train_config(data_dir, total_steps=2)
  t_cfg.model = models.model_config(kind='transformer', **shape)
  trained = trainer.train_and_evaluate(t_cfg, source)
  for kind, depth in (('context_ready', 1), ('transformer', 1), ('transformer', 3)):
    cfg = tiny_train_config(data_dir, total_steps=1, init_from=source, eval_sequential=True,
                            **{'optim.lr': 1e-30, 'optim.warmup_steps': 0})
    cfg.model = models.model_config(kind=kind, k_unroll=3, **{**shape, 'depth': depth})
    summary = trainer.train_and_evaluate(cfg, str(tmp_path / f'{kind}{depth}'))
    # depth 3: grown by two pass-through blocks (convert.grow_transformer)
    assert summary['val_loss'] == pytest.approx(trained['val_loss'], rel=1e-6), (kind, depth)
    if kind == 'context_ready':
      assert summary['val_loss_sequential'] == pytest.approx(trained['val_loss'], rel=1e-6)
  other = tiny_train_config(data_dir, total_steps=1, init_from=source)
  other.model = models.model_config(kind='transformer', **{**shape, 'width': 64})
  with pytest.raises(ValueError, match='init_from'):
    trainer.train_and_evaluate(other, str(tmp_path / 'other'))


def test_platform_line_counts_devices_by_kind_and_names_the_mesh():
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 2, 'tensor': 2}, jax.devices()[:8])
  kind = jax.devices()[0].device_kind
  assert trainer.platform_line(mesh) == (
      f'ctr_jax: 8 x {kind} ({jax.devices()[0].platform}), mesh data=2 fsdp=2 tensor=2')
