"""Pointer chasing through the trainer: BPTT and K-unroll runs, per-level summary, resume."""

import json
import os
import sys

import pytest

from ctr_jax import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
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
  summary = train.train_and_evaluate(small(f'hops=2,model={model},steps=4'), str(tmp_path))
  with open(tmp_path / 'summary.json') as f:
    written = json.load(f)
  assert set(written['level_accuracy']) == {'L0', 'L1'}
  for key in ('final_query_accuracy', 'table_key_accuracy', 'levels_solved', 'step'):
    assert key in written
  assert written['eval_examples'] == 16 and summary['step'] == 4


def test_pointer_chasing_resume_is_exact(tmp_path):
  full = tmp_path / 'full'
  train.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1), str(full))
  split = tmp_path / 'split'
  train.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1, exit_at_step=2),
                           str(split))
  train.train_and_evaluate(small('hops=1,model=d1_bptt,steps=4', log_every=1), str(split))

  def losses(path):
    with open(path / 'metrics.jsonl') as f:
      return [r['train_loss'] for r in map(json.loads, f) if 'train_loss' in r]
  assert losses(full) == losses(split)
