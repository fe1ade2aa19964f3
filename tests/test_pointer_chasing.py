"""Pointer chasing: the generator against an independent reader, and the per-level evaluation."""

import grain
import numpy as np
import pytest

from ctr_jax.data import curricula
from ctr_jax.data import pointer_chasing as pc
from ctr_jax.tasks import pointer_chasing as pointer_task


def read_example(tokens, hops, entry_targets=False, equals_targets=False, num_keys=8):
  """Parses one example with plain dicts, knowing only the documented format.

  Returns (tables, expected) where tables[L] maps each level-L key token to the token it points
  at, and expected[t] is the resolved value token at every key position (None elsewhere); with
  entry_targets also at the target side of index-table entries, with equals_targets at every
  entry's '=' (the value its target side resolves to).
  """
  tokens = [int(t) for t in tokens]
  first_value = 4 + 8 * hops
  tables, expected, pos = [], [None] * len(tokens), 0

  def resolve(level, key):
    for lvl in range(level, -1, -1):
      key = tables[lvl][key]
    assert first_value <= key < first_value + 16
    return key

  for level in range(hops):
    level_keys = set(range(4 + 8 * level, 12 + 8 * level))
    table, key_positions = {}, {}
    for slot in range(8):
      target, eq, key = tokens[pos:pos + 3]
      if slot >= num_keys:  # the padding of a table with fewer keys
        assert target == eq == key == 0
      else:
        assert eq == 2 and key in level_keys and key not in table
        table[key], key_positions[key] = target, pos + 2
      pos += 3
    assert tokens[pos] == 3
    pos += 1
    tables.append(table)
    for key, key_pos in key_positions.items():
      expected[key_pos] = resolve(level, key)
      if entry_targets and level:
        expected[key_pos - 2] = resolve(level - 1, tokens[key_pos - 2])
      if equals_targets:
        pointed = tokens[key_pos - 2]
        expected[key_pos - 1] = resolve(level - 1, pointed) if level else pointed
    queried = []
    for slot in range(8):
      if slot >= num_keys:
        assert tokens[pos] == tokens[pos + 1] == 0
      else:
        assert tokens[pos] == 1 and tokens[pos + 1] in level_keys
        queried.append(tokens[pos + 1])
        expected[pos + 1] = resolve(level, tokens[pos + 1])
      pos += 2
    assert sorted(queried) == sorted(table)
    assert tokens[pos] == 3
    pos += 1
  assert tokens[pos] == 1 and tokens[pos + 1] in tables[-1]
  expected[pos + 1] = resolve(hops - 1, tokens[pos + 1])
  assert pos + 2 == len(tokens)
  return tables, expected


@pytest.mark.parametrize('hops,entry_targets,equals_targets', [
    (1, False, False), (2, False, False), (3, False, False), (5, False, False),
    (10, False, False), (1, True, False), (4, True, False), (1, False, True), (3, False, True),
    (4, True, True)])
def test_generator_agrees_with_an_independent_reader(hops, entry_targets, equals_targets):
  tokens, targets = pc.batch(hops, 100, seed=hops, entry_targets=entry_targets,
                             equals_targets=equals_targets)
  assert tokens.dtype == targets.dtype == np.int32
  assert tokens.shape == targets.shape == (100, 42 * hops + 2)
  final_keys = set()
  for row_tokens, row_targets in zip(tokens, targets):
    tables, expected = read_example(row_tokens, hops, entry_targets, equals_targets)
    np.testing.assert_array_equal(row_targets, [-1 if e is None else e for e in expected])
    # Index tables are permutations: each lower-level key is pointed at exactly once.
    for level in range(1, hops):
      lower_keys = list(range(4 + 8 * (level - 1), 12 + 8 * (level - 1)))
      assert sorted(tables[level].values()) == lower_keys
    final_keys.add(int(row_tokens[-1]))
  assert len(final_keys) == 8  # every top-level key gets queried over 100 examples


@pytest.mark.parametrize('hops,num_keys,equals_targets', [(1, 1, False), (2, 2, False),
                                                           (3, 4, True), (4, 7, False)])
