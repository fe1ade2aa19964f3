"""The generation experiment's machinery on a tiny untrained model (the real run is a script)."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.experiments import implicit_generation as generation
from helpers import family_lm


def test_metrics_of_identical_and_different_logits():
  a = jnp.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
  same = generation.step_metrics(a, a)
  assert same['agree'].all() and same['max_abs_logit'].max() == 0 and same['tvd'].max() == 0
  b = a.at[0, 0].set(5.0)
  moved = generation.step_metrics(a, b)
  assert moved['agree'].tolist() == [False, True] and moved['max_abs_logit'][0] == 5.0
  assert 0 < moved['tvd'][0] <= 1 and moved['tvd'][1] == 0


def test_teacher_forced_generation_report(tmp_path):
  model, variables, _ = family_lm('gemma', depth=2)
  prompts = [[1, 2, 3, 4], [5, 6]]
  tokens, lengths = generation.greedy_history(model, variables, prompts, 3)
  assert tokens.shape == (2, 7) and lengths.tolist() == [4, 2]
  # Each generated token is the argmax of the model with the whole history.
  full = np.asarray(jax.jit(model.apply)(variables, jnp.asarray(tokens)))
  assert tokens[0, 4] == full[0, 3].argmax() and tokens[1, 3] == full[1, 2].argmax()

  assert len(generation.settings_for('llama', 4, ['float32'], ['direct', 'stable'],
                                     ['materialise', 'action'])) == 6  # no 'stable' for llama
  settings = generation.settings_for('gemma', 2, ['float32'], ['stable'], ['materialise'])
  assert [(s.method, s.first_layer) for s in settings] == [('stable', 0), ('stable', 1)]
  results = generation.evaluate(model, variables, tokens, lengths, 3, settings, chunk=4)
  family = {'block': 'gemma', 'depth': 2, 'runs': []}
  for setting, metrics in results.items():
    assert metrics['agree'].shape == (2, 3) and metrics['agree'].all()
    assert metrics['max_abs_logit'].max() <= 1e-4
    family['runs'].append({'setting': vars(setting), 'summary': generation.summarise(metrics),
                           'per_step': {k: v.tolist() for k, v in metrics.items()}})
  generation.write_report({'machine': generation.machine(), 'families': {'gemma': family}},
                          str(tmp_path), str(tmp_path / 'figures'))
  assert json.loads((tmp_path / 'results.json').read_text())['families']['gemma']['runs']
  assert (tmp_path / 'table.md').read_text().count('| gemma |') == 2
  assert (tmp_path / 'figures' / 'implicit_generation_summary.png').exists()
