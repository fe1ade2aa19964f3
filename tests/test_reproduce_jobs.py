"""ctr_jax.projects.reproduce --jobs: runs trained several at a time, in order, a run after the one
it starts from, each on its own CPUs; and the driver's one-line refusals."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ctr_jax.projects.reproduce import jobs as repro_jobs
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce.lib import Run


def test_cpu_shares_split_contiguously_and_refuse_to_oversubscribe():
  assert repro_jobs.cpu_shares(2, cpus={0, 1}) == [(0,), (1,)]
  assert repro_jobs.cpu_shares(3, cpus=range(8)) == [(0, 1, 2), (3, 4, 5), (6, 7)]
  assert repro_jobs.cpu_shares(1, cpus=range(4)) == [(0, 1, 2, 3)]
  assert repro_jobs.cpu_shares(3, cpus={5, 7}) == [(), (), ()]  # fewer CPUs than jobs: no pin


def _fake_trainer(monkeypatch, seconds=0.15, fail=()):
  """execute_logged replaced by a sleep that marks the run finished; returns the call log."""
  calls, lock = [], threading.Lock()

  def fake(command, workdir, cpus=(), log='', env=None):
    start = time.monotonic()
    time.sleep(seconds)
    name = os.path.basename(workdir)
    if name not in fail:
      os.makedirs(workdir, exist_ok=True)
      for file, body in (('summary.json', {'step': 4}), ('config.json', {'total_steps': 4})):
        with open(os.path.join(workdir, file), 'w') as f:
          json.dump(body, f)
    with lock:
      calls.append({'name': name, 'start': start, 'end': time.monotonic(), 'cpus': cpus,
                    'log': log, 'env': env})
    return 3 if name in fail else 0
  monkeypatch.setattr(repro_lib, 'execute_logged', fake)
  return calls


@pytest.mark.parametrize('jobs', [1, 2, 3])
def test_run_all_keeps_order_dependencies_and_the_job_limit(tmp_path, monkeypatch, jobs):
  root = str(tmp_path)
  source = Run('s', 'transformer', 0, 'a=1')
  runs = [source, Run('s', 'converted', 0, 'a=2', init_from=source),
          Run('s', 'crt', 0, 'a=3'), Run('s', 'crt', 1, 'a=3'), Run('s', 'other', 0, 'a=4'),
          Run('s', 'bad', 0, 'a=5')]
  monkeypatch.setattr(repro_jobs, 'cpu_shares', lambda n: [(c,) for c in range(n)])
  calls = _fake_trainer(monkeypatch, fail=('bad_s0',))
  codes = repro_jobs.run_all(runs, root, jobs=jobs)
  assert codes == {r.name: 3 if r.name == 'bad_s0' else 0 for r in runs}
  by_name = {c['name']: c for c in calls}
  assert sorted(by_name) == sorted(r.name for r in runs)
  # Never more than `jobs` at once.
  events = sorted([(c['start'], 1) for c in calls] + [(c['end'], -1) for c in calls])
  running = peak = 0
  for _, step in events:
    running += step
    peak = max(peak, running)
  assert peak <= jobs and (jobs == 1 or peak > 1)
  # The converted run starts only after its source has ended.
  assert by_name['converted_s0']['start'] >= by_name['transformer_s0']['end']
  starts = [c['name'] for c in sorted(calls, key=lambda c: c['start'])]
  if jobs == 1:
    assert starts == [r.name for r in runs] and all(c['log'] == '' for c in calls)
  else:  # own CPUs, own log beside the workdir, a share of the GPU's memory
    assert {c['cpus'] for c in calls} <= {(s,) for s in range(jobs)}
    assert all(c['log'] == os.path.join(root, 's', c['name']) + '.log' for c in calls)
    assert all(float(c['env']['XLA_PYTHON_CLIENT_MEM_FRACTION']) <= 0.9 / jobs for c in calls
               if 'XLA_PYTHON_CLIENT_MEM_FRACTION' not in os.environ)
  # A finished run is not started again.
  again = _fake_trainer(monkeypatch)
  repro_jobs.run_all(runs, root, jobs=jobs)
  assert [c['name'] for c in again] == ['bad_s0']


def test_execute_logged_pins_the_trainer_and_sends_its_output_to_the_log(tmp_path):
  if not hasattr(os, 'sched_setaffinity'):
    pytest.skip('no CPU affinity on this platform')
  cpu = min(os.sched_getaffinity(0))
  workdir, log = str(tmp_path / 'w'), str(tmp_path / 'w.log')
  script = ('import os, sys, time; os.makedirs(sys.argv[1], exist_ok=True); time.sleep(0.5); '
            "print('cpus', sorted(os.sched_getaffinity(0)), os.environ['CTR_TEST_MARK'])")
  code = repro_lib.execute_logged(['python', '-c', script, workdir], workdir, cpus=(cpu,),
                                  log=log, env={'CTR_TEST_MARK': 'marked'})
  assert code == 0
  with open(log) as f:
    assert f.read().strip() == f'cpus [{cpu}] marked'
  [launch] = repro_lib.invocations(workdir)
  assert launch['exit_code'] == 0 and 'marked' not in launch['command']


@pytest.mark.parametrize('args, message', [
    (['--study=nope'], "--study='nope': allowed"),
    (['--study=table1', '--jobs=0'], '--jobs=0: allowed 1 or more'),
    (['--study=table1', '--scale=huge'], 'flag --scale=huge: value should be one of'),
    (['--seeds=3'], '--study is required'),
])
def test_bad_driver_flags_are_one_line_and_exit_2(args, message, tmp_path):
  result = subprocess.run([sys.executable, '-m', 'ctr_jax.projects.reproduce', *args,
                           f'--docs={tmp_path}', f'--root={tmp_path}'], capture_output=True,
                          text=True, cwd=repro_lib.ROOT, timeout=120)
  assert result.returncode == 2 and result.stdout == ''
  [line] = result.stderr.strip().splitlines()
  assert line.startswith('reproduce: error: ') and message in line
  assert os.listdir(tmp_path) == []
