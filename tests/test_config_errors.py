"""Config mistakes end as one line naming the field (issue 17, items 11 and 15).

The CLI cases run the real `python -m ctr_jax.main` in a subprocess; they fail at flag parsing
(or before the first write of a resume), so they take a few seconds each.
"""

import glob
import importlib.util
import os

import pytest

from ctr_jax import config_lib, trainer
from helpers import override, run_main, tiny_train_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _snapshot(path):
  out = {}
  for base, _, files in os.walk(path):
    for name in files:
      with open(os.path.join(base, name), 'rb') as f:
        out[os.path.relpath(os.path.join(base, name), path)] = hash(f.read())
  return out


def _one_error_line(result):
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith('ctr_jax: error: ') and '\\n' not in lines[0], lines[0]
  return lines[0]


CLI_CASES = {
    # override -> (what the line must say, what it must not say)
    'top_level': ('--config.foo=1', "unknown config field 'foo'; the fields at the top are"),
    'misspelt_leaf': ('--config.model.widht=3',
                      "unknown config field 'model.widht'; did you mean 'model.width'?"),
    'misspelt_section': ('--config.modle.width=3',
                         "unknown config field 'modle.width'; did you mean 'model.width'?"),
}


@pytest.mark.parametrize('case', sorted(CLI_CASES))
def test_unknown_field_is_one_line_with_the_nearest_names(case, tmp_path):
  override, message = CLI_CASES[case]
  workdir = tmp_path / 'work'
  # :runlocal is accepted by the quickstart too (item 15); the override fails afterwards.
  result = run_main(['--config=configs/quickstart.py:runlocal', f'--workdir={workdir}',
                      override])
  assert result.returncode == 2, result.stderr[-3000:]
  line = _one_error_line(result)
  assert line == f'ctr_jax: error: {message}' or line.startswith(f'ctr_jax: error: {message}')
  assert not workdir.exists()


def test_unknown_field_message_without_argv():
  config = tiny_train_config('/unused')
  assert config_lib.unknown_field_error('optim.grad_clp', config) == (
      "unknown config field 'optim.grad_clp'; did you mean 'optim.grad_clip'?")
  assert config_lib.unknown_field_error('grad_clip', config) == (
      "unknown config field 'grad_clip'; did you mean 'optim.grad_clip'?")
  assert 'is a value, not a section' in config_lib.unknown_field_error('model.width.x', config)
  # ml_collections' own KeyError, as a library caller would meet it.
  with pytest.raises(AttributeError) as info:
    config.model.widht  # pylint: disable=pointless-statement
  assert config_lib._one_line(info.value) == (  # pylint: disable=protected-access
      "unknown config field 'widht'; did you mean 'width'?")


TINY = {'model.width': 32, 'model.depth': 1, 'model.num_heads': 2, 'model.vocab_size': 320,
        'data.seq_len': 16, 'batch_size': 4, 'total_steps': 2, 'checkpoint_every': 2,
        'eval_every': 100, 'eval_batches': 1, 'sample.num_tokens': 0}


def _quickstart(**overrides):
  from configs import quickstart  # pylint: disable=g-import-not-at-top
  return override(quickstart.get_config(), **overrides)


@pytest.mark.slow
def test_grad_clip_change_on_resume_names_the_field(tmp_path):
  # A checkpoint trained with clipping, resumed without: optax's state tree loses a node.
  import jax  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / 'data')
  tiny = {**TINY, 'data.data_dir': data_dir}
  workdir = tmp_path / 'run'
  config = _quickstart(**tiny)
  trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:1])
  before = _snapshot(workdir)

  changed = _quickstart(**tiny, **{'optim.grad_clip': 0.0})
  with pytest.raises(ValueError, match=r'config\.optim\.grad_clip=0\.0 \(the checkpoint has 1\.0'):
    trainer.prepare_workdir(changed, str(workdir))
  # Another positive value keeps the state's tree: resumable.
  changed.optim.grad_clip = 0.5
  trainer.prepare_workdir(changed, str(workdir))
  assert config_lib.state_structure_changes({'optim': config.optim.to_dict()}, changed) == []

  flags = [f'--config.{k}={v}' for k, v in tiny.items()]
  result = run_main(['--config=configs/quickstart.py', f'--workdir={workdir}', *flags,
                      '--config.optim.grad_clip=0'])
  assert result.returncode == 2, result.stderr[-3000:]
  line = _one_error_line(result)
  assert 'config.optim.grad_clip=0.0 (the checkpoint has 1.0)' in line, line
  assert '--config.optim.grad_clip=1.0' in line and 'new --workdir' in line, line
  assert 'partial_restore' not in line
  assert _snapshot(workdir) == before


def _config_files():
  return sorted(p for p in glob.glob(os.path.join(ROOT, 'configs', '**', '*.py'), recursive=True)
                if 'def get_config(' in open(p).read())


