"""ctr_jax.projects.reproduce end to end at the tiny scale (seconds per run), and its statistics."""

import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce import registry as repro_registry
from ctr_jax.projects.reproduce import studies as repro_studies
from ctr_jax.projects.reproduce import table1 as repro_table1
from ctr_jax.projects.reproduce.lib import Run


def _record(group, seed, ppl):
  return {'group': group, 'seed': seed, 'final': {'val_ppl': ppl}}


def test_compare_is_paired_by_seed_with_a_95_percent_t_interval():
  a = [_record('a', s, p) for s, p in enumerate([10.0, 11.0, 12.0])]
  b = [_record('b', s, p) for s, p in enumerate([11.0, 12.1, 12.9])]  # deltas -1, -1.1, -0.9
  c = repro_lib.compare(a, b, repro_lib.final_ppl)
  assert c['verdict'] == 'holds' and c['n'] == 3
  assert c['delta_mean'] == pytest.approx(-1.0) and c['delta_std'] == pytest.approx(0.1)
  # t(0.975, 2 dof) = 4.3027: half-width 4.3027 x 0.1 / sqrt(3) = 0.2484.
  assert c['ci'] == pytest.approx((-1.2484, -0.7516), abs=1e-4)
  assert repro_lib.ci_text(c) == '-1.00 [-1.25, -0.75] (95% CI, 3 seeds)'
  assert repro_lib.compare(b, a, repro_lib.final_ppl)['verdict'] == 'does not hold'
  noisy = [_record('b', s, p) for s, p in enumerate([12.0, 10.5, 13.0])]  # deltas -2, .5, -1
  assert repro_lib.compare(a, noisy, repro_lib.final_ppl)['verdict'] == 'inconclusive'
  # Two sigma is not enough with 3 seeds: mean -1, std 0.45 (|mean| > 2 std, yet t = 3.85 < 4.30).
  wide = [_record('b', s, p) for s, p in enumerate([11.45, 12.0, 12.55])]  # -1.45, -1, -.55
  c = repro_lib.compare(a, wide, repro_lib.final_ppl)
  assert abs(c['delta_mean']) > 2 * c['delta_std'] and c['verdict'] == 'inconclusive'
  assert repro_lib.compare(a[:1], b[:1], repro_lib.final_ppl)['verdict'] == 'inconclusive'
  assert repro_lib.ci_text(repro_lib.compare(a[:1], b[:1], repro_lib.final_ppl)) == (
      '-1.00 (one seed)')
  assert math.isnan(repro_lib.mean_std([3.0])[1])


def test_a_matches_claim_needs_the_interval_inside_the_margin():
  base = [_record('b', s, p) for s, p in enumerate([30.0, 31.0, 32.0])]  # margin +-0.31
  close = [_record('a', s, p) for s, p in enumerate([30.05, 31.02, 32.04])]
  assert repro_lib.compare(close, base, repro_lib.final_ppl)['equivalence'] == 'matches'
  # No measurable difference, but too noisy to say "the same": inconclusive, not "matches".
  noisy = [_record('a', s, p) for s, p in enumerate([29.5, 31.6, 32.0])]
  c = repro_lib.compare(noisy, base, repro_lib.final_ppl)
  assert c['verdict'] == 'inconclusive' and c['equivalence'] == 'inconclusive'
  far = [_record('a', s, p) for s, p in enumerate([31.0, 32.1, 32.9])]
  assert repro_lib.compare(far, base, repro_lib.final_ppl)['equivalence'] == 'differs'
  assert repro_lib.compare(close[:1], base[:1], repro_lib.final_ppl)['equivalence'] == (
      'inconclusive')
  assert repro_lib.compare(close, base, repro_lib.final_ppl, margin=0.0)['equivalence'] != (
      'matches')


def test_table1_models_are_flop_matched_at_the_cpu_scale():
  models = repro_table1.table1_models(repro_studies.SCALES['cpu'])
  assert [lv.name for lv in repro_studies.SCALES['cpu'].levels] == ['~0.25M', '~1M', '~4M']
  for level in ('~0.25M', '~1M', '~4M'):
    assert {(m['kind'], m['depth']) for m in models if m['level'] == level} == (
        {('context_ready', d) for d in (1, 2, 3)} | {('transformer', n) for n in (1, 2, 3, 4, 6)})
  assert all(m['matched'] and abs(m['ratio'] - 1) <= 0.03 for m in models)
  # ~0.25M's models have 2 heads (a width step of 4), the other levels' 4.
  assert {m['heads'] for m in models if m['level'] == '~0.25M'} == {2}
  assert {m['heads'] for m in models if m['level'] != '~0.25M'} == {4}
  small = [m for m in models if m['level'] == '~0.25M']
  assert all(m['width'] % 4 == 0 for m in small)


