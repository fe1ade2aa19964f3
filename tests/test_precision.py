"""`config.precision`: which compute dtype each platform gets, what wins over it, bad values, and
(slow) that bfloat16 training lands within a stated margin of float32."""

import json
import os

import jax
import numpy as np
import pytest

from ctr_jax import config_lib, trainer
from ctr_jax.projects.perf import precision_quickstart
from ctr_jax.training import checkpointing
from helpers import run_main, tiny_train_config


@pytest.mark.parametrize('precision,platform,expected', [
    ('auto', 'cpu', 'float32'),   # every CPU number stays as it was
    ('auto', 'gpu', 'bfloat16'),
    ('auto', 'tpu', 'bfloat16'),
    ('float32', 'gpu', 'float32'),
    ('float32', 'cpu', 'float32'),
    ('bfloat16', 'cpu', 'bfloat16'),
    ('bfloat16', 'tpu', 'bfloat16'),
])
def test_precision_sets_the_compute_dtype_per_platform(precision, platform, expected):
  config = tiny_train_config('/unused', precision=precision)
  assert config_lib.resolve_precision(config, platform) == expected
  model = config_lib.model_config_for(config, platform)
  assert model.dtype == expected and model.param_dtype == 'float32'
  assert config.model.dtype == 'float32'  # the config (what checkpoints record) is left alone
  assert {k: v for k, v in model.items() if k != 'dtype'} == {
      k: v for k, v in config.model.items() if k != 'dtype'}


@pytest.mark.parametrize('dtype', ['bfloat16', 'float64', 'float16'])
@pytest.mark.parametrize('precision', ['auto', 'float32', 'bfloat16'])
def test_a_model_dtype_set_in_the_config_wins_over_precision(dtype, precision):
  config = tiny_train_config('/unused', precision=precision, **{'model.dtype': dtype})
  for platform in ('cpu', 'gpu', 'tpu'):
    assert config_lib.resolve_precision(config, platform) == dtype


def test_the_default_is_auto_and_a_bad_value_is_one_line_naming_the_field(tmp_path):
  assert config_lib.get_base().precision == 'auto'
  config = tiny_train_config('/unused', precision='fp16')
  with pytest.raises(ValueError, match=r"config\.precision: got 'fp16', allowed \['auto', "
                                       r"'float32', 'bfloat16'\]"):
    config_lib.validate(config)
  workdir = tmp_path / 'work'
  result = run_main(['--config=configs/quickstart.py', f'--workdir={workdir}',
                     '--config.precision=fp16'])
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert lines == ["ctr_jax: error: config.precision: got 'fp16', allowed "
                   "['auto', 'float32', 'bfloat16']"], result.stderr[-3000:]
  assert not workdir.exists() or not any(workdir.iterdir())


def test_the_quickstart_comparison_copies_each_summary_with_its_command(tmp_path, capsys):
  for precision, loss in [('float32', 4.0), ('bfloat16', 4.1)]:
    (tmp_path / precision).mkdir()
    (tmp_path / precision / 'summary.json').write_text(json.dumps(
        {'step': 600, 'val_loss': loss, 'val_ppl': float(np.exp(loss)), 'sample': 'And God'}))
  out = tmp_path / 'out.json'
  precision_quickstart.main(['--reuse', f'--workdir_root={tmp_path}', f'--out={out}'])
  written = json.loads(out.read_text())
  assert written['runs']['float32'] == {
      'command': f'python -m ctr_jax.main --config=configs/quickstart.py '
                 f'--workdir={tmp_path}/float32 --config.precision=float32',
      'step': 600, 'val_loss': 4.0, 'val_ppl': float(np.exp(4.0))}
  assert written['runs']['bfloat16']['val_loss'] == 4.1
  assert written['val_loss_relative_difference'] == pytest.approx(0.1 / 4.0)
  assert written['machine']['platform'] == 'cpu'
  assert 'written to' in capsys.readouterr().out


# A few dozen steps of the tiny model. The margin, 0.5% of float32's final validation loss:
# bfloat16 keeps 8 significant bits (a relative rounding of up to 2^-9, 0.2%, per value), the
# loss itself is computed in float32 and averaged over every validation token, so what is left is
# how far the roundings move the 60-step trajectory; bfloat16 must also move the loss less than a
# new seed does (measured in the same test), or it would cost more than the seed's noise.
BF16_STEPS = 60
BF16_MARGIN = 0.005


@pytest.mark.slow
def test_bfloat16_training_lands_within_the_margin_of_float32(data_dir, tmp_path, capsys):
  def run(name, **overrides):
    fields = dict(total_steps=BF16_STEPS, eval_every=BF16_STEPS, checkpoint_every=BF16_STEPS,
                  log_every=BF16_STEPS // 3, eval_batches=8)
    config = tiny_train_config(data_dir, **{**fields, **overrides})
    return trainer.train_and_evaluate(config, str(tmp_path / name), devices=jax.devices()[:1])

  f32 = run('f32', precision='float32')
  capsys.readouterr()
  bf16 = run('bf16', precision='bfloat16')
  second = capsys.readouterr().out.splitlines()[1]
  assert 'precision bfloat16: bfloat16 compute, float32 parameters' in second, second
  other_seed = run('seed', precision='float32', seed=1)
  _, params = checkpointing.load_params(str(tmp_path / 'bf16'))
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype('float32')}
  a, b, c = f32['val_loss'], bf16['val_loss'], other_seed['val_loss']
  with capsys.disabled():  # shown with -s
    print(f'\nval_loss after {BF16_STEPS} steps: float32 {a:.4f}, bfloat16 {b:.4f}, '
          f'float32 seed 1 {c:.4f}')
  assert a != b  # bfloat16 did run: the numbers differ
  assert abs(b - a) <= BF16_MARGIN * a, (a, b)
  assert abs(b - a) < abs(c - a), (a, b, c)
  with open(os.path.join(tmp_path, 'bf16', 'summary.json')) as f:
    assert json.load(f)['val_loss'] == b
  # The precision is not part of the model: a float32 run resumes in bfloat16 (CPU to GPU).
  resumed = run('f32', precision='bfloat16', total_steps=BF16_STEPS + 2)
  assert resumed['step'] == BF16_STEPS + 2
  assert 'resumed from the checkpoint at step' in capsys.readouterr().out