def test_fewer_keys_keep_the_layout_and_resolve_correctly(hops, num_keys, equals_targets):
  """A key-curriculum stage: num_keys real entries per table (a random subset of the level's
  tokens, permuted onto the level below's subset), PAD up to 8, the same T and labels."""
  tokens, targets = pc.batch(hops, 100, seed=7, num_keys=num_keys,
                             equals_targets=equals_targets)
  assert tokens.shape == (100, 42 * hops + 2)
  used = set()
  for row_tokens, row_targets in zip(tokens, targets):
    tables, expected = read_example(row_tokens, hops, equals_targets=equals_targets,
                                    num_keys=num_keys)
    np.testing.assert_array_equal(row_targets, [-1 if e is None else e for e in expected])
    for level in range(1, hops):
      assert sorted(tables[level].values()) == sorted(tables[level - 1])
    used.update(tables[0])
  assert len(used) == 8  # the subsets differ from example to example
  # Targets sit only where the full layout has them (evaluation's labels stay valid).
  kinds = pc.position_labels(hops).kind
  assert np.all(kinds[(targets >= 0).any(0)] != pc.NONE)
  tables_only, _ = pc.batch(hops, 4, seed=7, num_keys=num_keys, encoding='tables')
  assert tables_only.shape == (4, 25 * hops + 2)


def test_key_curriculum_stages_follow_the_step():
  stages = curricula.parse_key_curriculum('2:500/4:1000')
  assert stages == ((2, 500), (4, 1000))
  assert [curricula.curriculum_keys(stages, s) for s in (0, 499, 500, 999, 1000, 10**6)] == \
      [2, 2, 4, 4, 8, 8]
  assert curricula.curriculum_keys((), 0) == 8
  stream = pointer_task._BatchStream(2, 8, 0, 0, 1, 'tables', stages)
  stream.set_state({'next_index': 499})
  assert (next(stream)['tokens'][:, 3 * 2:3 * 8] == 0).all()   # step 499: two keys
  stream.set_state({'next_index': 1000})
  assert (next(stream)['tokens'][:, 2:24:3] != 0).all()        # step 1000: all eight
  for bad in ('2', '8:100', '4:100/2:200', '2:100/4:50', 'x:1', '2:0'):
    with pytest.raises(ValueError, match='key_curriculum'):
      curricula.parse_key_curriculum(bad)


@pytest.mark.parametrize('encoding', pc.ENCODINGS)
def test_a_hop_curriculum_example_is_its_full_twin_cut_short(encoding):
  hops = 3
  full_tokens, full_targets = pc.batch(hops, 16, seed=5, encoding=encoding, entry_targets=True,
                                       equals_targets=True)
  starts = pc._level_starts(hops, encoding)
  for levels in (1, 2, 3):
    tokens, targets = pc.batch(hops, 16, seed=5, encoding=encoding, entry_targets=True,
                               equals_targets=True, num_levels=levels)
    assert tokens.shape == full_tokens.shape
    cut = starts[levels]
    np.testing.assert_array_equal(tokens[:, :cut], full_tokens[:, :cut])
    np.testing.assert_array_equal(targets[:, :cut], full_targets[:, :cut])
    assert (tokens[:, cut:-2] == pc.PAD).all() and (targets[:, cut:-1] == pc.IGNORE).all()
    # The final query asks a key of the last level present; its answer is that key's resolved
    # value, which the full example's table gives at the same key.
    final_key = tokens[:, -1]
    assert ((final_key >= pc.key_token(levels - 1, 0))
            & (final_key <= pc.key_token(levels - 1, 7))).all()
    table = slice(starts[levels - 1], starts[levels - 1] + pc.TABLE_LEN)
    for row in range(16):
      at = np.flatnonzero(full_tokens[row, table] == final_key[row])
      assert len(at) == 1
      assert targets[row, -1] == full_targets[row, table][at[0]]
  np.testing.assert_array_equal(tokens, full_tokens)  # all levels: the plain example
  with pytest.raises(ValueError, match='num_levels'):
    pc.batch(hops, 2, seed=0, num_levels=4)


