"""The benchmark suite runs end to end on toy sizes (benchmarks are not tests: no timings are
asserted, only that every section produces its numbers and the report is written)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@pytest.mark.slow
def test_tiny_bench_writes_every_section(tmp_path):
  from configs.bench import tiny  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import report, runner  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  config.scaling.seq_lens = [8, 16]
  results = runner.run(config, log=lambda *_: None)
  assert results['peak_flops'] > 0 and results['bandwidth'] > 0
  assert {r['label'] for r in results['train']} == {'t2_c32', 'd1_c32'}
  assert [r['m'] for r in results['train'] if r['label'] == 'd1_c32'] == [0, 1]
  assert all(r['tokens_per_second'] > 0 and 0 < r['mfu'] for r in results['train'])
  assert len(results['decode']) == 4 and len(results['decode_pairs']) == 2
  assert results['prefill']['max_abs_logit_diff'] < 1e-2
  [generate] = results['generate']
  assert generate['whole_call_ms'] > 0 and generate['marginal_ms_per_token'] >= 0
  assert set(results['scaling']['train']['by_k']) == {1, 2}
  path = tmp_path / 'benchmarks.md'
  path.write_text('# Benchmarks\n\nHand-written text.\n')
  for _ in range(2):  # a rerun replaces its own section and keeps the rest
    report.write_section(str(path), 'tiny', report.markdown(results))
  text = path.read_text()
  assert text.count('<!-- bench:tiny -->') == 1 and 'Hand-written text.' in text
  assert '#### Training throughput' in text and '#### Prefill' in text
  assert '#### `decode.generate` as users call it' in text
  assert '| d1_c32 | 2 | 1 |' in text and '| d1_c32 | 2 | all |' in text


def test_bench_rejects_m_beyond_k():
  from configs.bench import tiny  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import runner  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  config.train[2]['m'] = 3
  with pytest.raises(ValueError, match=r'bench.train\[2\].m: got 3'):
    runner.validate(config)


def test_bad_bench_config_is_one_line(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'ctr_jax.bench', '--config=configs/bench/tiny.py',
       '--config.sections=train,fly', f'--output={tmp_path}/b.md'],
      cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith('ctr_jax.bench: error: bench.sections')
  assert 'Traceback' not in result.stderr
  assert not os.path.exists(f'{tmp_path}/b.md')


def test_chunked_prefill_section_runs_at_toy_sizes(tmp_path):
  """The chunked-prefill rows (configs/bench/prefill_cpu.py's section) at tiny.py's sizes: every
  chunk size and pass count gets a row, exact rows match the scan, and the table is written."""
  from configs.bench import prefill_cpu  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import report, runner  # pylint: disable=g-import-not-at-top
  config = prefill_cpu.get_config('runlocal')
  assert config.sections == 'chunked'
  results = runner.run(config, log=lambda *_: None)
  (entry,) = results['chunked']
  ch = config.chunked
  expected = sum(len([p for p in ch.passes if p <= c]) + 1 for c in ch.chunks)
  assert len(entry['rows']) == expected and entry['scan_ms'] > 0
  for row in entry['rows']:
    assert row['ms'] > 0 and row['passes_max'] <= min(row['passes'], row['chunk'])
    if row['tolerance']:
      assert row['passes'] == min(ch.tolerance_passes, row['chunk'])
    if row['exact_bound']:
      assert row['max_abs_logit_diff'] < 1e-4, row
  path = tmp_path / 'benchmarks.md'
  report.write_section(str(path), 'tiny', report.markdown(results))
  assert '#### Chunked prefill vs the sequential scan' in path.read_text()


def test_bad_chunked_bench_fields_name_themselves():
  from configs.bench import prefill_cpu  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import runner  # pylint: disable=g-import-not-at-top
  for field, value in (('chunks', (0, 4)), ('passes', ()), ('tolerance', -1.0),
                       ('tolerance_passes', 0)):
    config = prefill_cpu.get_config('runlocal')
    config.chunked[field] = value
    with pytest.raises(ValueError, match=f'^bench.chunked.{field}: got'):
      runner.validate(config)
  config = prefill_cpu.get_config('runlocal')
  config.chunked.sizes = ('x5_c12',)
  with pytest.raises(ValueError, match='not a size name'):
    runner.validate(config)
