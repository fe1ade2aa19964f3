"""Rematerialisation by name (`config.train.remat`): the same gradients with every choice, and the
booleans of older configs and checkpoints still read.

That remat lowers memory is `tests/test_compile_job.py`'s check (XLA's temp_bytes).
"""

import json

import jax
import pytest

from ctr_jax import config_lib, models, trainer
from ctr_jax.ops import recurrence
from ctr_jax.tasks import losses
from ctr_jax.training import compat, train_step
from helpers import max_abs_diff, random_tokens, run_main, tiny_train_config


def _grads(model, params, batch, remat):
  recipe = train_step.Recipe(remat=remat)
  loss = lambda p: train_step.objective_loss(model, p, batch, losses.NextToken(), recipe,
                                             k_unroll=3)[0]
  return jax.jit(jax.grad(loss))(params)


@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_every_remat_gives_the_gradients_of_none(kind):
  cfg = models.model_config(kind=kind, vocab_size=37, width=32, depth=2, num_heads=4,
                            max_len=32, k_unroll=3)
  model = models.build(cfg)
  batch = random_tokens(3, cfg.vocab_size, batch=2, length=10)
  params = model.init(jax.random.key(0), batch[:, :-1])['params']
  reference = _grads(model, params, batch, 'none')
  for remat in recurrence.REMAT[1:]:
    got = _grads(model, params, batch, remat)
    # The same function: recomputation only changes which fusions XLA builds, so the float32
    # sums may round differently in the last bits (measured: 1.5e-8 at most).
    worst = max(max_abs_diff(a, b) for a, b in zip(jax.tree.leaves(reference),
                                                  jax.tree.leaves(got)))
    assert worst <= 1e-6, (remat, worst)


def test_each_name_rematerialises_where_it_says():
  cfg = models.model_config(kind='context_ready', vocab_size=37, width=32, depth=2, num_heads=4,
                            max_len=32, k_unroll=3)
  model = models.build(cfg)
  batch = random_tokens(4, cfg.vocab_size, batch=2, length=6)
  params = model.init(jax.random.key(0), batch[:, :-1])['params']

  def checkpoints(remat):
    loss = lambda p: train_step.objective_loss(model, p, batch, losses.NextToken(),
                                               train_step.Recipe(remat=remat), k_unroll=3)[0]
    text = str(jax.make_jaxpr(jax.grad(loss))(params))
    return text.count('policy=None'), text.count('policy=DotsSaveable(only_if_no_batch_dims=True)')

  assert checkpoints('none') == (0, 0)
  assert checkpoints('iteration') == (1, 0)          # the scan body, once
  assert checkpoints('layer') == (cfg.depth, 0)      # each block
  assert checkpoints('matmuls') == (0, cfg.depth)    # each block, its weight products kept


def test_booleans_of_older_configs_and_checkpoints_still_read(data_dir, tmp_path, capsys):
  assert train_step.Recipe(remat=True).remat == 'iteration'
  assert train_step.Recipe(remat=False).remat == 'none'
  cfg = tiny_train_config(data_dir)
  for old in (True, False, 'layer'):
    cfg.train.remat = old  # a config file may still set a boolean
    config_lib.validate(cfg)
  # A checkpoint from before config.train kept `remat: true` in its model config.
  saved = {**json.loads(cfg.model.to_json()), 'remat': True}
  assert compat.split_moved_fields(saved)[1] == {'remat': 'iteration'}
  meta_dir = tmp_path / 'checkpoints' / '4' / 'meta'
  meta_dir.mkdir(parents=True)
  (meta_dir / 'metadata').write_text(json.dumps({'config': {'model': saved}, 'step': 4}))
  cfg.train.remat = 'iteration'
  trainer.prepare_workdir(cfg, str(tmp_path))
  assert 'note' not in capsys.readouterr().out  # True and 'iteration' are the same recipe
  cfg.train.remat = 'layer'
  trainer.prepare_workdir(cfg, str(tmp_path))
  assert "train.remat: 'iteration' -> 'layer'" in capsys.readouterr().out


def test_a_bad_remat_is_one_line_naming_the_field(tmp_path):
  cfg = tiny_train_config('/unused', **{'train.remat': 'layers'})
  with pytest.raises(ValueError, match=r"^config\.train\.remat: got 'layers', allowed \['none', "
                                       r"'iteration', 'layer', 'matmuls'\]"):
    config_lib.validate(cfg)
  cfg = tiny_train_config('/unused', **{'train.remat': 'layer', 'train.mode': 'bptt'})
  with pytest.raises(ValueError, match=r"config\.train\.remat: 'layer' rematerialises"):
    config_lib.validate(cfg)
  result = run_main(['--config=configs/quickstart.py:runlocal', f'--workdir={tmp_path / "w"}',
                     '--config.train.remat=every_layer'])
  assert result.returncode == 2, result.stderr[-3000:]
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert lines == ["ctr_jax: error: config.train.remat: got 'every_layer', allowed ['none', "
                   "'iteration', 'layer', 'matmuls'] (or True = 'iteration', False = 'none')"]
  assert not (tmp_path / 'w').exists()