def test_hop_curriculum_stages_follow_the_step():
  stages = curricula.parse_hop_curriculum('1:500/2:1500', hops=3)
  assert stages == ((1, 500), (2, 1500))
  assert [curricula.curriculum_levels(stages, s, 3) for s in (0, 499, 500, 1499, 1500)] == \
      [1, 1, 2, 2, 3]
  assert curricula.curriculum_levels((), 0, 3) == 3
  stream = pointer_task._BatchStream(3, 8, 0, 0, 1, 'tables', (), stages)
  level_1 = slice(pc.TABLE_LEN, 2 * pc.TABLE_LEN)
  stream.set_state({'next_index': 499})
  assert (next(stream)['tokens'][:, level_1] == pc.PAD).all()    # step 499: one level
  stream.set_state({'next_index': 1500})
  assert (next(stream)['tokens'][:, level_1] != pc.PAD).any()    # step 1500: every level
  for bad in ('1', '3:100', '2:100/1:200', '1:100/2:50', 'x:1', '1:0'):
    with pytest.raises(ValueError, match='hop_curriculum'):
      curricula.parse_hop_curriculum(bad, hops=3)


def test_examples_are_random_across_seeds_and_indices():
  a, _ = pc.batch(3, 64, seed=0)
  b, _ = pc.batch(3, 64, seed=1)
  assert len({row.tobytes() for row in np.concatenate([a, b])}) == 128
  # Base values look uniform over the 16 values (chance level is 1/16).
  tokens, _ = pc.batch(1, 2000, seed=7)
  values = tokens[:, 0:24:3].ravel() - pc.value_token(1, 0)
  counts = np.bincount(values, minlength=16)
  assert counts.min() > 0.8 * 1000 and counts.max() < 1.2 * 1000


def test_same_seed_same_example_in_every_access_path():
  tokens, targets = pc.batch(4, 5, seed=11, start=3)
  again = pc.batch(4, 5, seed=11, start=3)
  np.testing.assert_array_equal(tokens, again[0])
  np.testing.assert_array_equal(targets, again[1])
  longer = pc.batch(4, 10, seed=11)
  np.testing.assert_array_equal(tokens, longer[0][3:8])
  single = pc.sample(4, seed=11, index=5)
  np.testing.assert_array_equal(single[0], tokens[2])
  np.testing.assert_array_equal(single[1], targets[2])
  assert not np.array_equal(pc.sample(4, seed=12, index=5)[0], single[0])


def test_grain_source():
  source = pc.PointerChasingSource(hops=2, num_examples=6, seed=3)
  dataset = grain.MapDataset.source(source)
  assert len(dataset) == 6
  record = dataset[4]
  assert set(record) == {'tokens', 'targets'}
  np.testing.assert_array_equal(record['tokens'], pc.sample(2, 3, 4)[0])
  batched = list(dataset.batch(3))
  np.testing.assert_array_equal(batched[1]['targets'], pc.batch(2, 3, 3, start=3)[1])
  with pytest.raises(IndexError):
    source[6]


def test_token_layout():
  assert pc.vocab_size(10) == 100 and pc.seq_len(10) == 422
  for hops in (1, 2, 7):
    assert pc.seq_len(hops) == 42 * hops + 2
    assert pc.vocab_size(hops) == 4 + 8 * hops + 16
  assert (pc.PAD, pc.QUERY, pc.EQUALS, pc.SEP) == (0, 1, 2, 3)
  assert pc.key_token(0, 0) == 4 and pc.key_token(9, 7) == 83 and pc.value_token(10, 0) == 84
  tokens, targets = pc.batch(10, 8, seed=0)
  assert tokens.min() >= 1 and tokens.max() < 100  # no PAD inside an example
  assert set(np.unique(targets[targets >= 0])) <= set(range(84, 100))
  with pytest.raises(ValueError, match='hops'):
    pc.seq_len(0)


@pytest.mark.parametrize('hops,entry_targets,equals_targets',
                         [(1, False, False), (4, False, False), (3, True, False), (2, False, True),
                          (3, True, True)])
