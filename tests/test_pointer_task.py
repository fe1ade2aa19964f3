"""Pointer chasing through the trainer: BPTT and K-unroll runs, per-level summary, resume."""

import json
import os
import sys

import pytest

from ctr_jax import trainer
from ctr_jax.training import checkpointing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from configs import pointer_chasing as pc_config  # pylint: disable=g-import-not-at-top,wrong-import-position


def small(arg, **overrides):
  c = pc_config.get_config(arg)
  c.batch_size = 8
  c.model.width = 32
  c.total_steps = 4
  c.log_every = 2
  c.eval_every = 2
  c.eval_batches = 1
  c.checkpoint_every = 2
  c.pointer_eval_examples = 16
  for k, v in overrides.items():
    c[k] = v
  return c


@pytest.mark.parametrize('model', ['d1_bptt', 'd1_k3', 't2'])
def test_pointer_chasing_runs_report_levels(model, tmp_path):
  summary = trainer.train_and_evaluate(small(f'hops=2,model={model},steps=4'), str(tmp_path))
  with open(tmp_path / 'summary.json') as f:
    written = json.load(f)
  assert set(written['level_accuracy']) == {'L0', 'L1'}
  for key in ('final_query_accuracy', 'table_key_accuracy', 'levels_solved', 'step'):
    assert key in written
  assert written['eval_examples'] == 16 and summary['step'] == 4


def test_pointer_chasing_resume_is_exact(tmp_path):
  full = tmp_path / 'full'
  trainer.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1), str(full))
  split = tmp_path / 'split'
  trainer.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1, exit_at_step=2),
                           str(split))
  first_part = checkpointing.read_meta(str(split))['train_seconds']
  summary = trainer.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1),
                                     str(split))

  def losses(path):
    with open(path / 'metrics.jsonl') as f:
      return [r['train_loss'] for r in map(json.loads, f) if 'train_loss' in r]
  assert losses(full) == losses(split)
  # The wall time covers both runs; a rerun at the last step still reports the last loss.
  assert summary['wall_time_seconds'] > first_part > 0
  trained = checkpointing.read_meta(str(split))['train_seconds']  # up to the step-4 checkpoint
  again = trainer.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1), str(split))
  assert again['train_loss'] == losses(split)[-1] and again['step'] == 4
  assert again['wall_time_seconds'] > trained > first_part


@pytest.mark.parametrize('helper,kind,count', [('entry_targets', 'ENTRY_TARGET', 16),
                                                ('equals_targets', 'EQUALS_TARGET', 24)])
def test_helper_targets_shape_training_batches_only(helper, kind, count):
  from ctr_jax.data import pointer_chasing  # pylint: disable=g-import-not-at-top
  from ctr_jax.tasks import pointer_chasing as pointer_task  # pylint: disable=g-import-not-at-top
  config = small(f'hops=3,model=t1,{helper}=1')
  assert config.data[helper] is True
  task = pointer_task.PointerChasing(config, process_index=0, process_count=1)
  batch = next(task.train_iter)
  labels = pointer_chasing.position_labels(3)
  helped = labels.kind == getattr(pointer_chasing, kind)
  assert helped.sum() == count and (batch['targets'][:, helped] >= 0).all()
  plain = pointer_task.PointerChasing(small('hops=3,model=t1'), 0, 1)
  assert (next(plain.train_iter)['targets'][:, helped] == -1).all()
  with pytest.raises(ValueError, match=helper):
    pc_config.get_config(f'{helper}=2')


