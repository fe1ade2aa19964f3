"""What N layers can represent in each pointer encoding: hand-set weights of our real models,
scored by the task's own evaluation on fresh examples (docs/pointer_chasing.md,
"Representability"). The constructions are in tests/pointer_constructions.py.
"""


import pytest

from ctr_jax.tasks import pointer_chasing as pointer_task  # pylint: disable=g-import-not-at-top,wrong-import-position
import pointer_constructions as constructions  # pylint: disable=g-import-not-at-top,wrong-import-position

EXAMPLES = 64  # one batch: every level still has 8 x 64 scored keys (the final query 64)


def transformer_levels(hops, depth, encoding):
  model, params = constructions.transformer(hops, depth, encoding)
  predict = pointer_task.model_predictor(model, params, mode='parallel')
  return pointer_task.evaluate(predict, hops, num_examples=EXAMPLES, batch_size=64,
                               encoding=encoding)


def solved(accuracies):
  """The levels answered exactly; the others must be near chance (1/16), not almost solved."""
  for level, value in accuracies.items():
    assert value == 1.0 or value < 0.2, (level, value)
  return [level for level, value in accuracies.items() if value == 1.0]


@pytest.mark.parametrize('depth,levels', [(2, ['L0', 'L1']), (3, ['L0', 'L1', 'L2', 'L3'])])
def test_transformer_staircase_in_the_tables_encoding(depth, levels):
  """The author's notes encoding, 3 hops: N = 2 solves L0-L1, N = 3 all four (as he reports)."""
  assert solved(transformer_levels(3, depth, 'tables')['level_accuracy']) == levels


def test_two_layers_answer_only_level_zero_queries_in_the_sections_encoding():
  """Our default encoding: the same two layers answer the level-1 table keys, not the queries."""
  metrics = transformer_levels(3, 2, 'sections')
  assert solved(metrics['level_accuracy']) == ['L0']
  assert solved(metrics['table_level_accuracy']) == ['L0', 'L1']


def test_three_layers_solve_every_level_of_the_sections_encoding_at_three_hops():
  """A 3-layer transformer can answer all of H = 3 in our encoding; t3 trained 5,000 steps did
  not (docs/pointer_chasing.md): an optimisation failure, not a missing layer."""
  metrics = transformer_levels(3, 3, 'sections')
  assert solved(metrics['level_accuracy']) == ['L0', 'L1', 'L2']
  assert metrics['final_query_accuracy'] == 1.0


@pytest.mark.slow
def test_one_more_layer_one_more_level_in_the_sections_encoding():
  """H = 5, N = 4: levels L0-L3 (a level-L query needs L + 1 layers from L = 2 on), not L4."""
  metrics = transformer_levels(5, 4, 'sections')
  assert solved(metrics['level_accuracy']) == ['L0', 'L1', 'L2', 'L3']
  assert metrics['final_query_accuracy'] < 0.2


@pytest.mark.parametrize('hops,encoding', [(3, 'sections'), (3, 'tables'),
                                            pytest.param(5, 'sections', marks=pytest.mark.slow)])
def test_one_layer_context_ready_model_solves_every_level_through_its_correction(hops, encoding):
  """D = 1, evaluated by the exact sequential scan (what BPTT trains): every level, the final
  query included. The same weights without the correction's carry (one parallel pass, c = 0)
  answer nothing: the recurrence, not the one layer, does the chasing."""
  model, params = constructions.context_ready(hops, encoding)
  metrics = pointer_task.evaluate(pointer_task.model_predictor(model, params), hops,
                                  num_examples=EXAMPLES, batch_size=64, encoding=encoding)
  assert solved(metrics['level_accuracy']) == list(metrics['level_accuracy'])
  assert metrics['final_query_accuracy'] == metrics['table_key_accuracy'] == 1.0
  no_carry = pointer_task.evaluate(
      pointer_task.model_predictor(model, params, mode='parallel', k_unroll=1), hops,
      num_examples=EXAMPLES, batch_size=64, encoding=encoding)
  assert solved(no_carry['level_accuracy']) == []


def test_layer_readouts_find_each_answer_where_the_construction_writes_it():
  """ctr_jax.projects.pointer_chasing.layers on the hand-set 3-layer transformer (`tables`, 3 hops):
  a level-k table key's answer is linearly readable from block k + 1 on, and not before."""
  from ctr_jax.projects.pointer_chasing import layers as layers_script  # pylint: disable=g-import-not-at-top
  model, params = constructions.transformer(3, 3, 'tables')
  rows = layers_script.layer_readouts(model, params, 3, 'tables', examples=64, fit_examples=192)
  probe = {(r['level'], r['slot']): r['probe'] for r in rows}
  assert set(probe) == {(0, "'='"), (0, 'key')} | {(k, s) for k in (1, 2)
                                                    for s in layers_script.SLOTS}
  for level in range(3):
    readable = probe[(level, 'key')]
    assert len(readable) == 4 and readable[level + 1] == 1.0, (level, readable)
    assert max(readable[:level + 1]) < 0.5, (level, readable)