def test_position_labels_mark_exactly_the_targets(hops, entry_targets, equals_targets):
  labels = pc.position_labels(hops)
  tokens, targets = pc.batch(hops, 16, seed=2, entry_targets=entry_targets,
                             equals_targets=equals_targets)
  plain = pc.batch(hops, 16, seed=2)
  np.testing.assert_array_equal(tokens, plain[0])  # helpers change targets, never tokens
  has_target = targets >= 0
  labelled = labels.kind != pc.NONE
  if not entry_targets:
    labelled &= labels.kind != pc.ENTRY_TARGET
  if not equals_targets:
    labelled &= labels.kind != pc.EQUALS_TARGET
  assert np.all(has_target == labelled[None])
  # Every labelled position holds a key of the labelled level, or an entry's '='.
  is_key = has_target[0] & (labels.kind != pc.EQUALS_TARGET)
  key_levels = (tokens - 4) // 8
  assert np.all(key_levels[:, is_key] == labels.level[is_key][None])
  assert np.all(tokens[:, labels.kind == pc.EQUALS_TARGET] == pc.EQUALS)
  counts = np.bincount(labels.kind, minlength=6)
  assert counts[pc.TABLE_KEY] == counts[pc.QUERY_KEY] == 8 * hops and counts[pc.FINAL_QUERY] == 1
  assert counts[pc.ENTRY_TARGET] == 8 * (hops - 1) and counts[pc.EQUALS_TARGET] == 8 * hops
  assert labels.level[-1] == hops - 1


def test_format_example_matches_the_module_docstring():
  text = pc.format_example(*pc.sample(2, seed=0))
  assert '\n'.join('  ' + line for line in text.splitlines()) in pc.__doc__
  assert text.splitlines()[1].startswith('L0 table: ') and text.splitlines()[-1].startswith(
      'final:')


# ------------------------------------------------------------------------------------------------
# Evaluation.
# ------------------------------------------------------------------------------------------------


def reader_predictor(hops, max_level):
  """Predicts the reader's answer for keys of levels <= max_level, PAD elsewhere."""
  def predict(tokens):
    out = np.zeros_like(tokens)
    for i, row in enumerate(tokens):
      _, expected = read_example(row, hops)
      for t, value in enumerate(expected):
        if value is not None and (int(row[t]) - 4) // 8 <= max_level:
          out[i, t] = value
    return out
  return predict


def test_evaluate_groups_positions_by_level():
  hops = 3
  perfect = pointer_task.evaluate(reader_predictor(hops, hops - 1), hops, num_examples=40,
                                  batch_size=16)
  assert perfect['level_accuracy'] == {'L0': 1.0, 'L1': 1.0, 'L2': 1.0}
  assert perfect['final_query_accuracy'] == perfect['table_key_accuracy'] == 1.0
  assert pointer_task.levels_solved(perfect['level_accuracy']) == 3

  two_levels = pointer_task.evaluate(reader_predictor(hops, 1), hops, num_examples=40,
                                     batch_size=16)
  assert two_levels['level_accuracy'] == {'L0': 1.0, 'L1': 1.0, 'L2': 0.0}
  assert two_levels['final_query_accuracy'] == 0.0
  assert two_levels['table_level_accuracy'] == {'L0': 1.0, 'L1': 1.0, 'L2': 0.0}
  assert two_levels['table_key_accuracy'] == pytest.approx(2 / 3)
  assert pointer_task.levels_solved(two_levels['level_accuracy']) == 2
  assert pointer_task.levels_solved({'L0': 0.95, 'L1': 0.9}, threshold=0.9) == 1


def test_evaluate_accepts_logits_and_uses_a_held_out_stream():
  hops, vocab = 2, pc.vocab_size(2)
  seen = []

  def uniform_logits(tokens):
    seen.append(tokens.copy())
    return np.zeros(tokens.shape + (vocab,), np.float32)  # argmax = PAD everywhere

  metrics = pointer_task.evaluate(uniform_logits, hops, num_examples=10, batch_size=4)
  assert metrics['level_accuracy'] == {'L0': 0.0, 'L1': 0.0}
  assert metrics['num_examples'] == 10
  assert [len(b) for b in seen] == [4, 4, 4]  # padded to full batches
  evaluated = np.concatenate(seen)[:10]
  np.testing.assert_array_equal(evaluated, pc.batch(hops, 10, pc.EVAL_SEED)[0])
  training = {row.tobytes() for row in pc.batch(hops, 256, seed=0)[0]}
  assert not training & {row.tobytes() for row in evaluated}