def test_table1_training_compute_matched_rows_at_1m():
  rows = {r['group']: r for r in repro_table1.table1_rows(repro_studies.SCALES['cpu'])}
  crt = rows['~1M D=1 C=176']
  assert crt['training_flops_per_token'] == 16_118_784  # tests/test_flop_match.py, by hand
  assert crt['training_flop_ratio'] == 1 and (crt['k_unroll'], crt['k_min']) == (5, 2)
  assert rows['~1M N=2 C=160']['training_flops_per_token'] == 6_144_000
  wide = rows['~1M N=2 C=288 train-matched']
  assert wide['matching'] == 'training FLOPs/token' and wide['matched']
  assert abs(wide['training_flop_ratio'] - 1) <= 0.03
  assert wide['arg'] == 'steps=1200,batch=16,seq_len=128,vocab=2048,size=t2_c288_h4'
  steps = round(1200 * 16_118_784 / 6_144_000)  # 3148
  long = rows[f'~1M N=2 C=160 {steps} steps']
  assert long['arg'] == f'steps={steps},batch=16,seq_len=128,vocab=2048,size=t2_c160_h4'
  assert long['training_flops_total_ratio'] == pytest.approx(1, abs=1e-3) and long['matched']
  truncated = rows['~1M D=1 C=176 m=2']
  assert truncated['arg'].endswith('size=d1_c176_h4,grad_iterations=2')
  assert truncated['training_flops_per_token'] == 12_131_328 and truncated['grad_iterations'] == 2
  # Every level has its three training-compute-matched rows, each within 3% of its D = 1 CRT.
  for level in ('~0.25M', '~1M', '~4M'):
    matched = [r for r in rows.values() if r['level'] == level
               and r['matching'] not in ('inference', 'longer training')]
    assert sorted(r['matching'] for r in matched) == [
        'total training FLOPs', 'training FLOPs/token', 'truncated gradients']
    assert all(r['matched'] for r in matched), level
  # Every table1 table has the training-FLOP columns, "not run yet" rows included.
  lines, _ = repro_table1.table1_report([], repro_studies.SCALES['cpu'], '')
  text = '\n'.join(lines)
  assert text.count('training FLOPs/token (x D=1) | training FLOPs, total (x D=1)') == 3
  assert '| ~1M N=2 C=288 train-matched | transformer, training FLOPs/token matched |' in text
  assert f'({steps:,} steps)' in text and '16,118,784 (1.00x) | 3.96e13 (1.00x)' in text
  # Epochs from the record's corpus size: 3,148 x 16 sequences over 1,000 windows.
  record = {**_committed(Run('table1', long['group'], 0, long['arg']), 'c'), 'steps': steps,
            'config': {'batch_size': 16, 'total_steps': steps}, 'train_windows': 1000,
            'num_params': 1}
  lines, _ = repro_table1.table1_report([record], repro_studies.SCALES['cpu'], '')
  text = '\n'.join(lines)
  assert f'({steps:,} steps, 50.4 epochs)' in text and '50.37 epochs' in text


