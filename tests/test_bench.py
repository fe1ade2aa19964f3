"""The benchmark suite runs end to end on toy sizes (benchmarks are not tests: no timings are
asserted, only that every section produces its numbers and the report is written)."""

import json
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
  from ctr_jax.bench import validation  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  config.train[2]['m'] = 3
  with pytest.raises(ValueError, match=r'bench.train\[2\].m: got 3'):
    validation.validate(config)


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
  from ctr_jax.bench import validation  # pylint: disable=g-import-not-at-top
  for field, value in (('chunks', (0, 4)), ('passes', ()), ('tolerance', -1.0),
                       ('tolerance_passes', 0)):
    config = prefill_cpu.get_config('runlocal')
    config.chunked[field] = value
    with pytest.raises(ValueError, match=f'^bench.chunked.{field}: got'):
      validation.validate(config)
  config = prefill_cpu.get_config('runlocal')
  config.chunked.sizes = ('x5_c12',)
  with pytest.raises(ValueError, match='not a size name'):
    validation.validate(config)


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
  from ctr_jax.bench import validation  # pylint: disable=g-import-not-at-top
  config = peer_cpu.get_config()
  validation.validate(config)
  assert [t['label'] for t in config.train] == [config.peer.matched_label]
  assert config.sections == 'train,generate' and config.name == 'peer_cpu'
  assert config.dtype == 'float32' and config.peer.enabled


def test_bf16_bench_config_validates_and_the_peer_follows_its_dtype():
  """configs/bench/cpu_bf16.py is a valid bench config in bfloat16; with torch installed the
  peer's training step and `generate` run under bf16 autocast (its products in bfloat16)."""
  from configs.bench import cpu_bf16  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import peer, validation  # pylint: disable=g-import-not-at-top
  config = cpu_bf16.get_config()
  validation.validate(config)
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
# The GPU benchmark (launch/bench_gpu.sh, configs/bench/gpu.py): its smoke run on a CPU, the
# budget that keeps it inside one device call, the peak table, the one-line checks.
# ------------------------------------------------------------------------------------------------


def _check_gpu_json(results: dict) -> None:
  """The schema docs/benchmarks_gpu.json promises (issue 39, item 7)."""
  assert isinstance(results['device'], str) and results['device']
  assert results['precision']['compute_dtype'] == 'bfloat16'
  assert results['precision']['param_dtype'] == 'float32'
  assert results['mfu_peak_flops'] > 0 and results['mfu_peak_source']
  assert results['train'], 'no training row'
  for row in results['train']:
    assert row['model'] and 0 < row['mfu'] <= 1 and row['tokens_per_second'] > 0
  assert results['decode'], 'no decode row'
  for row in results['decode']:
    assert row['model'] and row['batch'] >= 1 and row['ms_per_token'] >= 0
  for pair in results['decode_pairs']:
    assert {'crt', 'transformer', 'batch', 'speedup', 'paper_speedup'} <= set(pair)
  for row in results['ttft']:
    assert row['model'] and row['prompt_len'] >= 1 and row['ms'] > 0
    assert row['method'] in ('scan', 'chunked', 'parallel')


@pytest.mark.slow
def test_gpu_bench_smoke_run_writes_its_json_and_section(tmp_path):
  """`bash launch/bench_gpu.sh --smoke`: every section of the GPU run at toy sizes on the CPU,
  the json and the markdown section written where BENCH_OUTPUT says."""
  out = tmp_path / 'benchmarks.md'
  result = subprocess.run(['bash', 'launch/bench_gpu.sh', '--smoke'], cwd=ROOT,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, 'BENCH_OUTPUT': str(out), 'PYTHON': sys.executable})
  assert result.returncode == 0, result.stderr[-3000:]
  results = json.loads((tmp_path / 'benchmarks_gpu.json').read_text())
  _check_gpu_json(results)
  assert results['complete'] and results['smoke'] and not results['skipped']
  methods = {(r['model'], r['method']) for r in results['ttft']}
  assert methods == {('d1_c32_h2', 'scan'), ('d1_c32_h2', 'chunked'), ('t2_c32_h2', 'parallel')}
  chunked = next(r for r in results['ttft'] if r['method'] == 'chunked')
  assert chunked['same_first_token'] is not None and chunked['passes_max'] <= 4
  text = out.read_text()
  assert text.count('<!-- bench:gpu -->') == 1 and '**Smoke run**' in text
  assert '#### Time to the first token' in text and '#### Goals' in text


