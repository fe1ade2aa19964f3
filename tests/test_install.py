"""Installing next to an accelerator JAX: the pins keep a newer JAX that is already there (a GPU
image, Colab), the accelerator extras follow the JAX range, and CI's constraints pin exactly the
lower bounds."""

import configparser
import os
import subprocess

from packaging.requirements import Requirement
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEWER_PYTHON = '/root/.pyenv/versions/3.12.1/bin/python'  # the index serves it jax 0.12


def _requirements(section: str, key: str) -> dict[str, Requirement]:
  setup = configparser.ConfigParser()
  setup.read(os.path.join(ROOT, 'setup.cfg'))
  lines = [l.strip() for l in setup[section][key].splitlines() if l.strip()]
  return {Requirement(l).name: Requirement(l) for l in lines}


def _lower_bound(requirement: Requirement) -> str:
  (bound,) = [s.version for s in requirement.specifier if s.operator == '>=']
  return bound


def test_ci_constraints_pin_the_lower_bounds_of_setup_cfg():
  required = _requirements('options', 'install_requires')
  with open(os.path.join(ROOT, '.ci', 'constraints-lower.txt')) as f:
    pins = [Requirement(l.strip()) for l in f if l.strip() and not l.startswith('#')]
  assert {'jax', 'jaxlib', 'flax', 'orbax-checkpoint'} <= {p.name for p in pins}
  for pin in pins:
    (spec,) = pin.specifier
    name = 'jax' if pin.name == 'jaxlib' else pin.name  # jaxlib moves with jax
    assert spec.operator == '==' and spec.version == _lower_bound(required[name]), pin
  with open(os.path.join(ROOT, '.ci', 'run')) as f:
    script = f.read()
  assert 'PIP_CONSTRAINT="$PWD/.ci/constraints-lower.txt"' in script
  assert 'pip install -e ".[dev]" && python -m pytest -n 2' in script  # the README's, verbatim


def test_the_pins_admit_newer_jax_and_the_extras_follow_them():
  required = _requirements('options', 'install_requires')
  # A newer JAX than CI's (what the H200 image of launch/README.md had, the newest on the index).
  for name, version in [('jax', '0.11.2'), ('jax', '0.12.0.1'), ('flax', '0.12.12')]:
    assert required[name].specifier.contains(version), (name, version)
  for extra, jax_extra in [('cuda12', 'cuda12'), ('cuda13', 'cuda13'), ('tpu', 'tpu')]:
    (requirement,) = _requirements('options.extras_require', extra).values()
    assert requirement.name == 'jax' and requirement.extras == {jax_extra}
    assert requirement.specifier == required['jax'].specifier, extra


@pytest.mark.slow
def test_a_newer_jax_installed_first_is_kept_and_passes_the_exactness_tests(tmp_path):
  """.ci/newer_jax: a venv with jax 0.12.0.1 first, then `pip install -e .` (needs the index)."""
  if not os.access(NEWER_PYTHON, os.X_OK):
    pytest.skip(f'no {NEWER_PYTHON}')
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'PIP_CONSTRAINT')}
  env['NEWER_JAX_VENV'] = str(tmp_path / 'venv')
  result = subprocess.run(['bash', os.path.join(ROOT, '.ci', 'newer_jax')], env=env,
                          capture_output=True, text=True, timeout=1800)
  assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
  assert 'newer_jax: python 3.12' in result.stdout and 'jax==0.12.0.1' in result.stdout
  assert 'newer_jax: passed' in result.stdout
