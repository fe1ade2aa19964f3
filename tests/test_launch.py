"""Launch scripts: valid shell, and run.sh really runs the entry point."""

import configparser
import glob
import json
import os
import pathlib
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT_PATH = pathlib.Path(ROOT)


@pytest.mark.parametrize('script', sorted(glob.glob(os.path.join(ROOT, 'launch', '*.sh')) +
                                          glob.glob(os.path.join(ROOT, 'launch', '*.sbatch'))))
def test_launch_script_is_valid_bash(script):
  subprocess.run(['bash', '-n', script], check=True)


def test_run_sh_prepares_the_embedded_corpus(tmp_path):
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}
  result = subprocess.run(
      ['bash', 'launch/run.sh', '--config=configs/quickstart.py', f'--workdir={tmp_path}/w',
       '--config.job=prepare', f'--config.data.data_dir={tmp_path}/data',
       '--config.model.vocab_size=300'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert glob.glob(str(tmp_path / 'data' / 'tokenizers' / 'kjv_bible_300*'))


# ------------------------------------------------------------------------------------------------
# The commands the cluster launchers generate, with fake gcloud / sbatch / srun on the PATH that
# record their arguments (one JSON list per call) and run nothing.
# ------------------------------------------------------------------------------------------------

FAKE = r'''#!/usr/bin/env python3
import json, os, sys
with open(os.environ['FAKE_LOG'], 'a') as f:
  f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + '\n')
if os.path.basename(sys.argv[0]) == 'sbatch':
  print('4242;cluster' if '--parsable' in sys.argv else 'Submitted batch job 4243')
'''


def _run_with_fakes(tmp_path, argv, env=None):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  for name in ('gcloud', 'sbatch', 'srun'):
    (bin_dir / name).write_text(FAKE)
    (bin_dir / name).chmod(0o755)
  log = tmp_path / 'calls.jsonl'
  full_env = {**os.environ, 'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
              'FAKE_LOG': str(log), **(env or {})}
  full_env.pop('SLURM_SUBMIT_DIR', None)
  result = subprocess.run(argv, cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=60)
  assert result.returncode == 0, result.stderr
  calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
  return calls, result.stdout


def test_tpu_vm_installs_everywhere_prepares_on_worker_0_then_trains_everywhere(tmp_path):
  calls, _ = _run_with_fakes(tmp_path, [
      'bash', 'launch/tpu_vm.sh', 'my-tpu', 'us-central2-b', 'configs/d5_c1120.py',
      '/mnt/shared/w d5', '--config.data.manual_dir=/mnt/raw/owt'])
  assert [c[:6] for c in calls] == [
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-tpu']] * 3
  workers = [next(a for a in c if a.startswith('--worker=')) for c in calls]
  assert workers == ['--worker=all', '--worker=0', '--worker=all']
  install, prepare, train = (c[c.index('--command') + 1] for c in calls)
  assert "pip install -q -e . 'jax[tpu]'" in install
  assert 'bash launch/run.sh' not in install
  for command in (prepare, train):
    assert 'cd ~/ctr_jax' in command and 'TFDS_DATA_DIR' in command
    assert ('bash launch/run.sh --config=configs/d5_c1120.py --workdir=/mnt/shared/w\\ d5 '
            '--config.data.manual_dir=/mnt/raw/owt') in command
    subprocess.run(['bash', '-n', '-c', command], check=True)  # valid for the remote shell
  assert prepare.endswith('--config.job=prepare')
  assert 'prepare' not in train
  # Skipping the preparation leaves the install and the training.
  (tmp_path / 'calls.jsonl').unlink()
  calls, _ = _run_with_fakes(tmp_path, [
      'bash', 'launch/tpu_vm.sh', 'my-tpu', 'z', 'c.py', '/w'], env={'TPU_SKIP_PREPARE': '1'})
  assert [next(a for a in c if a.startswith('--worker=')) for c in calls] == ['--worker=all'] * 2


def _sbatch_directives(path):
  return [line.split(None, 1)[1] for line in (ROOT_PATH / path).read_text().splitlines()
          if line.startswith('#SBATCH')]


def test_slurm_prepares_in_a_cpu_job_the_gpu_job_depends_on(tmp_path):
  calls, out = _run_with_fakes(tmp_path, [
      'bash', 'launch/slurm_submit.sh', 'configs/d5_c1120.py', '/shared/w',
      '--config.data.manual_dir=/shared/raw'], env={'GPU_SBATCH_ARGS': '--partition=gpu'})
  assert calls == [
      ['sbatch', '--parsable', 'launch/slurm_prepare.sbatch', 'configs/d5_c1120.py', '/shared/w',
       '--config.data.manual_dir=/shared/raw'],
      ['sbatch', '--dependency=afterok:4242', '--kill-on-invalid-dep=yes', '--partition=gpu',
       'launch/slurm_gpu.sbatch', 'configs/d5_c1120.py', '/shared/w',
       '--config.data.manual_dir=/shared/raw']]
  assert 'job 4242' in out
  # The preparation job holds no GPU; the GPU job does not prepare.
  prepare_directives = _sbatch_directives('launch/slurm_prepare.sbatch')
  assert not [d for d in prepare_directives if 'gpu' in d.lower() or 'gres' in d.lower()]
  assert '--gpus-per-node=8' in _sbatch_directives('launch/slurm_gpu.sbatch')
  assert 'prepare' not in '\n'.join(
      line for line in (ROOT_PATH / 'launch/slurm_gpu.sbatch').read_text().splitlines()
      if not line.startswith('#'))


@pytest.mark.parametrize('script, expected', [
    ('launch/slurm_prepare.sbatch',
     ['srun', '--ntasks=1', 'bash', 'launch/run.sh', '--config=configs/d5_c1120.py',
      '--workdir=/shared/w', '--config.data.manual_dir=/shared/raw', '--config.job=prepare']),
    ('launch/slurm_gpu.sbatch',
     ['srun', '--kill-on-bad-exit=1', 'bash', 'launch/run.sh', '--config=configs/d5_c1120.py',
      '--workdir=/shared/w', '--config.data.manual_dir=/shared/raw']),
])
def test_the_sbatch_scripts_run_one_srun_each(tmp_path, script, expected):
  calls, _ = _run_with_fakes(tmp_path, ['bash', script, 'configs/d5_c1120.py', '/shared/w',
                                        '--config.data.manual_dir=/shared/raw'])
  assert calls == [expected]


def test_the_gcs_extra_and_one_statement_about_cloud_storage():
  """Issue 40.4: `.[gcs]` brings what gs:// workdirs need, and the docs say the same thing."""

  cfg = configparser.ConfigParser()
  cfg.read(ROOT_PATH / 'setup.cfg')
  extra = cfg['options.extras_require']['gcs']
  assert 'gcsfs' in extra and 'google-cloud-storage' in extra
  for path in ('launch/README.md', 'docs/notes.md', 'ctr_jax/training/workdir.py',
               'ctr_jax/training/metrics.py', 'docs/usage.md'):
    text = (ROOT_PATH / path).read_text()
    assert '.[gcs]' in text, path
    assert 'not supported by the metrics writer' not in text, path
    assert 'nothing\nbut credentials' not in text and 'only credentials' not in text, path
