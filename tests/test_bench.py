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
