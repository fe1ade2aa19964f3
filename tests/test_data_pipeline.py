"""Tests of the grain input pipeline."""

import json
import os

import numpy as np
import pytest

from ctr_jax.data import pipeline

T = 7  # Windows of T + 1 = 8 tokens.
NUM_WINDOWS = 50


def _synthetic(num_train_windows=NUM_WINDOWS, num_validation_windows=23):
  # Token i is just i, so a window is identified by its first token // (T + 1); a few
  # trailing tokens that do not fill a window must never appear.
  return pipeline.Dataset(
      name='synthetic',
      tokenizer=None,
      train_tokens=np.arange(num_train_windows * (T + 1) + 3, dtype=np.int32),
      validation_tokens=np.arange(num_validation_windows * (T + 1) + 5, dtype=np.int32),
  )


def _window_ids(batch):
  return [int(row[0]) // (T + 1) for row in batch]


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def test_windows_are_packed_and_shaped():
  batch = next(pipeline.train_iterator(_synthetic(), seq_len=T, global_batch_size=10))
  assert batch.shape == (10, T + 1) and batch.dtype == np.int32
  for row in batch:
    assert row[0] % (T + 1) == 0
    np.testing.assert_array_equal(row, np.arange(row[0], row[0] + T + 1))


def test_same_seed_same_batches_other_seed_other_batches():
  ds = _synthetic()
  a = _take(pipeline.train_iterator(ds, T, 10, seed=0), 12)
  b = _take(pipeline.train_iterator(ds, T, 10, seed=0), 12)
  c = _take(pipeline.train_iterator(ds, T, 10, seed=1), 12)
  np.testing.assert_array_equal(np.stack(a), np.stack(b))
  assert not np.array_equal(np.stack(a), np.stack(c))


def test_each_epoch_covers_every_window_once_and_is_reshuffled():
  batches = _take(pipeline.train_iterator(_synthetic(), T, 10, seed=3), 10)
  epochs = [sum((_window_ids(b) for b in batches[i:i + 5]), []) for i in (0, 5)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(NUM_WINDOWS))
  assert epochs[0] != epochs[1]


@pytest.mark.parametrize('process_count', [2, 5])
def test_process_shards_are_disjoint_and_make_up_the_global_batch(process_count):
  ds = _synthetic()
  single = _take(pipeline.train_iterator(ds, T, 10, seed=4), 8)
  shards = [_take(pipeline.train_iterator(ds, T, 10, seed=4, process_index=i,
                                          process_count=process_count), 8)
            for i in range(process_count)]
  for step in range(8):
    parts = [shard[step] for shard in shards]
    assert all(p.shape == (10 // process_count, T + 1) for p in parts)
    ids = sum((_window_ids(p) for p in parts), [])
    assert len(set(ids)) == len(ids)
    np.testing.assert_array_equal(np.concatenate(parts), single[step])


def test_restored_iterator_continues_exactly():
  ds = _synthetic()
  it = pipeline.train_iterator(ds, T, 10, seed=5)
  _take(it, 7)
  state = json.loads(json.dumps(it.get_state()))  # Must survive JSON.
  expected = _take(it, 6)
  restored = pipeline.train_iterator(ds, T, 10, seed=5)
  restored.set_state(state)
  np.testing.assert_array_equal(np.stack(_take(restored, 6)), np.stack(expected))
  # The state counts global batches, so it also restores on another process count.
  half = pipeline.train_iterator(ds, T, 10, seed=5, process_index=1, process_count=2)
  half.set_state(state)
  np.testing.assert_array_equal(np.stack(_take(half, 6)), np.stack(expected)[:, 5:])


def test_eval_batches():
  ds = _synthetic(num_validation_windows=23)
  batches = pipeline.eval_batches(ds, T, 4)
  assert len(batches) == 5  # 23 windows -> 5 full batches of 4; the rest is dropped.
  assert [_window_ids(b) for b in batches] == [list(range(4 * i, 4 * i + 4)) for i in range(5)]
  again = list(pipeline.eval_batches(ds, T, 4))
  np.testing.assert_array_equal(np.stack(list(batches)), np.stack(again))
  assert all(b.dtype == np.int32 and b.shape == (4, T + 1) for b in batches)
  assert len(pipeline.eval_batches(ds, T, 4, num_batches=2)) == 2
  assert len(pipeline.eval_batches(ds, T, 4, num_batches=99)) == 5
  shards = [pipeline.eval_batches(ds, T, 4, process_index=i, process_count=2) for i in (0, 1)]
  for step in range(5):
    np.testing.assert_array_equal(np.concatenate([s[step] for s in shards]), batches[step])
  with pytest.raises(ValueError, match='fewer than global_batch_size'):
    pipeline.eval_batches(ds, T, 24)


@pytest.mark.parametrize('kwargs, match', [
    (dict(global_batch_size=10, process_count=3), 'multiple of process_count'),
    (dict(global_batch_size=10, process_index=2, process_count=2), 'process_index'),
    (dict(global_batch_size=10, seq_len=10_000), 'fewer than one window'),
])
def test_bad_iterator_arguments(kwargs, match):
  kwargs = dict(dict(seq_len=T), **kwargs)
  with pytest.raises(ValueError, match=match):
    pipeline.train_iterator(_synthetic(), **kwargs)


def test_unknown_name():
  with pytest.raises(ValueError, match=r"config.data.name='tiny'.*'kjv_bible'.*'openwebtext'"):
    pipeline.load('tiny', data_dir='/nonexistent', vocab_size=300)


def test_unwritable_data_dir(tmp_path):
  (tmp_path / 'file').write_text('')
  with pytest.raises(ValueError, match='config.data.data_dir=.* is not a writable') as e:
    pipeline.load('kjv_bible', data_dir=tmp_path / 'file' / 'data', vocab_size=300)
  assert '\n' not in str(e.value)


@pytest.fixture(scope='module')
def kjv_dataset(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('kjv_pipeline')
  return data_dir, pipeline.load('kjv_bible', data_dir=data_dir, vocab_size=512)


def test_kjv_end_to_end(kjv_dataset):
  data_dir, ds = kjv_dataset
  tok = ds.tokenizer
  assert tok.vocab_size == 512
  for tokens, docs in ((ds.train_tokens, 1130), (ds.validation_tokens, 59)):
    assert tokens.dtype == np.uint16 and tokens.ndim == 1
    assert int(np.sum(tokens == tok.eot_id)) == docs
    assert tokens[-1] == tok.eot_id
    assert 0 <= tokens.min() and tokens.max() < tok.vocab_size
  # The stream is the documents in stored order, each followed by EOT.
  source = pipeline.BUILDERS['kjv_bible'](
      data_dir=str(data_dir), file_format='array_record').as_data_source()['validation']
  first_eot = int(np.argmax(ds.validation_tokens == tok.eot_id))
  assert tok.decode(ds.validation_tokens[:first_eot]) == source[0]['text'].decode()
  batch = next(pipeline.train_iterator(ds, seq_len=64, global_batch_size=4))
  assert batch.shape == (4, 65) and batch.dtype == np.int32
  assert len(pipeline.eval_batches(ds, seq_len=64, global_batch_size=4, num_batches=3)) == 3


def test_kjv_caches_are_reused(kjv_dataset):
  data_dir, ds = kjv_dataset
  cache_dir = data_dir / 'tokenizers'
  files = sorted(os.listdir(cache_dir))
  assert files[0] == 'kjv_bible_512.json' and len(files) == 3
  mtimes = {f: os.stat(cache_dir / f).st_mtime_ns for f in files}
  again = pipeline.load('kjv_bible', data_dir=data_dir, vocab_size=512)
  assert {f: os.stat(cache_dir / f).st_mtime_ns for f in os.listdir(cache_dir)} == mtimes
  np.testing.assert_array_equal(again.train_tokens, ds.train_tokens)
  # The cached token files are ordinary .npy files.
  assert np.load(cache_dir / files[1]).shape in (ds.train_tokens.shape,
                                                 ds.validation_tokens.shape)