def test_table1_longer_training_rows_and_the_three_sentences():
  scale = repro_studies.SCALES['cpu']
  rows = {r['group']: r for r in repro_table1.table1_rows(scale)}
  longer = [g for g, r in rows.items() if r['matching'] == 'longer training']
  assert longer == ['~1M D=1 C=176 3600 steps', '~1M N=2 C=160 3600 steps']
  assert rows[longer[0]]['arg'].startswith('steps=3600,') and rows[longer[0]]['matched']
  assert rows[longer[1]]['training_flops_total_ratio'] == pytest.approx(
      3 * rows['~1M N=2 C=160']['training_flops_total_ratio'])
  empty = repro_table1.three_sentences(repro_table1.gap_summary([], scale))
  assert len(empty) == 3 and all('not run yet' in s or 'not measured' in s for s in empty)

  def runs(group, ppls):
    return [{'group': group, 'seed': s, 'final': {'val_ppl': p}, 'evals': []}
            for s, p in enumerate(ppls)]
  records = (runs('~1M D=1 C=176', [31.0, 31.2, 30.9]) + runs('~1M N=2 C=160', [35.7, 35.9, 35.5])
             + runs('~1M N=1 C=208', [39.0, 39.2, 39.3])
             + runs('~1M N=2 C=288 train-matched', [33.0, 33.1, 32.8]))
  gaps = repro_table1.gap_summary(records, scale)
  assert set(gaps) == {'~1M'} and gaps['~1M']['inference']['baseline'] == '~1M N=2 C=160'
  assert gaps['~1M']['inference']['delta_mean'] == pytest.approx(-4.6667, abs=1e-4)
  first, second, third = repro_table1.three_sentences(gaps)
  # Two of the level's five inference-matched transformers have runs: the text says so.
  assert ('vs ~1M N=2 C=160 (the best of the 2 of 5 transformers run so far): ΔPPL -4.67 ['
          in first and first.endswith('lower).'))
  assert 'vs ~1M N=2 C=288 train-matched: ΔPPL -1.93 [' in second
  assert "one level only: ~1M -4.67 PPL (-13.1% of the baseline's, 2 of 5 transformers run);" in third
  assert third.endswith('not run yet.')
  # 3x the steps: per seed the gap goes from (-4.7, -4.7, -4.6) to (-1.5, -1.7, -1.4).
  long = (runs('~1M D=1 C=176 3600 steps', [22.0, 21.9, 22.0])
          + runs('~1M N=2 C=160 3600 steps', [23.5, 23.6, 23.4]))
  third = repro_table1.three_sentences(repro_table1.gap_summary(records + long, scale))[2]
  assert ("after 3x the steps it is ~1M: ~1M D=1 C=176 3600 steps vs ~1M N=2 C=160 3600 steps: "
          "ΔPPL -1.53 [") in third
  assert "(-6.5% of the baseline's), against -4.67 (-13.1%) before: a change of +3.13 [" in third
  assert third.endswith('it narrows.')
  # The same pair widening: the CRT's lead grows to (-6.7, -6.9, -6.4).
  wide = (runs('~1M D=1 C=176 3600 steps', [16.8, 16.7, 17.0])
          + runs('~1M N=2 C=160 3600 steps', [23.5, 23.6, 23.4]))
  third = repro_table1.three_sentences(repro_table1.gap_summary(records + wide, scale))[2]
  assert 'a change of -2.00 [-2.50, -1.50]' in third and third.endswith('it widens.')


def test_the_committed_table1_records_still_match_their_runs():
  """New groups must not change the commands of the groups already run (their records are kept
  by committed_record only while the command is the same)."""
  docs = os.path.join(ROOT, 'docs')
  committed = repro_lib.committed_records('table1', docs)
  runs = {r.name: r for r in repro_table1.table1_runs(repro_studies.SCALES['cpu'], 3)}
  root = os.path.join(ROOT, 'workdirs', 'repro')
  assert committed and set(committed) <= set(runs)
  for name, record in committed.items():
    kept = repro_lib.committed_record(runs[name], root, (), committed)
    assert kept is not None, name
    assert kept['training_flops_per_token'] > 0 and kept['final'] == record['final']


def test_replace_section_keeps_the_rest(tmp_path):
  docs = str(tmp_path)
  repro_lib.replace_section('a', 'first', docs)
  repro_lib.replace_section('b', 'second', docs)
  repro_lib.replace_section('a', 'third', docs)
  text = open(os.path.join(docs, 'reproduction.md')).read()
  assert 'first' not in text and text.index('third') < text.index('second')


