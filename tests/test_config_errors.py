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
    from ctr_jax.bench import runner
    runner.validate(config)
  else:  # an experiment script's config
    assert config == module.get_config()