def test_gpu_config_is_the_paper_setup_in_one_budget():
  from configs.bench import gpu  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import validation  # pylint: disable=g-import-not-at-top
  config = gpu.get_config()
  validation.validate(config)
  assert config.dtype == 'bfloat16' and config.sections == 'decode,train,ttft'
  assert [(t['model']['name'], t['k'], t['batch'], t['seq_len']) for t in config.train] == [
      ('d5_c1120', 5, 64, 256), ('t12_c768', 0, 64, 256), ('t6_c1088', 0, 64, 256)]
  assert [list(p) for p in config.decode.pairs] == [['d5_c1120', 't12_c768'],
                                                    ['d1_c2048', 't6_c1088']]
  assert list(config.decode.batches) == [1] and tuple(config.ttft.prompt_lens) == (512, 2048)
  sections = dict(config.budget.sections)
  assert sum(sections[s] for s in config.sections.split(',')) <= config.budget.total_s <= 420
  assert config.write_partial
  smoke = gpu.get_config('smoke')
  validation.validate(smoke)
  assert smoke.smoke and not smoke.output and smoke.budget.total_s == 0
  assert gpu.get_config('runlocal').smoke


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


def test_gpu_bench_without_a_gpu_fails_in_one_line(tmp_path):
  """On a machine whose JAX sees no GPU, launch/bench_gpu.sh stops before the bench starts:
  one line on stderr, status 3, nothing written."""
  result = subprocess.run(['bash', 'launch/bench_gpu.sh'], cwd=ROOT, capture_output=True,
                          text=True, check=False,
                          env={**os.environ, 'BENCH_OUTPUT': str(tmp_path / 'b.md'),
                               'PYTHON': sys.executable, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 3, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith('bench_gpu.sh: JAX ')
  assert 'sees no GPU' in result.stderr and 'Traceback' not in result.stderr
  assert not list(tmp_path.iterdir())


def test_budget_cuts_are_notes_and_partial_results_are_written(tmp_path):
  """A section whose budget is spent skips its items with notes (no compilation for them); with
  `write_partial` every row and section end writes the json and the section."""
  from configs.bench import gpu  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import report, runner  # pylint: disable=g-import-not-at-top
  config = gpu.get_config('smoke')
  config.sections = 'ttft'
  config.budget.sections.ttft = 1e-3
  path = tmp_path / 'benchmarks_gpu.json'
  writes = []

  def progress(partial):
    writes.append(partial['complete'])
    report.write_json(str(path), partial)

  results = runner.run(config, log=lambda *_: None, progress=progress)
  assert results['ttft'] == [] and len(results['skipped']) == 3
  assert all('skipped, estimated' in note and "ttft section's 0 s budget" in note
             for note in results['skipped'])
  assert results['budget']['ttft']['skipped'] == 3 and writes == [False]
  assert json.loads(path.read_text())['skipped'] == results['skipped']
  text = report.markdown(results)
  assert '#### Skipped' in text and '| ttft | 0.001 |' in text


def test_training_rows_fall_back_to_remat_for_memory(monkeypatch):
  """Over the device's memory by XLA's estimate, or out of memory when run: the row is timed with
  remat=True and says so; out of memory with remat too: skipped with a note."""
  from configs.bench import gpu  # pylint: disable=g-import-not-at-top
  from ctr_jax.bench import report, runner, suite  # pylint: disable=g-import-not-at-top
  built = []

  def fake_runner(fields, *, remat, **shape):
    built.append(remat)
    run = lambda: 0.0
    run.memory = {'needed_bytes': 1 if remat else 10, 'temp_bytes': 2 ** 30}
    run.compile_seconds = 0.5
    run.params = lambda: {}
    return run, suite.model_config(fields), shape['k_unroll']

  failures = []

  def fake_throughput(fields, *, runner, **kw):
    if failures and failures.pop(0):
      raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate')
    return {'step_ms': 1.0, 'tokens_per_second': 100.0, 'flops_per_token': 1e3, 'params': 7}

  monkeypatch.setattr(suite, 'train_step_runner', fake_runner)
  monkeypatch.setattr(suite, 'train_throughput', fake_throughput)
  config = gpu.get_config('smoke')
  config.sections = 'train'
  monkeypatch.setattr(suite, 'device_memory_limit', lambda: 5)  # over by the estimate
  results = runner.run(config, log=lambda *_: None)
  assert built == [False, True] and results['train'][0]['remat'] is True
  assert 'without rematerialisation' in results['notes'][0]
  assert '| d1_c32_h2 (remat) |' in report.markdown(results)
  monkeypatch.setattr(suite, 'device_memory_limit', lambda: None)  # fails when run
  built.clear()
  failures[:] = [True]
  results = runner.run(config, log=lambda *_: None)
  assert built == [False, True] and results['train'][0]['remat'] is True
  built.clear()
  failures[:] = [True, True]  # and again with remat: skipped
  results = runner.run(config, log=lambda *_: None)
  assert results['train'] == [] and results['skipped'] == ['train d1_c32_h2: out of memory']
  with pytest.raises(ValueError, match='not memory'):
    monkeypatch.setattr(suite, 'train_throughput',
                        lambda *a, **kw: (_ for _ in ()).throw(ValueError('not memory')))
    runner.run(config, log=lambda *_: None)


def test_gpu_report_puts_the_ratios_beside_the_papers():
  from ctr_jax.bench import report  # pylint: disable=g-import-not-at-top
  results = {
      'name': 'gpu', 'machine_line': 'x', 'command': 'c', 'date': 'd', 'repeats': 5, 'warmup': 2,
      'peak_flops': 7e14, 'peak_dtype': 'bfloat16', 'peak_size': 8192, 'bandwidth': 3e12,
      'device': 'NVIDIA H100 80GB HBM3', 'mfu_peak_flops': 989e12, 'complete': False,
      'mfu_peak_source': 'data sheet, NVIDIA H100 80GB HBM3, bfloat16 dense',
      'precision': {'note': 'bf16'}, 'goals': {'mfu': 0.45, 'mfu_model': 'd5_c1120',
                                               'decode_vs_paper': ['d5_c1120']},
      'train': [{'label': 'd5_c1120', 'model': 'd5_c1120', 'k': 5, 'm': 0, 'seq_len': 256,
                 'batch': 64, 'params': 1, 'step_ms': 1.0, 'tokens_per_second': 1.0, 'mfu': 0.5,
                 'compile_s': 30.0, 'temp_gib': 30.0}],
      'decode': [{'label': name, 'model': name, 'batch': 1, 'params': 1, 'ms_per_token': ms,
                  'roofline_ms': 0.1, 'paper_ms': None} for name, ms in (('d5_c1120', 2.0),
                                                                         ('t12_c768', 3.0))],
      'decode_pairs': [{'crt': 'd5_c1120', 'transformer': 't12_c768', 'batch': 1,
                                      'speedup': 1.5, 'paper_speedup': 4.96 / 2.86}],
      'ttft': [{'model': 'd5_c1120', 'kind': 'context_ready', 'prompt_len': 512,
                'method': 'scan', 'ms': 100.0, 'sequential_passes': 512},
               {'model': 'd5_c1120', 'kind': 'context_ready', 'prompt_len': 512,
                'method': 'chunked', 'ms': 25.0, 'sequential_passes': 12, 'chunk': 256,
                'max_passes': 16, 'tolerance': 1e-4, 'passes_mean': 6.0, 'passes_max': 6,
                'max_abs_last_logit_diff': 1e-3, 'same_first_token': True}]}
  text = report.markdown(results)
  assert '**Partial**' in text and 'MFU is against 989 TFLOP/s (data sheet' in text
  assert '| d5_c1120 | t12_c768 | 1 | 1.50× | 1.73× |' in text
  assert ("- d5_c1120 vs t12_c768 decode, B = 1, against the paper's A100 figure: **not met** "
          '(1.50× against ≥ 1.73×' in text)
  assert '- Training MFU of d5_c1120 ≥ 45%: **met** (50.0%).' in text
  assert '| d5_c1120 | 512 | chunked fixed point (chunk 256, ≤ 16 passes, tol 0.0001; used 6 / 6)' \
         ' | 25 | 12 | 4.00× | 1.00e-03 | yes |' in text
  assert 'd5_c1120 30 s (30.0 GiB of temporaries)' in text