@pytest.mark.slow
def test_k_min_study_runs_resumes_and_reports(data_dir, tmp_path, monkeypatch):
  # The runs are subprocesses: one CPU device as a user's (the tests' 8 fake devices would not
  # divide the tiny batch).
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  root, docs = str(tmp_path / 'runs'), str(tmp_path / 'docs')
  extra = (f'--config.data.data_dir={data_dir}',)
  scale = repro_studies.SCALES['tiny']
  report = repro_registry.run_study('k_min', scale, 2, root, docs, extra)
  assert '**Verdict:**' in report and '6/6 runs finished' in report
  with open(os.path.join(docs, 'reproduction', 'k_min.json')) as f:
    results = json.load(f)
  runs = results['runs']
  assert len(runs) == 6 and {r['seed'] for r in runs} == {0, 1}
  for r in runs:
    assert r['steps'] == scale.steps and r['tokens'] == scale.steps * scale.batch * scale.seq_len
    assert r['command'].startswith('python -m ctr_jax.main --config=configs/repro.py:')
    assert data_dir in r['command'] and len(r['invocations']) == 1
    assert r['evals'] and 'val_ppl_sequential' in r['final']
  # A second call trains nothing (every run finished) and regenerates the same section.
  again = repro_registry.run_study('k_min', scale, 2, root, docs, extra)
  assert again == report
  with open(os.path.join(root, 'k_min', runs[0]['name'], 'invocations.jsonl')) as f:
    assert len(f.readlines()) == 1


def test_table1_longer_training_figure_only_once_its_runs_exist(tmp_path):
  scale = repro_studies.SCALES['cpu']
  rows = {r['group']: r for r in repro_table1.table1_rows(scale)}
  longer = [g for g, r in rows.items() if r['matching'] == 'longer training']
  assert [rows[g]['shorter'] for g in longer] == ['~1M D=1 C=176', '~1M N=2 C=160']

  def records(groups):
    return [{**_committed(Run('table1', g, s, rows[g]['arg']), 'c', ppl=30.0 + s + k),
             'num_params': 1, 'evals': [{'step': t, 'val_loss': math.log(60.0 - t / 100 + k)}
                                        for t in (200, 400)]}
            for k, g in enumerate(groups) for s in range(2)]
  figure = str(tmp_path / 'table1.png')
  lines, _ = repro_table1.table1_report(records(['~1M D=1 C=176', '~1M N=2 C=160']), scale,
                                        figure)
  assert not os.path.exists(str(tmp_path / 'table1_longer.png'))
  assert not any('longer training' in line for line in lines if line.startswith('!['))
  lines, _ = repro_table1.table1_report(records(['~1M D=1 C=176', '~1M N=2 C=160', *longer]),
                                        scale, figure)
  assert os.path.getsize(str(tmp_path / 'table1_longer.png')) > 0
  assert '![table1 longer training](reproduction/table1_longer.png)' in lines


def _committed(run, command, ppl=30.0):
  """A finished run's record as docs/reproduction/NAME.json holds it (the fields reports read)."""
  return {'study': run.study, 'group': run.group, 'seed': run.seed, 'name': run.name,
          'command': command, 'invocations': [{'command': command, 'exit_code': 0}],
          'config': {'total_steps': 4}, 'steps': 4, 'tokens': 128, 'flops_per_token': 1,
          'wall_time_seconds': 1.0, 'final': {'val_ppl': ppl, 'val_ppl_sequential': ppl},
          'evals': [{'step': 4, 'val_loss': math.log(ppl)}]}


def test_a_committed_record_counts_as_finished_without_its_workdir(tmp_path, monkeypatch):
  """Workdirs do not outlive a session, docs/reproduction/NAME.json does: a run it holds with the
  same command (another workdir root aside) is kept and not retrained; one whose command
  differs is retrained."""
  scale = repro_studies.SCALES['tiny']
  root, docs = str(tmp_path / 'runs'), str(tmp_path / 'docs')
  extra = ('--config.data.data_dir=/data',)
  runs = {r.group: r for r in repro_studies.k_min_runs(scale, 1)}
  same = runs['K=2 fixed']
  kept = _committed(same, ' '.join(same.command(str(tmp_path / 'old_root'), extra)))
  changed = runs['K=5 fixed']
  stale = _committed(changed, ' '.join(changed.command(root, extra) + ['--config.optim.lr=0.5']))
  os.makedirs(os.path.join(docs, 'reproduction'))
  with open(os.path.join(docs, 'reproduction', 'k_min.json'), 'w') as f:
    json.dump({'study': 'k_min', 'runs': [kept, stale], 'machine': 'the old machine'}, f)
  launched = []
  monkeypatch.setattr(repro_lib, 'execute_logged',
                      lambda command, workdir: launched.append(workdir) or 1)
  report = repro_registry.run_study('k_min', scale, 1, root, docs, extra)
  assert sorted(launched) == sorted([runs['K=5 k_min=2'].workdir(root), changed.workdir(root)])
  with open(os.path.join(docs, 'reproduction', 'k_min.json')) as f:
    results = json.load(f)
  # Its ledger does not name a machine: the old json's machine field goes with it; and it
  # carries today's command for the run.
  assert results['runs'] == [{**kept, 'machine': 'the old machine',
                              'rerun': ' '.join(same.command(root))}]
  assert results['rerun'] == 'python -m ctr_jax.projects.reproduce --study=k_min --seeds=1'
  assert results['machine'] != 'the old machine' and 'the old machine (1 run)' in report
  assert '1/3 runs finished' in report and '| K=2 fixed | 30.00 |' in report


