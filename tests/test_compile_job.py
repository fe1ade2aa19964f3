"""--config.job=compile (ctr_jax/training/aot.py): the train step's memory and FLOPs per device,
compiled from shapes alone; no data is read or built and nothing is trained."""

import json
import os

import jax
import numpy as np
import pytest

from ctr_jax import config_lib, models, tasks
from ctr_jax.ops import recurrence
from ctr_jax.projects import paths
from ctr_jax.training import aot, sharding
from helpers import run_main, tiny_train_config

TINY = ['--config.model.width=32', '--config.model.depth=1', '--config.model.num_heads=2',
        '--config.model.vocab_size=320', '--config.model.k_unroll=3', '--config.data.seq_len=16',
        '--config.batch_size=4']


def test_the_compile_job_writes_compile_json_and_reads_no_data(tmp_path):
  workdir, data_dir, tfds_dir = tmp_path / 'run', tmp_path / 'data', tmp_path / 'tfds'
  result = run_main(['--config=configs/quickstart.py', f'--workdir={workdir}',
                     '--config.job=compile', f'--config.data.data_dir={data_dir}',
                     '--config.precision=bfloat16', *TINY],
                    env_extra={'TFDS_DATA_DIR': str(tfds_dir)})
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((workdir / 'compile.json').read_text())
  for key in aot.KEYS:
    assert report[key] > 0, key
    # One line each on stdout, the same number as the json.
    assert f'\n{key}: {report[key] if key.endswith("_bytes") else ""}' in result.stdout, key
  assert report['peak_bytes'] == (report['argument_bytes'] + report['output_bytes']
                                  - report['alias_bytes'] + report['temp_bytes'])
  assert (report['k_unroll'], report['remat'], report['devices']) == (3, 'none', 1)
  assert (report['batch_size'], report['seq_len'], report['platform']) == (4, 16, 'cpu')
  # The precision a GPU run resolves 'auto' to, asked for on a CPU: bfloat16 compute.
  assert (report['dtype'], report['param_dtype']) == ('bfloat16', 'float32')
  # No dataset, tokenizer or checkpoint: the workdir holds compile.json alone.
  assert not data_dir.exists() and not tfds_dir.exists()
  assert [n for n in os.listdir(workdir) if n != '.ctr_jax.lock'] == ['compile.json']


def test_the_abstract_batch_is_the_real_one(data_dir):
  """tasks.abstract gives the shapes and dtypes of a real training batch, for each task."""
  pointer = paths.load_config_module('configs/pointer_chasing.py').get_config(
      'hops=2,model=t1,runlocal')
  for config in (tiny_train_config(data_dir), pointer):
    _, shapes = tasks.abstract(config)
    batch = next(tasks.make(config, 0, 1).train_iter)
    real = jax.tree.map(lambda x: (np.shape(x), np.asarray(x).dtype), batch)
    assert jax.tree.map(lambda s: (s.shape, s.dtype), shapes) == real


def _measure(config, mesh):
  return aot.measure(config, config_lib.model_config_for(config, 'cpu'), mesh)


def _tiny(kind: str, remat: str):
  c = config_lib.get_base()
  c.model = models.model_config(kind=kind, width=64, depth=2, num_heads=4, vocab_size=512,
                                max_len=32, k_unroll=3)
  c.data.seq_len, c.batch_size, c.train.remat = 32, 8, remat
  return c


def _model_flops(config) -> float:
  """The training FLOPs of one step by the model's formula: 3 x (forward) per token, the forward
  2 x the weights each token passes through (`models.flops_per_token`, the unit and correction K
  times, embedding and head once) plus attention's 4 T C per layer and pass."""
  s = models.spec_of(config.model)
  c, v, t = s.width, s.vocab_size, config.data.seq_len
  k = s.k_unroll if s.is_context_ready else 1
  weights = models.flops_per_token(s)
  forward = 2 * (k * (weights - v * c) + v * c) + 4 * k * s.depth * t * c
  return 3 * config.batch_size * t * forward


@pytest.mark.slow  # test_the_numbers_are_per_device checks the count; test_remat.py the remats
@pytest.mark.parametrize('kind', ['context_ready', 'transformer'])
def test_remat_lowers_temp_bytes_and_flops_count_the_whole_unroll(kind):
  mesh = sharding.make_mesh(config_lib.get_base().mesh, jax.devices()[:1])
  measured = {r: _measure(_tiny(kind, r), mesh) for r in recurrence.REMAT}
  none = measured['none']
  # XLA counts every floating-point operation (norms, softmax, GELU, the loss, AdamW); the formula
  # only the matmuls and attention's products. At C = 64 the rest is about 9% of the step
  # (3.7% at the quickstart's C = 128, 21% at C = 32): the count lies within [1, 1.12] x the
  # formula. A count of one scan body instead of K would be about 1/K of it.
  ratio = none['flops_per_step'] / _model_flops(_tiny(kind, 'none'))
  assert 1.0 <= ratio <= 1.12, ratio
  if kind == 'context_ready':
    # Every remat trades stored activations for recomputation: less memory, more FLOPs.
    for remat in recurrence.REMAT[1:]:
      assert measured[remat]['temp_bytes'] < none['temp_bytes'], (remat, measured)
      assert measured[remat]['flops_per_step'] > none['flops_per_step'], (remat, measured)
  else:
    # A transformer has no iterations: 'iteration' compiles the same step.
    assert measured['iteration']['temp_bytes'] == none['temp_bytes']
    assert measured['layer']['flops_per_step'] > none['flops_per_step']


def test_the_numbers_are_per_device():
  """Two-way fsdp on two fake devices: each holds about half the state and does half the FLOPs."""
  config = _tiny('context_ready', 'none')
  one = _measure(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))
  config.mesh.data, config.mesh.fsdp = 1, 2
  two = _measure(config, sharding.make_mesh(config.mesh, jax.devices()[:2]))
  assert (two['devices'], two['mesh']) == (2, {'data': 1, 'fsdp': 2, 'tensor': 1})
  assert 0.45 <= two['argument_bytes'] / one['argument_bytes'] <= 0.6
  assert two['flops_per_step'] == pytest.approx(one['flops_per_step'] / 2, rel=1e-6)
  # The whole K-unroll is counted (as in the slow test above), not one scan body (about 1/K).
  assert 1.0 <= one['flops_per_step'] / _model_flops(config) <= 1.12