def test_sweep_report_keeps_notes_and_separates_helper_runs(tmp_path):
  from ctr_jax.projects.pointer_chasing import sweep  # pylint: disable=g-import-not-at-top

  def record(model, entry, l1, equals=False):
    return {'model': model, 'hops': 2, 'entry_targets': entry, 'equals_targets': equals,
            'steps': 10, 'depth': 1,
            'kind': 'transformer' if model[0] == 't' else 'context_ready',
            'level_accuracy': {'L0': 1.0, 'L1': l1}, 'final_query_accuracy': l1,
            'table_key_accuracy': 0.5, 'levels_solved': 1 + (l1 > 0.9), 'train_loss': 1.0,
            'wall_time_seconds': 60.0, 'eval_examples': 16, 'command': 'x'}
  runs = [record('d1_bptt', False, 0.25), record('d1_bptt', True, 0.97), record('t1', False, 0.2),
          record('d1_bptt', False, 0.5, equals=True)]
  sweep.write_report(runs, str(tmp_path), 'test machine')
  md = tmp_path / 'pointer_chasing.md'
  md.write_text(md.read_text() + '## Hand-written notes\nkept\n')
  sweep.write_report(runs, str(tmp_path), 'test machine')
  text = md.read_text()
  assert text.count('## Hand-written notes\nkept') == 1
  assert '| d1_bptt + entry | 1.000 | 0.970 |' in text and '| d1_bptt | 1.000 | 0.250 |' in text
  assert '| d1_bptt + equals | 1.000 | 0.500 |' in text
  assert len(json.loads((tmp_path / 'pointer_chasing.json').read_text())) == 4
  assert (tmp_path / 'pointer_chasing.png').stat().st_size > 0
  assert len({sweep._key(r) for r in runs}) == 4  # pylint: disable=protected-access
  # A run that stopped early, solved, is finished; one interrupted at the same step is not.
  assert sweep.finished({'step': 1000, 'stopped_early_at_step': 1000}, 5000)
  assert not sweep.finished({'step': 1000}, 5000) and sweep.finished({'step': 5000}, 5000)
  sweep.write_report([{**runs[0], 'stopped_early_at_step': 10, 'seed': 2,
                       'entry_targets': True, 'equals_targets': True}], str(tmp_path), 'machine')
  assert '| d1_bptt + dense (entry + equals) (seed 2) |' in md.read_text()
  assert '| 10 (solved, stopped) |' in md.read_text()
  assert '| 1.0 min | not recorded |' in md.read_text()
  sweep.write_report([{**runs[0], 'machines': ['Intel(R) Xeon(R) Processor, 2 logical cores']}],
                     str(tmp_path), 'machine')
  assert '| 1.0 min | Intel Xeon, 2 cores |' in md.read_text()
  assert sweep.short_machine('AMD EPYC 7B13 64-Core Processor, 2 logical cores') == (
      'AMD EPYC 7B13, 2 cores')
  assert sweep.short_machine('AMD EPYC 9654 96-Core Processor, 16 logical cores, '
                             '1 x NVIDIA H200') == '1 x NVIDIA H200 (AMD EPYC 9654, 16 cores)'
  assert 'stop_accuracy=0.99' in ' '.join(sweep.command_for('t1', 2, 10, 'w', stop_accuracy=0.99))


