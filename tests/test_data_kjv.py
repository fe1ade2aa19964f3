"""Tests of the King James Bible TFDS builder."""

import re
import sys

import pytest
import tensorflow_datasets as tfds

from ctr_jax.data import kjv


@pytest.fixture(scope='module')
def kjv_sources(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('kjv_data')
  builder = kjv.KjvBible(data_dir=str(data_dir), file_format='array_record')
  builder.download_and_prepare()
  return data_dir, builder.as_data_source()


def _records(source):
  return [{k: v.decode('utf-8') for k, v in source[i].items()} for i in range(len(source))]


def test_read_chapters_strips_verse_numbers():
  chapters = kjv.read_chapters()
  assert len(chapters) == 1189
  assert len({key for key, _, _ in chapters}) == 1189
  assert not any(re.search(r'\d', text) for _, _, text in chapters)
  key, title, text = chapters[0]
  assert (key, title) == ('1-01-001', 'Genesis 1')
  assert text.startswith('In the beginning God created')
  assert chapters[-1][1] == 'Revelation 22'
  assert chapters[-1][2].endswith('be with you all. Amen.')


def test_verse_crossing_a_chapter_boundary_goes_to_its_chapter():
  # The database stores Exodus 6:30 and 7:1 in one row.
  chapters = {title: text for _, title, text in kjv.read_chapters()}
  assert chapters['Exodus 6'].endswith('how shall Pharaoh hearken unto me?')
  assert chapters['Exodus 7'].startswith('And the LORD said unto Moses, See, I have made thee')


def test_splits(kjv_sources):
  _, sources = kjv_sources
  assert set(sources) == {'train', 'validation'}
  train, validation = _records(sources['train']), _records(sources['validation'])
  assert (len(train), len(validation)) == (1130, 59)
  assert not {r['title'] for r in train} & {r['title'] for r in validation}
  assert isinstance(sources['train'][0]['text'], bytes)
  for record in train + validation:
    assert record['text'] and not re.search(r'\d+:\d+', record['text'])
  # Every 20th chapter in canonical order is held out.
  assert 'Genesis 20' in {r['title'] for r in validation}


def test_content_is_deterministic(kjv_sources, tmp_path):
  data_dir, sources = kjv_sources
  builder = kjv.KjvBible(data_dir=str(tmp_path), file_format='array_record')
  builder.download_and_prepare()
  again = builder.as_data_source()
  for split in ('train', 'validation'):
    assert _records(again[split]) == _records(sources[split])
  # The registered name reads the same data without TensorFlow.
  by_name = tfds.data_source('kjv_bible', data_dir=str(data_dir))
  assert _records(by_name['validation']) == _records(sources['validation'])
  assert 'tensorflow' not in sys.modules
