"""The preparation-rate measurement (issue 40 item 3) at tiny sizes: its json fields, and the
projection being arithmetic on the measured rows."""

import json
import math

import pytest

from ctr_jax.projects.perf import prepare_rate

ROW_FIELDS = ('corpus', 'layout', 'workers', 'text_mb', 'input_mb', 'seconds', 'text_mb_per_s',
              'input_mb_per_s')


@pytest.fixture(scope='module')
def result(tmp_path_factory):
  return prepare_rate.run(owt_text_mb=0.3, wiki_text_mb=0.2, workers=(1, 2), vocab_size=300,
                          tokenizer_train_mb=0.2, work_dir=str(tmp_path_factory.mktemp('w')),
                          command='python -m ctr_jax.projects.perf.prepare_rate (test)',
                          progress=False, wiki_parts=3)


def test_rows_cover_every_corpus_layout_and_worker_count(result):
  for key in ('command', 'date', 'machine', 'machine_summary', 'shared_machine',
              'load_average_start', 'load_average_end', 'corpus_sizes', 'outer_read'):
    assert result[key], key
  seen = {(r['corpus'], r['layout'], r['workers']) for r in result['rows']}
  assert seen == {(c, layout, w) for c, layouts in prepare_rate.LAYOUTS.items()
                  for layout in layouts for w in (1, 2)}
  for r in result['rows']:
    assert all(k in r for k in ROW_FIELDS)
    assert r['text_mb'] > 0.1 and r['input_mb'] > 0.01 and r['seconds'] > 0
    assert math.isclose(r['text_mb_per_s'], r['text_mb'] / r['seconds'])
    assert math.isclose(r['input_mb_per_s'], r['input_mb'] / r['seconds'])
  # Both layouts of a corpus hold the same documents.
  for corpus in prepare_rate.LAYOUTS:
    texts = {r['text_mb'] for r in result['rows'] if r['corpus'] == corpus}
    assert len(texts) == 1, (corpus, texts)
  json.dumps(result)  # what main writes


def test_projection_is_arithmetic_on_the_measured_rows(result):
  rows = {(r['corpus'], r['layout'], r['workers']): r for r in result['rows']}
  assert len(result['projection']) == 4
  for p in result['projection']:
    basis, size = prepare_rate.BASIS[p['corpus']]
    one = rows[p['corpus'], p['layout'], 1][f'{basis}_mb_per_s']
    two = rows[p['corpus'], p['layout'], 2][f'{basis}_mb_per_s']
    efficiency = two / (2 * one)
    assert math.isclose(p['two_worker_efficiency'], efficiency)
    assert list(p['hours']) == [str(c) for c in prepare_rate.CORES]
    for cores, hours in p['hours'].items():
      c = int(cores)
      expected = size / 1e6 / (one * c * (efficiency if c > 1 else 1)) / 3600
      assert math.isclose(hours, expected), (p['corpus'], p['layout'], cores)
  sizes = result['corpus_sizes']
  assert sizes['openwebtext_text_bytes'] == 38 * 10**9
  assert sizes['wikipedia_bz2_bytes'] == 22 * 10**9


def test_the_page_starts_with_the_verdict_and_is_rebuilt_from_the_json(result, tmp_path):
  out, md = tmp_path / 'prepare_rate.json', tmp_path / 'prepare_rate.md'
  out.write_text(json.dumps(result))
  prepare_rate.main(['--report_only', f'--out={out}', f'--md={md}'])
  text = md.read_text()
  body = text.split(prepare_rate.BEGIN, 1)[1]
  assert body.strip().startswith('**Verdict:**')
  assert '| openwebtext | hf_mirror | 2 |' in body and '| wikipedia | parts | 1 |' in body
  assert 'h at 64 cores' in body and 'beyond 2 cores' in body
  assert prepare_rate.SIZES_SOURCE in body
