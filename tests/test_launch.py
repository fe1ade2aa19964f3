"""Launch scripts: valid shell, and run.sh really runs the entry point."""

import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
