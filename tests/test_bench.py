"""The benchmark suite runs end to end on toy sizes (benchmarks are not tests: no timings are
asserted, only that every section produces its numbers and the report is written)."""

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_peer_comparisons_are_paired_and_judged(monkeypatch):
  """With a (fake) peer installed, the training and `generate` comparisons come from rounds that
  run both sides in turn, and the report prints one verdict per goal."""
  from configs.bench import tiny  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import peer, report, runner  # pylint: disable=g-import-not-at-top
  from ctr_jax.reporting import timing  # pylint: disable=g-import-not-at-top
  calls = []

  # The fakes take measurable time, so no ratio is a division by a timer's zero.
  def fake_step():
    calls.append('peer_step')
    time.sleep(1e-3)

  def fake_generate_runner(**kw):
    assert kw['batch'] == 1 and kw['prompt_len'] == 4
    return lambda n: calls.append(('peer_generate', n)) or time.sleep(1e-4 * n)

  monkeypatch.setattr(peer, 'available', lambda: '')
  monkeypatch.setattr(peer, 'label', lambda dtype='float32': 'fake peer')
  monkeypatch.setattr(peer, 'train_step_fn', lambda **kw: fake_step)
  monkeypatch.setattr(peer, 'generate_runner', fake_generate_runner)
  from ctr_jax.bench import suite  # pylint: disable=g-import-not-at-top
  built = []
  real_runner = suite.train_step_runner
  monkeypatch.setattr(suite, 'train_step_runner',
                      lambda *a, **kw: built.append(kw) or real_runner(*a, **kw))
  config = tiny.get_config()
  config.sections = 'train,generate'
  config.train = config.train[:1]
  config.peer.enabled = True
  config.peer.rounds = 3
  results = runner.run(config, log=lambda *_: None)
  assert len(built) == 1  # the paired rounds reuse the row's compiled step
  ours, theirs = results['train']
  assert theirs['label'] == 'fake peer' and theirs['rounds'] == 3
  assert ours['vs_peer'] > 0 and ours['paired_step_ms'] > 0
  # warm-up + 3 rounds, one peer step each
  assert calls.count('peer_step') == config.warmup + 3
  [generate] = results['generate']
  assert generate['vs_peer_whole'] > 0 and generate['rounds'] == 3
  assert calls.count(('peer_generate', 4)) == calls.count(('peer_generate', 1)) == 4
  text = report.markdown(results)
  assert "- Training at the peer's shape: **" in text
  assert '- `generate`, whole calls, B = 1: **' in text
  assert timing.median_ratio([2.0, 3.0, 9.0], [1.0, 1.0, 1.0]) == 3.0


def test_interleaved_rounds_rotate_the_order():
  from ctr_jax.reporting import timing  # pylint: disable=g-import-not-at-top
  calls = []
  fns = {name: (lambda name=name: calls.append(name)) for name in 'abc'}
  times = timing.interleaved_seconds(fns, warmup=1, repeats=3)
  assert calls[3:] == list('abc' 'bca' 'cab')
  assert all(len(t) == 3 for t in times.values())


def test_verdict_lines_say_met_or_by_how_much_not():
  from ctr_jax.bench import report  # pylint: disable=g-import-not-at-top
  results = {'goals': {'train_vs_peer': 1.05, 'chunked_vs_scan': 3.0, 'chunked_size': 'd5'},
             'train': [{'label': 't6', 'vs_peer': 0.84}],
             'chunked': [{'label': 'd5', 'weights': 'random', 'prompt_len': 16, 'rows': [
                 {'speedup': 3.3, 'exact_bound': True, 'tolerance': 0.0, 'chunk': 8,
                  'passes': 8, 'max_abs_logit_diff': 1e-6},
                 # One chunk over the whole prompt is the parallel prefill: never the verdict.
                 {'speedup': 9.0, 'exact_bound': True, 'tolerance': 0.0, 'chunk': 16,
                  'passes': 16, 'max_abs_logit_diff': 1e-6}]}]}
  lines = report.verdicts(results)
  assert "- Training at the peer's shape: **not met** (0.84× against ≥ 1.05×, 20% short)." in lines
  assert ('- Chunked prefill, d5 (random weights), fastest row within max |Δlogit| 0.001 of the '
          'scan, chunks shorter than the prompt: **met** (3.30× against ≥ 3×) (chunk 8, 8 '
          'passes, max |Δlogit| 1.0e-06).' in lines)
  for row in results['chunked'][0]['rows']:
    row['max_abs_logit_diff'] = 0.5
  assert any(line.endswith('**not measured** (no row within max |Δlogit| 0.001).') or
             'not measured (no row within max |Δlogit| 0.001)' in line
             for line in report.verdicts(results))