@pytest.mark.slow
def test_gpu_sweep_script_fits_its_budget_and_records_commands(tmp_path):
  """launch/pointer_chasing_h10.sh on tiny settings: a probe per model, the step count cut to
  the budget with a warning, and every row's command being the launch that trained it."""
  import subprocess  # pylint: disable=g-import-not-at-top
  tiny = ('--config.batch_size=4 --config.model.width=32 --config.eval_batches=1 '
          '--config.pointer_eval_examples=16')
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
         'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT, 'POINTER_BUDGET_S': '0.05',
         'POINTER_ARGS': '--hops=2 --models=t1 --steps=500 --probe_steps=4 --first_seed=1 '
                         '--stop_accuracy=0.99'}
  out = subprocess.run(['bash', 'launch/pointer_chasing_h10.sh', f'--root={tmp_path}/runs',
                        f'--docs={tmp_path}/docs', f'--extra={tiny}'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'WARNING: --steps=500 does not fit' in out.stdout
  [row] = json.loads((tmp_path / 'docs' / 'pointer_chasing.json').read_text())
  assert 1 <= row['steps'] < 500 and row['seed'] == 1  # --first_seed=1: seed 1 only
  assert row['command'] == (
      f"python -m ctr_jax.main --config=configs/pointer_chasing.py:hops=2,model=t1,"
      f"steps={row['steps']},seed=1,stop_accuracy=0.99 --workdir={tmp_path}/runs/h2_t1_s1 {tiny}")
  assert [i['resumed_from_step'] for i in row['invocations']] == [None]


def test_tables_encoding_through_the_config_and_the_task():
  from ctr_jax.tasks import pointer_chasing as pointer_task  # pylint: disable=g-import-not-at-top
  config = small('hops=2,model=t1,encoding=tables')
  assert config.data.encoding == 'tables' and config.data.seq_len == 52
  assert config.model.max_len == 52
  pointer_task.validate_config(config)
  task = pointer_task.PointerChasing(config, process_index=0, process_count=1)
  assert next(task.train_iter)['tokens'].shape == (8, 52)
  config.data.seq_len = 86
  with pytest.raises(ValueError, match='seq_len'):
    pointer_task.validate_config(config)
  with pytest.raises(ValueError, match='encoding'):
    pc_config.get_config('encoding=notes')
  # Configs saved before the field existed read as 'sections'.
  old = small('hops=2,model=t1')
  del old.data['encoding']
  pointer_task.validate_config(old)


def test_key_curriculum_through_the_config_and_the_task():
  from ctr_jax import config_lib  # pylint: disable=g-import-not-at-top
  from ctr_jax.tasks import pointer_chasing as pointer_task  # pylint: disable=g-import-not-at-top
  config = small('hops=2,model=t1,encoding=tables,key_curriculum=2:3/4:6')
  config_lib.validate(config)
  task = pointer_task.PointerChasing(config, process_index=0, process_count=1)
  keys_per_step = [int((next(task.train_iter)['tokens'][:, 2:24:3] != 0).sum(1).max())
                   for _ in range(8)]
  assert keys_per_step == [2, 2, 2, 4, 4, 4, 8, 8]
  with pytest.raises(ValueError, match='key_curriculum'):
    pc_config.get_config('key_curriculum=4:100/2:200')
  config.data.key_curriculum = '9:10'
  with pytest.raises(ValueError, match='config.data.key_curriculum'):
    config_lib.validate(config)


def test_hop_curriculum_through_the_config_and_the_task():
  from ctr_jax import config_lib  # pylint: disable=g-import-not-at-top
  from ctr_jax.tasks import pointer_chasing as pointer_task  # pylint: disable=g-import-not-at-top
  config = small('hops=3,model=t1,encoding=tables,hop_curriculum=1:2/2:4')
  config_lib.validate(config)
  task = pointer_task.PointerChasing(config, process_index=0, process_count=1)
  tables = [25 * level + 2 for level in range(3)]  # the first key of each level's table
  levels_per_step = [int(sum((batch['tokens'][:, t] != 0).all() for t in tables))
                     for batch in (next(task.train_iter) for _ in range(6))]
  assert levels_per_step == [1, 1, 2, 2, 3, 3]
  with pytest.raises(ValueError, match='hop_curriculum'):
    pc_config.get_config('hops=3,hop_curriculum=3:100')
  config.data.hop_curriculum = '2:10/1:20'
  with pytest.raises(ValueError, match='config.data.hop_curriculum'):
    config_lib.validate(config)


def test_training_switches_reach_the_model_and_the_task():
  from ctr_jax import config_lib  # pylint: disable=g-import-not-at-top
  from ctr_jax.tasks import pointer_chasing as pointer_task  # pylint: disable=g-import-not-at-top
  config = small('hops=2,model=t1,encoding=multi_q,loss_over=all,positions=none')
  assert config.data.seq_len == pc_config.pointer_chasing.seq_len(2, 'multi_q') == 103
  config_lib.validate(config)
  task = pointer_task.PointerChasing(config, process_index=0, process_count=1)
  assert task.loss_over == 'all' and config.model.positions == 'none'
  for arg, field in (('loss_over=mean', 'loss_over'), ('positions=alibi', 'positions')):
    with pytest.raises(ValueError, match=field):
      config_lib.validate(small(f'hops=2,model=t1,{arg}'))


@pytest.mark.slow
def test_checks_script_trains_reports_profiles_and_keeps_the_doc(tmp_path):
  """ctr_jax.projects.pointer_chasing.checks on tiny settings: one check trained through the ledger,
  its row, its plateau profile and its command in the json, the doc's other text kept."""
  import subprocess  # pylint: disable=g-import-not-at-top
  docs = tmp_path / 'docs'
  docs.mkdir()
  (docs / 'pointer_chasing_checks.md').write_text('# Pointer chasing\n\nHand-written.\n')
  tiny = ('--config.batch_size=4 --config.model.width=32 --config.eval_batches=1 '
          '--config.pointer_eval_examples=16 --config.log_every=2 --config.checkpoint_every=2')
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
         'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT}
  for _ in range(2):  # the second call trains nothing and writes the same section
    out = subprocess.run([sys.executable, '-m', 'ctr_jax.projects.pointer_chasing.checks', '--steps=4',
                          '--only=no_rope', f'--root={tmp_path}/runs', f'--docs={docs}',
                          f'--extra={tiny}'], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
  [row] = json.loads((docs / 'pointer_chasing_checks.json').read_text())['runs']
  assert row['name'] == 'no_rope' and row['against'] == 'baseline' and row['steps'] == 4
  assert row['command'] == (
      'python -m ctr_jax.main --config=configs/pointer_chasing.py:hops=2,model=t2,'
      f'encoding=tables,positions=none,steps=4 --config.eval_every=250 '
      f'--workdir={tmp_path}/runs/h2_no_rope {tiny}')
  assert len(row['invocations']) == 1
  assert '| table keys | L1 |' in row['profile'] and '| final query |' in row['profile']
  text = (docs / 'pointer_chasing_checks.md').read_text()
  assert text.startswith('# Pointer chasing\n\nHand-written.\n')
  assert text.count('## One difference at a time') == 1 and 'Not run yet: baseline' in text


def test_torch_cross_check_script_trains_and_records_its_command(tmp_path):
  """ctr_jax.projects.pointer_chasing.torch_check (the independent PyTorch trainer) on tiny settings;
  skipped where torch (the `bench` extra) is not installed."""
  pytest.importorskip('torch')
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location('torch_check',
                                                'ctr_jax.projects.pointer_chasing.torch_check')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  out = tmp_path / 'check.json'
  module.main(['--hops=2', '--layers=1', '--steps=2', '--width=16', '--heads=2',
               '--eval_every=1', '--eval_examples=8', f'--out={out}'])
  import json  # pylint: disable=g-import-not-at-top
  record = json.loads(out.read_text())
  assert [r['step'] for r in record['curve']] == [1, 2]
  assert set(record['final']) == {'L0', 'L1', 'final'}
  assert all(0 <= v <= 1 for v in record['final'].values())
  assert 'pointer_chasing_torch_check.py' in record['command']


def test_stop_accuracy_ends_training_at_the_first_solved_evaluation(tmp_path, monkeypatch):
  from ctr_jax.tasks import pointer_chasing as task_lib  # pylint: disable=g-import-not-at-top
  evaluation = {'level_accuracy': {'L0': 1.0, 'L1': 0.99}, 'final_query_accuracy': 0.99}
  assert task_lib.solved_everything(evaluation, 0.99)
  assert not task_lib.solved_everything(evaluation, 0.995)
  assert not task_lib.solved_everything({**evaluation, 'final_query_accuracy': 0.5}, 0.99)
  assert not task_lib.solved_everything(evaluation, 0.0)  # 0: never stop
  with pytest.raises(ValueError, match='config.data.stop_accuracy'):
    trainer.train_and_evaluate(small('hops=1,model=t1,stop_accuracy=1.5'), str(tmp_path / 'bad'))
  assert not (tmp_path / 'bad').exists()

  seen = []

  def stop_at_step_4(self, ev):  # what a model that solves the task at step 4 would report
    seen.append((self.stop_accuracy, ev['eval_examples']))
    return len(seen) == 2
  monkeypatch.setattr(task_lib.PointerChasing, 'stop_early', stop_at_step_4)
  summary = trainer.train_and_evaluate(
      small('hops=1,model=t1,steps=10,stop_accuracy=0.99', total_steps=10), str(tmp_path / 'run'))
  written = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  assert seen == [(0.99, 8), (0.99, 8)]  # periodic evaluations at steps 2 and 4
  assert written['step'] == summary['step'] == 4 and written['stopped_early_at_step'] == 4
  assert written['eval_examples'] == 16  # the final evaluation still ran
  assert checkpointing.read_meta(str(tmp_path / 'run'))['step'] == 4


def test_continue_from_copies_a_finished_run_and_extends_it_exactly(tmp_path):
  """--continue_from: a copy of a finished 2-step run, resumed to 4 steps, trains the same losses
  as one 4-step run (constant learning rate), and the copy is a line of its ledger."""
  from absl import app  # pylint: disable=g-import-not-at-top

  from ctr_jax.projects.pointer_chasing import sweep  # pylint: disable=g-import-not-at-top
  short_root, long_root = str(tmp_path / 'short'), str(tmp_path / 'long')
  source = sweep.workdir_for('d1_bptt', 1, short_root)
  trainer.train_and_evaluate(small('hops=1,model=d1_bptt', log_every=1, total_steps=2), source)
  with open(os.path.join(source, 'invocations.jsonl'), 'w') as f:
    f.write(json.dumps({'command': 'first launch', 'resumed_from_step': None}) + '\n')
  open(os.path.join(source, '.ctr_jax.lock'), 'w').close()
  target = sweep.workdir_for('d1_bptt', 1, long_root)
  sweep.copy_run(source, target)
  assert sorted(os.listdir(long_root)) == [os.path.basename(target)]  # no partial copy left
  assert not os.path.exists(os.path.join(target, '.ctr_jax.lock'))
  first, copied = [json.loads(l) for l in open(os.path.join(target, 'invocations.jsonl'))]
  assert first['command'] == 'first launch' and copied['copied_at_step'] == 2
  assert copied['command'].startswith('cp -r ') and copied['command'].endswith(target)
  trainer.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1), target)
  straight = str(tmp_path / 'straight')
  trainer.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1), straight)

  def losses(path):
    with open(os.path.join(path, 'metrics.jsonl')) as f:
      return [r['train_loss'] for r in map(json.loads, f) if 'train_loss' in r]
  assert losses(target) == losses(straight) and len(losses(straight)) == 4
  assert len(losses(source)) == 2  # the source is untouched
  with pytest.raises(app.UsageError, match='--continue_from'):
    sweep.copy_run(str(tmp_path / 'nothing'), str(tmp_path / 'elsewhere'))
  with pytest.raises(app.UsageError, match='is --root itself'):
    sweep.check_continue_from(short_root + '/', short_root)
  sweep.check_continue_from(short_root, long_root)
  sweep.check_continue_from('', long_root)
  assert not os.path.exists(tmp_path / 'elsewhere')
