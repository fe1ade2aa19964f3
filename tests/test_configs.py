"""Every file in configs/ loads, validates, and its CPU variant builds a model."""

import glob
import importlib.util
import os

import jax
import jax.numpy as jnp
import pytest

from ctr_jax import config_lib, models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, 'configs', '*.py'))
                      if not os.path.basename(p).startswith(('_', 'common')))


def load(path):
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_paper_models_have_configs():
  names = {os.path.basename(p)[:-3] for p in CONFIG_FILES}
  for name in ('quickstart', 'd5_c1120', 'd1_c2048_k10', 'd3_c1408', 'd6_c1024', 'd11_c768',
               't2_c1888', 't4_c1344', 't6_c1088', 't12_c768', 'pointer_chasing'):
    assert name in names


@pytest.mark.parametrize('path', CONFIG_FILES, ids=lambda p: os.path.basename(p))
def test_config_loads_validates_and_documents_its_command(path):
  module = load(path)
  config = module.get_config()
  name = os.path.basename(path)
  if 'job' not in config:  # an experiment script's config, not the trainer's
    assert f'--config=configs/{name}' in (module.__doc__ or '')
    return
  assert 'python -m ctr_jax.main --config=configs/' in (module.__doc__ or '')
  config_lib.validate(config)
  shapes = jax.eval_shape(models.build(config.model).init, jax.random.key(0),
                          jnp.zeros((1, 4), jnp.int32))
  assert models.count_params(shapes) > 0


PAPER = [p for p in CONFIG_FILES if os.path.basename(p)[0] in 'dt']


@pytest.mark.parametrize('path', PAPER, ids=lambda p: os.path.basename(p))
def test_paper_recipe_and_runlocal_variant(path):
  module = load(path)
  config = module.get_config()
  assert config.data.name == 'openwebtext' and config.model.vocab_size == 32000
  assert config.optim.lr == 2e-4 and config.model.num_heads == 16
  if config.model.kind == 'context_ready':
    assert (config.model.k_unroll, config.train.k_min) in ((5, 2), (10, 0))
  local = module.get_config('runlocal')
  config_lib.validate(local)
  assert local.data.name == 'kjv_bible' and local.total_steps <= 500
  model = models.build(local.model)
  tokens = jnp.zeros((1, 8), jnp.int32)
  logits = jax.eval_shape(lambda t: model.apply(model.init(jax.random.key(0), t), t), tokens)
  assert logits.shape == (1, 8, 2048)


def test_paper_model_sizes_come_from_the_table():
  module = load(os.path.join(ROOT, 'configs', 'd5_c1120.py'))
  c = module.get_config().model
  assert (c.kind, c.depth, c.width, c.num_heads) == ('context_ready', 5, 1120, 16)


def test_config_args_are_checked():
  module = load(os.path.join(ROOT, 'configs', 'pointer_chasing.py'))
  assert module.get_config('hops=2,model=t3').model.depth == 3
  with pytest.raises(ValueError, match='model'):
    module.get_config('model=rnn')
  with pytest.raises(ValueError, match='unknown'):
    module.get_config('hop=2')


def test_paper_sweeps_name_real_configs_and_fields():
  from ctr_jax.projects import print_sweep  # pylint: disable=g-import-not-at-top
  sweeps = load(os.path.join(ROOT, 'configs', 'paper_sweeps.py')).SWEEPS
  for sweep in sweeps:
    commands = print_sweep.sweep_commands(os.path.join(ROOT, 'configs', 'paper_sweeps.py'),
                                          sweep, '/w')
    assert commands
    for command in commands:
      target = command.split('--config=configs/')[1].split()[0].split(':')[0]
      config = load(os.path.join(ROOT, 'configs', target)).get_config()
      for flag in command.split()[5:]:
        key, value = flag[len('--config.'):].split('=')
        node = config
        for part in key.split('.')[:-1]:
          node = node[part]
        node[key.split('.')[-1]] = type(node[key.split('.')[-1]])(value)
      config_lib.validate(config)


def test_width_sweep_follows_the_reference_token_budgets():
  # Reference section 6.4: 500M / 900M / 1,227M tokens at block 64 for C = 256 / 512 / 1024.
  paper_sweeps = load(os.path.join(ROOT, 'configs', 'paper_sweeps.py'))
  runs = []
  paper_sweeps.sweep_width(lambda config, arg=None, **o: runs.append(o))
  tokens = {o['model.width']: o['batch_size'] * o['total_steps'] * o['data.seq_len']
            for o in runs}
  assert tokens == {256: 1024 * 7629 * 64, 512: 512 * 27466 * 64, 1024: 1024 * 18750 * 64}
  assert abs(tokens[512] / 900e6 - 1) < 0.01 and abs(tokens[256] / 500e6 - 1) < 0.01