def test_loss_on_targets_scores_the_key_positions_themselves():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  targets = np.array([[-1, 3, -1, 6, -1], [0, -1, -1, -1, 2]])
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  picked = [log_probs[b, t, targets[b, t]] for b, t in zip(*np.nonzero(targets >= 0))]
  assert float(pointer_task.loss_on_targets(logits, targets)) == pytest.approx(-np.mean(picked),
                                                                              rel=1e-5)
  # 'all': the same sum over every position (4 targets of 10 positions).
  assert float(pointer_task.loss_on_targets(logits, targets, 'all')) == pytest.approx(
      -np.sum(picked) / 10, rel=1e-5)
  with pytest.raises(ValueError, match='over'):
    pointer_task.loss_on_targets(logits, targets, 'mean')


# ------------------------------------------------------------------------------------------------
# The 'tables' encoding (the author's notes version).
# ------------------------------------------------------------------------------------------------


def drop_query_sections(row, hops):
  """A 'sections' row with its query sections cut out: what 'tables' should be."""
  keep = [row[42 * lvl:42 * lvl + 25] for lvl in range(hops)] + [row[-2:]]
  return np.concatenate(keep)


@pytest.mark.parametrize('hops,entry_targets,equals_targets',
                         [(1, False, False), (3, False, False), (4, True, True)])
def test_tables_encoding_is_the_sections_example_without_its_query_sections(
    hops, entry_targets, equals_targets):
  kwargs = dict(entry_targets=entry_targets, equals_targets=equals_targets)
  tokens, targets = pc.batch(hops, 32, seed=5, encoding='tables', **kwargs)
  full_tokens, full_targets = pc.batch(hops, 32, seed=5, **kwargs)
  assert tokens.shape == targets.shape == (32, 25 * hops + 2) == (32, pc.seq_len(hops, 'tables'))
  for row, full in ((tokens, full_tokens), (targets, full_targets)):
    np.testing.assert_array_equal(row, [drop_query_sections(r, hops) for r in full])
  assert not np.any(tokens[:, :-2] == pc.QUERY)  # only the final query asks
  labels = pc.position_labels(hops, 'tables')
  assert pc.QUERY_KEY not in labels.kind
  counts = np.bincount(labels.kind, minlength=6)
  assert counts[pc.TABLE_KEY] == 8 * hops and counts[pc.FINAL_QUERY] == 1
  scored = np.isin(labels.kind, [pc.TABLE_KEY, pc.FINAL_QUERY])
  assert np.all(targets[:, scored] >= 0)
  plain = pc.batch(hops, 32, seed=5, encoding='tables')[1]
  assert np.all((plain >= 0) == scored[None])


def test_tables_encoding_levels_are_the_table_levels_and_the_final_query():
  hops = 3

  def knows_levels(max_level):
    def predict(tokens):
      out = np.zeros_like(tokens)
      for i, row in enumerate(tokens):
        full = pc.sample(hops, pc.EVAL_SEED, start_index[0] + i)
        answers = drop_query_sections(full[1], hops)
        assert np.array_equal(drop_query_sections(full[0], hops), row)
        level = (row - 4) // 8
        out[i] = np.where((answers >= 0) & (level <= max_level), answers, 0)
      start_index[0] += len(tokens)
      return out
    start_index = [0]
    return predict

  perfect = pointer_task.evaluate(knows_levels(hops - 1), hops, num_examples=16, batch_size=8,
                                  encoding='tables')
  assert perfect['level_accuracy'] == {'L0': 1.0, 'L1': 1.0, 'L2': 1.0, 'L3': 1.0}
  assert pointer_task.levels_solved(perfect['level_accuracy']) == 4
  two = pointer_task.evaluate(knows_levels(1), hops, num_examples=16, batch_size=8,
                              encoding='tables')
  assert two['level_accuracy'] == {'L0': 1.0, 'L1': 1.0, 'L2': 0.0, 'L3': 0.0}


def test_encoding_is_validated():
  with pytest.raises(ValueError, match='encoding'):
    pc.seq_len(3, 'notes')
  with pytest.raises(ValueError, match='encoding'):
    pc.batch(3, 2, seed=0, encoding='notes')
  assert 'L0 table' in pc.format_example(*pc.sample(2, 0, encoding='tables'), encoding='tables')
  assert 'query' not in pc.format_example(*pc.sample(2, 0, encoding='tables'),
                                          encoding='tables')