def test_fewer_seeds_train_less_and_keep_the_committed_seeds(tmp_path, monkeypatch):
  """`--seeds=1` after a 2-seed study: only seed 0 may train, and the json keeps seed 1."""
  scale = repro_studies.SCALES['tiny']
  root, docs = str(tmp_path / 'runs'), str(tmp_path / 'docs')
  extra = ('--config.data.data_dir=/data',)
  two = {(r.group, r.seed): r for r in repro_studies.k_min_runs(scale, 2)}
  second = two[('K=2 fixed', 1)]
  kept = _committed(second, ' '.join(second.command(root, extra)))
  os.makedirs(os.path.join(docs, 'reproduction'))
  with open(os.path.join(docs, 'reproduction', 'k_min.json'), 'w') as f:
    json.dump({'study': 'k_min', 'runs': [kept], 'machine': 'm'}, f)
  launched = []
  monkeypatch.setattr(repro_lib, 'execute_logged',
                      lambda command, workdir: launched.append(workdir) or 1)
  report = repro_registry.run_study('k_min', scale, 1, root, docs, extra)
  assert sorted(launched) == sorted(r.workdir(root) for (_, s), r in two.items() if s == 0)
  with open(os.path.join(docs, 'reproduction', 'k_min.json')) as f:
    results = json.load(f)
  assert [r['name'] for r in results['runs']] == [second.name]
  assert results['rerun'] == 'python -m ctr_jax.projects.reproduce --study=k_min --seeds=2'
  assert '1/6 runs finished' in report