@pytest.mark.parametrize('path', _config_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_config_accepts_runlocal(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config('runlocal')
  if 'job' in config:  # a trainer config
    config_lib.validate(config)
    assert config.total_steps <= 500
  elif 'sections' in config:  # a bench config
    from ctr_jax.bench import validation
    validation.validate(config)
  else:  # an experiment script's config
    assert config == module.get_config()


# Checked at start, not when the value is first used (issue 41 item 8; docs/reliability.md row 22):
# each used to fail after training (top_k, num_tokens: a 160 GB allocation), at the first
# evaluation (pointer chasing's eval_batches=0, deleting the workdir), with a sharding error
# naming no field (the batch over 3 devices) or as a NaN loss / reshape traceback (the model).
START_CASES = {
    # case -> (config file, overrides, extra environment, what the line must say)
    'top_k': ('quickstart.py:runlocal', ['--config.sample.top_k=5000'], None,
              'config.sample.top_k: must be an integer in [0, model.vocab_size=4096] (0 = no '
              'cut), got 5000'),
    'num_tokens': ('quickstart.py:runlocal', ['--config.sample.num_tokens=1000000000'], None,
                   'config.sample.num_tokens: must be an integer in [0, model.max_len - 1 = 255]'),
    'temperature_nan': ('quickstart.py:runlocal', ['--config.sample.temperature=nan'], None,
                        'config.sample.temperature: must be a finite number >= 0 (0 = greedy), '
                        'got nan'),
    'head_dim': ('quickstart.py:runlocal', ['--config.model.head_dim=-2'], None,
                 'model.head_dim: must be an integer >= 0 (0 = derived from width), got -2'),
    'mlp_dim': ('quickstart.py:runlocal', ['--config.model.mlp_dim=-1'], None,
                'model.mlp_dim: must be an integer >= 0 (0 = derived from width), got -1'),
    'layer_norm_eps_negative': ('quickstart.py:runlocal', ['--config.model.layer_norm_eps=-1'],
                                None, 'model.layer_norm_eps: must be a finite number >= 0, got '
                                '-1.0'),
    'layer_norm_eps_nan': ('quickstart.py:runlocal', ['--config.model.layer_norm_eps=nan'], None,
                           'model.layer_norm_eps: must be a finite number >= 0, got nan'),
    'eval_batches_negative': ('quickstart.py:runlocal', ['--config.eval_batches=-1'], None,
                              'config.eval_batches: must be an integer >= 0'),
    'pointer_eval_batches': ('pointer_chasing.py:runlocal', ['--config.eval_batches=0'], None,
                             'config.eval_batches: must be >= 1 for pointer chasing'),
    'batch_over_devices': ('quickstart.py:runlocal', [],
                           {'XLA_FLAGS': '--xla_force_host_platform_device_count=3'},
                           'config.batch_size: 16 is not divisible by the 3 devices each batch is '
                           'split over (mesh data=3 x fsdp=1, of 3 devices); use a multiple of 3'),
}


@pytest.mark.parametrize('case', sorted(START_CASES))
def test_late_checks_fail_at_start_naming_the_field(case, tmp_path):
  config, overrides, env, message = START_CASES[case]
  workdir = tmp_path / 'work'
  result = run_main([f'--config=configs/{config}', f'--workdir={workdir}',
                     f'--config.data.data_dir={tmp_path / "data"}', *overrides], env_extra=env)
  assert result.returncode == 2, result.stderr[-3000:]
  line = _one_error_line(result)
  assert line.startswith(f'ctr_jax: error: {message}'), line
  assert not workdir.exists() and not (tmp_path / 'data').exists()


def test_a_batch_that_splits_over_the_devices_passes_the_start_check():
  # 3 devices: the quickstart's batch 16 does not split, 15 does (the check is not too strict).
  config = _quickstart(**{'batch_size': 15})
  config_lib.validate(config, devices=[object()] * 3)
  config.mesh.fsdp = 3  # 15 over data=1 x fsdp=3
  config_lib.validate(config, devices=[object()] * 3)
  config.batch_size = 16
  with pytest.raises(ValueError, match=r'^config.batch_size: 16 is not divisible by the 3 '
                                       r'devices each batch is split over \(mesh data=1 x '
                                       r'fsdp=3'):
    config_lib.validate(config, devices=[object()] * 3)
  config.job = 'generate'  # no batches
  config_lib.validate(config, devices=[object()] * 3)


def test_a_sample_prompt_longer_than_max_len_allows_is_named_before_training(data_dir, tmp_path):
  # The config check allows num_tokens <= max_len - 1; the prompt's tokens are known only once the
  # tokenizer is there, when the task is made (before the first step).
  workdir = tmp_path / 'work'
  flags = [f'--config.{k}={v}' for k, v in {**TINY, 'data.data_dir': data_dir,
                                            'model.max_len': 16, 'sample.num_tokens': 15}.items()]
  result = run_main(['--config=configs/quickstart.py', f'--workdir={workdir}', *flags])
  assert result.returncode == 2, result.stderr[-3000:]
  line = _one_error_line(result)
  assert 'config.sample.prompt: ' in line and 'config.sample.num_tokens=15 make' in line, line
  assert 'more than config.model.max_len=16' in line, line
  assert not workdir.exists()