@pytest.mark.slow
def test_results_record_the_command_with_its_overrides(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'b.md'
  subprocess.run([sys.executable, '-m', 'ctr_jax.bench', '--config=configs/bench/tiny.py',
                  '--config.sections=prefill', '--config.prefill.prompt_len=6', f'--output={out}'],
                 cwd=ROOT, capture_output=True, text=True, check=True)
  command = json.loads((tmp_path / 'b_tiny.json').read_text())['command']
  assert command == ('python -m ctr_jax.bench --config=configs/bench/tiny.py '
                     f'--config.sections=prefill --config.prefill.prompt_len=6 --output={out}')
  assert f'Command: `{command}`' in out.read_text()


def test_training_profile_puts_the_step_in_its_categories():
  """ctr_jax.projects.perf.profile_training's JAX side on a toy model: the forward and backward dense
  products, the attention products and the optimizer each get time; almost nothing is 'other'."""
  from ctr_jax.bench import configs as base  # pylint: disable=g-import-not-at-top
  from ctr_jax.projects.perf import profile_training
  fields = base.peer_shape(width=32, depth=2, num_heads=2, vocab_size=64)
  wall_ms, totals, ops = profile_training.profile_jax(fields, seq_len=16, batch=2, steps=2)
  assert wall_ms > 0 and ops
  for category in ('dense matmuls, forward', 'dense matmuls, backward', 'attention matmuls',
                   'optimizer (AdamW, clipping, norms)', 'LayerNorm'):
    assert totals[category] > 0, category
  assert set(totals) <= set(profile_training.CATEGORIES)
  assert totals['other'] <= 0.05 * sum(totals.values())


def test_truncated_backpropagation_counts_only_its_backward_flops():
  from ctr_jax.bench import suite  # pylint: disable=g-import-not-at-top
  spec = suite.model_config({'kind': 'context_ready', 'depth': 2, 'width': 64, 'num_heads': 2,
                             'vocab_size': 128, 'max_len': 64})
  full = suite.training_flops_per_token(spec, 32, 4)
  assert suite.training_flops_per_token(spec, 32, 4, grad_iterations=4) == full
  head = 3 * 2 * 128 * 64
  one = suite.training_flops_per_token(spec, 32, 4, grad_iterations=1)
  assert abs((one - head) / (full - head) - (4 + 2) / (3 * 4)) < 1e-12


def test_peer_bench_config_holds_the_peer_shape_row_and_its_goals():
  """configs/bench/peer_cpu.py (issue 20's goals alone) validates, times only the peer-shape
  row beside the peer, and writes its own section."""
  from configs.bench import peer_cpu  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import runner  # pylint: disable=g-import-not-at-top
  config = peer_cpu.get_config()
  runner.validate(config)
  assert [t['label'] for t in config.train] == [config.peer.matched_label]
  assert config.sections == 'train,generate' and config.name == 'peer_cpu'
  assert config.dtype == 'float32' and config.peer.enabled


def test_bf16_bench_config_validates_and_the_peer_follows_its_dtype():
  """configs/bench/cpu_bf16.py is a valid bench config in bfloat16; with torch installed the
  peer's training step and `generate` run under bf16 autocast (its products in bfloat16)."""
  from configs.bench import cpu_bf16  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import peer, runner  # pylint: disable=g-import-not-at-top
  config = cpu_bf16.get_config()
  runner.validate(config)
  assert config.dtype == 'bfloat16' and config.peer.matched_label in {
      t['label'] for t in config.train}
  assert cpu_bf16.get_config('runlocal').dtype == 'bfloat16'
  torch = pytest.importorskip('torch')
  pytest.importorskip('transformers')
  shape = {'width': 32, 'depth': 1, 'heads': 2, 'vocab': 64}
  seen = []
  step = peer.train_step_fn(**shape, seq_len=8, batch=2, dtype='bfloat16')
  with pytest.raises(ValueError, match='allowed'):
    peer.train_step_fn(**shape, seq_len=8, batch=2, dtype='float16')()
  handle = torch.nn.modules.module.register_module_forward_hook(
      lambda module, args, out: seen.append(out.dtype) if torch.is_tensor(out) else None)
  try:
    step()
    peer.generate_runner(**shape, batch=1, prompt_len=4, max_len=8, dtype='bfloat16')(2)
  finally:
    handle.remove()
  assert torch.bfloat16 in seen
  assert 'bf16 autocast' in peer.label('bfloat16') and 'bf16' not in peer.label()


def test_the_ledger_and_the_bench_name_the_cpu_alike():
  """`ctr_jax.projects.reproduce.lib.host()` (no JAX) and `machine.describe()` read one helper."""
  from ctr_jax.projects.reproduce import lib as repro_lib
  from ctr_jax.reporting import cpu_name, machine  # pylint: disable=g-import-not-at-top
  name = cpu_name.cpu_name()
  assert name and machine.describe()['cpu'] == name
  gpus = cpu_name.gpu_names()
  assert repro_lib.host() == f'{name}, {os.cpu_count()} logical cores' + (
      f', {gpus}' if gpus else '')


def test_the_ledger_names_the_gpus_from_nvidia_smi(tmp_path, monkeypatch):
  """A GPU machine's ledger line says which GPUs (from the driver's tool, not from JAX); a
  machine without nvidia-smi, or whose nvidia-smi fails, names none."""
  from ctr_jax.reporting import cpu_name  # pylint: disable=g-import-not-at-top
  fake = tmp_path / 'nvidia-smi'
  fake.write_text('#!/bin/sh\nprintf "NVIDIA H200\\nNVIDIA H200\\n"\n')
  fake.chmod(0o755)
  monkeypatch.setenv('PATH', f'{tmp_path}{os.pathsep}{os.environ["PATH"]}')
  assert cpu_name.gpu_names() == '2 x NVIDIA H200'
  fake.write_text('#!/bin/sh\nexit 9\n')
  assert cpu_name.gpu_names() == ''
  monkeypatch.setenv('PATH', str(tmp_path / 'empty'))
  assert cpu_name.gpu_names() == ''


# ------------------------------------------------------------------------------------------------
# The GPU benchmark's parts: the budget that keeps it inside one device call, the peak table,
# the one-line check of what a machine lacks.
# ------------------------------------------------------------------------------------------------


def test_budget_skips_what_would_overrun_and_learns_from_what_ran():
  from ctr_jax.bench import budget  # pylint: disable=g-import-not-at-top
  now = [0.0]
  b = budget.Budget({'ttft': 10.0}, total=100.0, clock=lambda: now[0])
  s = b.section('ttft')
  assert s.admit('a', 'scan', 4.0) == ''
  now[0] += 8.0  # the item took twice its estimate ...
  s.done('scan', 4.0, 8.0)
  note = s.admit('b', 'scan', 4.0)  # ... so the next one is estimated at 8 s, with 2 s left
  assert note == "b: skipped, estimated 8 s with 2 s left of the ttft section's 10 s budget"
  assert s.admit('c', 'chunked', 1.0) == ''  # another kind: the section's ratio, 2 s
  assert b.report['ttft']['skipped'] == 1 and b.report['ttft']['used_s'] == 8.0
  # The run's total binds before a section's own budget: the note says so.
  late = b.section('train')  # no budget of its own
  now[0] = 99.0
  assert 'of the run\'s 100 s budget' in late.admit('d', 'train', 5.0)
  unlimited = budget.Budget({}, clock=lambda: now[0]).section('decode')
  assert unlimited.admit('e', 'decode', 1e9) == ''


def test_device_peaks_are_the_data_sheets_bf16_dense_figures():
  from ctr_jax.bench import devices  # pylint: disable=g-import-not-at-top
  peaks = {'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA H100 PCIe': 756e12, 'NVIDIA H100 NVL': 835e12,
           'NVIDIA H200': 989e12, 'NVIDIA H200 NVL': 835e12, 'NVIDIA A100-SXM4-40GB': 312e12,
           'NVIDIA A100 80GB PCIe': 312e12, 'NVIDIA L4': 121e12, 'NVIDIA L40S': 362e12,
           'NVIDIA A10': 125e12, 'cpu': None, 'Tesla V100-SXM2-16GB': None}
  for kind, peak in peaks.items():
    assert devices.peak_flops(kind, 'bfloat16') == peak, kind
  assert devices.peak_flops('NVIDIA H100 80GB HBM3', 'float32') is None
  assert devices.device_name().endswith('(cpu)')


def test_preflight_names_every_missing_package_in_one_line():
  from ctr_jax.bench import preflight  # pylint: disable=g-import-not-at-top
  needs = {'numpy': 'numpy', 'not_a_module_zz': 'zz-pkg', 'not_a_package_yy.sub': 'yy-pkg'}
  line = preflight.problem(gpu=False, needs=needs)
  assert line.startswith('bench_gpu.sh: missing Python packages: zz-pkg, yy-pkg (')
  assert '\n' not in line
  assert preflight.missing() == []  # this environment has everything the bench imports