@pytest.mark.slow
def test_a_finished_run_survives_a_rerun_without_its_workdir(data_dir, tmp_path, monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  root, docs = str(tmp_path / 'runs'), str(tmp_path / 'docs')
  extra = (f'--config.data.data_dir={data_dir}',)
  scale = repro_studies.SCALES['tiny']
  only = ('K=2 fixed',)
  report = repro_registry.run_study('k_min', scale, 1, root, docs, extra, only=only)
  path = os.path.join(docs, 'reproduction', 'k_min.json')
  with open(path) as f:
    [trained] = json.load(f)['runs']
  assert trained['group'] == 'K=2 fixed' and trained['steps'] == scale.steps
  shutil.rmtree(root)  # a fresh session: the workdirs are gone, the json is committed
  monkeypatch.setattr(repro_lib, 'execute_logged', lambda *a: pytest.fail(f'retrained: {a}'))
  again = repro_registry.run_study('k_min', scale, 1, root, docs, extra, only=only)
  with open(path) as f:
    assert json.load(f)['runs'] == [trained]
  assert again == report and not os.path.exists(root)


def test_only_picks_groups_by_substring_or_whole_name():
  groups = ['~4M D=1 C=408', '~4M D=1 C=408 m=2', '~4M N=2 C=376', '~1M D=1 C=176']
  pick = lambda *only: [g for g in groups if repro_registry.selected(g, only)]
  assert pick() == groups
  assert pick('~4M D=1') == groups[:2]
  assert pick('~4M D=1 C=408$') == groups[:1]
  assert pick('~4M D=1$') == []
  assert pick('~4M D=1 C=408$', '~1M') == [groups[0], groups[3]]


def test_runs_with_the_same_config_are_trained_once():
  # The ablations' `add` row is the k_min run of the same argument and workdir: trained once.
  scale = repro_studies.SCALES['cpu']
  k_min = {r.group: r for r in repro_studies.k_min_runs(scale, 1)}
  ablations = {r.group: r for r in repro_studies.ablation_runs(scale, 1)}
  add = ablations[repro_studies.ADD_BASELINE]
  assert add.workdir('R') == k_min['K=5 k_min=2'].workdir('R')
  assert len(ablations) == len(repro_studies.ABLATIONS)
  assert all(r.study == 'ablations' for g, r in ablations.items() if g != repro_studies.ADD_BASELINE)
  # grad_iterations times its runs against each other: its m = K run is its own.
  grad = {r.group: r for r in repro_studies.grad_iterations_runs(scale, 1)}
  assert all(r.study == 'grad_iterations' for r in grad.values()) and len(grad) == 3


def test_one_seed_gaps_are_never_worded_as_no_difference():
  a = [_record('a', 0, 47.4)]
  b = [_record('b', 0, 31.2)]
  c = repro_lib.compare(a, b, repro_lib.final_ppl)
  assert repro_studies.outcome_words(c) == 'one seed, not judged; higher on it'
  two = repro_lib.compare([_record('a', s, p) for s, p in enumerate([31.0, 33.5])],
                          [_record('b', s, p) for s, p in enumerate([32.0, 32.0])],
                          repro_lib.final_ppl)  # deltas -1, +1.5: within two sigma
  assert repro_studies.outcome_words(two, 'converted') == 'inconclusive, converted higher on average'


def test_a_launch_is_on_the_ledger_while_it_runs_and_completed_after(tmp_path):
  """A driver killed mid-run (SIGKILL, a session's end) must still leave its launch on record."""
  import threading  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  ledger = workdir / 'invocations.jsonl'
  gate = tmp_path / 'gate'
  script = (f'import os, time; os.makedirs({str(workdir)!r})\n'
            f'while not os.path.exists({str(gate)!r}): time.sleep(0.05)')
  codes = []
  thread = threading.Thread(target=lambda: codes.append(
      repro_lib.execute_logged(['python', '-c', script], str(workdir))))
  thread.start()
  deadline = time.time() + 60
  while not ledger.exists() and time.time() < deadline:
    time.sleep(0.1)
  [running] = [json.loads(line) for line in ledger.read_text().splitlines()]
  assert running['exit_code'] is None and running['seconds'] is None
  assert running['resumed_from_step'] is None and running['command'].startswith('python -c')
  assert running['machine'] == repro_lib.host() and 'logical cores' in running['machine']
  gate.touch()
  thread.join(timeout=60)
  [done] = [json.loads(line) for line in ledger.read_text().splitlines()]
  assert codes == [0] and done['exit_code'] == 0 and done['seconds'] >= 0
  assert {k: v for k, v in done.items() if k not in ('exit_code', 'seconds')} == {
      k: v for k, v in running.items() if k not in ('exit_code', 'seconds')}


def test_two_launches_on_one_workdir_each_complete_their_own_ledger_line(tmp_path):
  """A second launch while the first still runs (it fails on the trainer's lock in real use)
  appends its own line; when the first ends it completes its line, not the second's."""
  import threading  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  ledger = workdir / 'invocations.jsonl'
  gate = tmp_path / 'gate'
  first = (f'import os, time; os.makedirs({str(workdir)!r})\n'
           f'while not os.path.exists({str(gate)!r}): time.sleep(0.05)')
  codes = {}
  thread = threading.Thread(target=lambda: codes.update(
      first=repro_lib.execute_logged(['python', '-c', first], str(workdir))))
  thread.start()
  deadline = time.time() + 60
  while not ledger.exists() and time.time() < deadline:
    time.sleep(0.1)
  codes['second'] = repro_lib.execute_logged(['python', '-c', 'raise SystemExit(3)'],
                                             str(workdir))
  gate.touch()
  thread.join(timeout=60)
  lines = [json.loads(line) for line in ledger.read_text().splitlines()]
  assert codes == {'first': 0, 'second': 3}
  assert [(l['command'].split('\n')[0][:30], l['exit_code']) for l in lines] == [
      (f'python -c {first}'.split('\n')[0][:30], 0), ('python -c raise SystemExit(3)', 3)]
  assert all(l['seconds'] is not None for l in lines)
  assert len({l['launch'] for l in lines}) == 2


def test_status_says_where_each_run_stands_and_trains_nothing(tmp_path):
  """`--status`: finished (workdir or kept from the json), at its latest checkpoint, started,
  not started; `--only` narrows it; the last line is the command that trains the rest."""
  scale = repro_studies.SCALES['tiny']
  root, docs = tmp_path / 'runs', tmp_path / 'docs'
  runs = {r.group: r for r in repro_studies.k_min_runs(scale, 1)}
  done, kept, partial = runs['K=5 k_min=2'], runs['K=2 fixed'], runs['K=5 fixed']
  for run, files in ((done, {'summary.json': {'step': 4}}), (partial, {})):
    workdir = root / 'k_min' / run.name
    os.makedirs(workdir / 'checkpoints' / '2')
    for name, value in {'config.json': {'total_steps': 4}, **files}.items():
      (workdir / name).write_text(json.dumps(value))
  os.makedirs(docs / 'reproduction')
  record = _committed(kept, ' '.join(kept.command(str(root))))
  (docs / 'reproduction' / 'k_min.json').write_text(json.dumps({'runs': [record]}))
  status = lambda *args: subprocess.run(
      [sys.executable, '-m', 'ctr_jax.projects.reproduce', '--status', '--study=k_min',
       '--scale=tiny', '--seeds=2', f'--root={root}', f'--docs={docs}', *args],
      capture_output=True, text=True, cwd=ROOT, timeout=120, check=True).stdout.splitlines()
  lines = status()
  assert lines[0] == 'k_min: 2/6 runs finished'
  states = {line[32:].strip(): line[:32].strip() for line in lines[1:-1]}
  assert states == {'K=5 k_min=2 (seed 0)': 'finished', 'K=5 k_min=2 (seed 1)': 'not started',
                    'K=2 fixed (seed 0)': 'finished (kept from the json)',
                    'K=2 fixed (seed 1)': 'not started', 'K=5 fixed (seed 0)': 'at step 2 of 4',
                    'K=5 fixed (seed 1)': 'not started'}
  assert lines[-1].strip() == 'the rest: python -m ctr_jax.projects.reproduce --study=k_min --seeds=2'
  only = status("--only=K=5 fixed")
  assert len(only) == 4 and only[-1].endswith("--seeds=2 --only='K=5 fixed'")
  assert sorted(os.listdir(root / 'k_min')) == sorted([done.name, partial.name])
  assert os.listdir(docs / 'reproduction') == ['k_min.json']


@pytest.mark.slow
def test_the_evaluating_studies_train_evaluate_and_report(data_dir, tmp_path, monkeypatch):
  """seq_vs_parallel, k_eval and conversion end to end at the tiny scale: on trained weights the
  unroll at K = T + 1 is the exact scan, K >= T + 1 at evaluation gives the scan's PPL, and a
  converted transformer (zero-initialised correction) has its source's PPL at step 0."""
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  root, docs = str(tmp_path / 'runs'), str(tmp_path / 'docs')
  extra = (f'--config.data.data_dir={data_dir}',)
  scale = repro_studies.SCALES['tiny']
  read = lambda name: json.loads((tmp_path / 'docs' / 'reproduction' / f'{name}.json').read_text())
  report = repro_registry.run_study('seq_vs_parallel', scale, 1, root, docs, extra)
  assert '2/2 runs finished' in report
  for r in read('seq_vs_parallel')['runs']:
    assert r['post']['k_t_plus_1']['max_abs_logit_diff'] < 1e-4
    assert r['post']['k_t_plus_1']['k_unroll'] == scale.seq_len + 1
  report = repro_registry.run_study('k_eval', scale, 1, root, docs, extra)
  [record] = read('k_eval')['runs']  # the k_min study's K = 5 run, trained above, not again
  assert len(repro_lib.invocations(os.path.join(root, 'k_min', record['name']))) == 1
  post = record['post']
  assert post['K=20'] == pytest.approx(post['sequential'], rel=1e-5)
  assert os.path.exists(tmp_path / 'docs' / 'reproduction' / 'k_eval.png')
  report = repro_registry.run_study('conversion', scale, 1, root, docs, extra)
  assert '4/4 runs finished' in report and 'claim 15' in report
  source = next(r for r in read('conversion')['runs'] if r['group'].startswith('transformer 2'))
  p = source['post']
  assert p['converted_ppl_parallel'] == pytest.approx(p['source_ppl'], rel=1e-5)
  assert p['converted_ppl_sequential'] == pytest.approx(p['source_ppl'], rel=1e-5)
  continued = next(r for r in read('conversion')['runs'] if 'continued' in r['group'])
  assert '--config.init_from=' in continued['command']
