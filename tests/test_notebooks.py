"""The notebooks in notebooks/ run top to bottom (reduced sizes) and are stored without outputs.

Each notebook is executed in a fresh `python3` kernel with CTR_JAX_NOTEBOOK_SMOKE=1, which the
notebooks read to shrink their training runs, so a change to the public API that breaks a
notebook fails here. Run one by hand at full size with `jupyter nbconvert --execute` or
`pytest --nbmake notebooks/` (without the variable).
"""

import os
import pathlib
import re

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parents[1] / 'notebooks'
NOTEBOOKS = ('quickstart.ipynb', 'pointer_chasing.ipynb', 'implicit_updates.ipynb')
# The notebooks need a module that may not exist yet in every checkout.
REQUIRES = {'implicit_updates.ipynb': 'ctr_jax.implicit'}
CELL_TIMEOUT_S = 600


def _kernel_env() -> dict:
  env = dict(os.environ, CTR_JAX_NOTEBOOK_SMOKE='1')
  # conftest.py fakes 8 CPU devices for the sharding tests; a notebook runs on the real device.
  flags = re.sub(r'--xla_force_host_platform_device_count=\d+', '', env.get('XLA_FLAGS', ''))
  env['XLA_FLAGS'] = flags.strip()
  # Smoke runs are dominated by compilation; XLA's optimisations do not pay off here.
  env.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
  return env


def test_every_notebook_is_tested():
  assert sorted(p.name for p in NOTEBOOKS_DIR.glob('*.ipynb')) == sorted(NOTEBOOKS)


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_notebook_is_stored_without_outputs(name):
  nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
  nbformat.validate(nb)
  dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == 'code' and
           (cell.outputs or cell.execution_count is not None)]
  assert not dirty, f'{name}: cells {dirty} carry outputs; clear them before committing'
  assert nb.cells[0].cell_type == 'markdown', f'{name}: the first cell must say what it shows'
  assert 'REPO_URL' in nb.cells[1].source, f'{name}: the second cell must be the set-up cell'


@pytest.mark.slow
@pytest.mark.parametrize('name', NOTEBOOKS)
def test_notebook_runs(name):
  if name in REQUIRES:
    pytest.importorskip(REQUIRES[name], reason=f'{name} needs {REQUIRES[name]}')
  nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
  client = nbclient.NotebookClient(nb, kernel_name='python3', timeout=CELL_TIMEOUT_S,
                                   resources={'metadata': {'path': str(NOTEBOOKS_DIR)}})
  client.execute(env=_kernel_env())
  errors = [out for cell in nb.cells if cell.cell_type == 'code'
            for out in cell.outputs if out.output_type == 'error']
  assert not errors
