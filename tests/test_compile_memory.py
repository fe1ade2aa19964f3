"""The paper configs' memory before the run: docs/compile_memory.json (written by
`python -m ctr_jax.projects.perf.compile_memory`), the remat defaults it chose, the docs section
it writes, and (slow) `--config.job=compile` of every paper config on one fake CPU device."""

import json
import os

import pytest

from ctr_jax import config_lib
from ctr_jax.ops import recurrence
from ctr_jax.projects import paths
from ctr_jax.projects.perf import compile_memory
from helpers import run_main

with open(compile_memory.JSON) as _f:
  REPORT = json.load(_f)
PAPER = compile_memory.paper_configs()
BY = {(r['config'], r['dtype'], r['remat']): r for r in REPORT['rows']}


def test_every_paper_config_is_measured_with_every_remat_and_dtype():
  measured = {(r['config'], r['dtype'], r['remat']) for r in REPORT['rows']}
  assert measured == {(n, d, r) for n in PAPER for d in compile_memory.DTYPES
                      for r in recurrence.REMAT}
  for row in REPORT['rows']:
    assert row['peak_bytes'] == (row['argument_bytes'] + row['output_bytes']
                                 - row['alias_bytes'] + row['temp_bytes'])
    # The whole K-unroll is counted: XLA's count is the formula's plus the non-matmul work and
    # any recomputation, never a single scan body's (about 1/K of it).
    assert 1.0 <= row['flops_per_step'] / row['model_flops_per_step'] <= 2.0, row


@pytest.mark.parametrize('name', PAPER)
def test_the_default_remat_is_the_measured_choice_and_fits_80_gb(name):
  config = paths.load_config_module(f'configs/{name}.py', name).get_config()
  choice = REPORT['choices'][name]['80']['float32']
  assert config.train.remat == config_lib.PAPER_REMAT[name] == choice
  row, = [r for r in REPORT['rows'] if (r['config'], r['dtype'], r['remat']) ==
          (name, 'float32', choice)]
  assert row['batch_size'] == config.batch_size and row['seq_len'] == config.data.seq_len
  assert row['k_unroll'] == config.model.k_unroll
  assert compile_memory.fits(row, 80)
  # It fits in bfloat16 too, what config.precision='auto' computes in on a GPU.
  assert compile_memory.fits(BY[(name, 'bfloat16', choice)], 80)
  cheaper = [r for r in REPORT['rows'] if (r['config'], r['dtype']) == (name, 'float32')
             and r['flops_per_step'] < row['flops_per_step']]
  assert not any(compile_memory.fits(r, 80) for r in cheaper)  # nothing cheaper fits
  # The CPU-sized variant needs no recomputation.
  local = paths.load_config_module(f'configs/{name}.py', name).get_config('runlocal')
  assert local.train.remat == 'none'


def test_the_docs_section_is_written_from_the_json():
  with open(compile_memory.DOC) as f:
    text = f.read()
  body = text.split(compile_memory.BEGIN, 1)[1].split(compile_memory.END, 1)[0]
  assert body.strip() == compile_memory.section(REPORT).strip()


@pytest.mark.slow
@pytest.mark.parametrize('name', PAPER)
def test_the_compile_job_of_every_paper_config_on_one_fake_cpu_device(name, tmp_path):
  """The real CLI, as a user runs it before a GPU run, at the paper's batch on one device."""
  workdir = tmp_path / 'run'
  result = run_main([f'--config=configs/{name}.py', f'--workdir={workdir}',
                     '--config.job=compile'], env_extra={'TFDS_DATA_DIR': str(tmp_path / 'tfds')},
                    timeout=1200)
  assert result.returncode == 0, result.stderr[-3000:]
  got = json.loads((workdir / 'compile.json').read_text())
  config = paths.load_config_module(f'configs/{name}.py', name).get_config()
  row, = [r for r in REPORT['rows'] if (r['config'], r['dtype'], r['remat']) ==
          (name, 'float32', config.train.remat)]
  assert got['remat'] == row['remat'] and got['devices'] == 1
  for key in ('argument_bytes', 'output_bytes', 'alias_bytes'):
    assert got[key] == row[key], key
  # The same XLA version compiles the same program; another CPU's code generation may fuse a
  # little differently.
  assert abs(got['temp_bytes'] / row['temp_bytes'] - 1) <= 0.05
  assert abs(got['flops_per_step'] / row['flops_per_step'] - 1) <= 1e-6
  assert not os.path.exists(tmp_path / 'tfds')  # no dataset built