def split_multi_q(row, hops):
  """A 'multi_q' row -> (the row without its partial sections, {level: [partial sections]})."""
  keep, partial, pos = [], {}, 0
  for level in range(hops):
    keep.append(row[pos:pos + 25])
    pos += 25
    partial[level] = [row[pos + 17 * j:pos + 17 * (j + 1)] for j in range(level)]
    pos += 17 * level
    keep.append(row[pos:pos + 17])
    pos += 17
  keep.append(row[pos:])
  return np.concatenate(keep), partial


@pytest.mark.parametrize('hops,equals_targets', [(1, False), (3, False), (4, True)])
def test_multi_q_adds_partial_sections_whose_targets_are_the_keys_j_hops_down(hops,
                                                                             equals_targets):
  tokens, targets = pc.batch(hops, 24, seed=7, encoding='multi_q', equals_targets=equals_targets)
  full_tokens, full_targets = pc.batch(hops, 24, seed=7, equals_targets=equals_targets)
  assert tokens.shape == (24, 42 * hops + 17 * hops * (hops - 1) // 2 + 2)
  assert tokens.shape[1] == pc.seq_len(hops, 'multi_q')
  labels = pc.position_labels(hops, 'multi_q')
  assert np.sum(labels.kind == pc.PARTIAL_QUERY) == 8 * hops * (hops - 1) // 2
  for row, row_targets, full, full_t in zip(tokens, targets, full_tokens, full_targets):
    rest, partial = split_multi_q(row, hops)
    np.testing.assert_array_equal(rest, full)  # the 'sections' twin, partial sections removed
    np.testing.assert_array_equal(split_multi_q(row_targets, hops)[0], full_t)
    tables, _ = read_example(full, hops)
    _, partial_targets = split_multi_q(row_targets, hops)
    for level in range(hops):
      for j, (section, answers) in enumerate(zip(partial[level], partial_targets[level]), 1):
        assert section[-1] == pc.SEP and np.all(section[0:16:2] == pc.QUERY)
        keys = section[1:16:2]
        assert sorted(keys) == list(range(4 + 8 * level, 12 + 8 * level))
        for key, answer in zip(keys, answers[1:16:2]):
          for lvl in range(level, level - j, -1):
            key = tables[lvl][int(key)]
          assert answer == key and (answer - 4) // 8 == level - j
  # Scoring ignores the partial sections: it is the 'sections' scoring of the same rows.
  assert set(labels.kind[labels.kind != pc.PARTIAL_QUERY]) <= {
      pc.NONE, pc.TABLE_KEY, pc.QUERY_KEY, pc.FINAL_QUERY, pc.EQUALS_TARGET, pc.ENTRY_TARGET}
  text = pc.format_example(tokens[0], targets[0], encoding='multi_q')
  assert text.count('-hop:') == hops * (hops - 1) // 2 and text.count('query:') == hops


def test_plateau_profile_shows_each_section_slot_by_slot():
  hops = 2

  def knows_level0(tokens):
    out = np.zeros_like(tokens)
    for i in range(len(tokens)):
      row, answers = pc.sample(hops, pc.EVAL_SEED, start[0] + i, encoding='multi_q')
      assert np.array_equal(row, tokens[i])
      out[i] = np.where((row - 4) // 8 == 0, answers, 0)  # right exactly at level-0 keys
    start[0] += len(tokens)
    return out
  start = [0]
  result = pointer_task.evaluate(knows_level0, hops, num_examples=8, batch_size=8,
                                 encoding='multi_q')
  accuracy = result['position_accuracy']
  assert accuracy.shape == (pc.seq_len(hops, 'multi_q'),)
  assert np.isnan(accuracy[pc.position_labels(hops, 'multi_q').kind == pc.NONE]).all()
  text = pointer_task.plateau_profile(accuracy, hops, 'multi_q')
  lines = text.splitlines()
  assert lines[2] == '| table keys | L0 | ' + ' | '.join(['1.00'] * 8) + ' |'
  assert '| partial section, 1 hop | L1 | ' + ' | '.join(['0.00'] * 8) + ' |' in lines
  assert sum(line.startswith('| final query') for line in lines) == 1
  assert len(lines) == 2 + 2 + 1 + 2 + 1  # L0: table, query; L1: table, partial, query; final
