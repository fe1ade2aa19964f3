"""What a training run tells about its speed: tokens/s per device and MFU (metrics.jsonl,
TensorBoard, the progress bar), the peak FLOP/s behind MFU, and profiler traces."""

import glob
import itertools
import json
import types

import jax
import pytest

from ctr_jax import config_lib, models, trainer
from ctr_jax.bench import suite
from ctr_jax.reporting import machine, peaks
from ctr_jax.training import metrics
from helpers import run_main, tiny_train_config


def test_a_two_device_run_logs_mfu_per_device_speed_and_a_profile(data_dir, tmp_path):
  """In process, with conftest's nominal peak; the CLI test below measures the CPU's (slow)."""
  workdir = tmp_path / 'run'
  config = tiny_train_config(data_dir, log_every=2, profile_steps='1,3')
  summary = trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:2])
  trained = [r for r in metrics.read_metrics(str(workdir)) if 'train_loss' in r]
  assert [r['step'] for r in trained] == [2, 4]
  for row in trained:
    assert 0 < row['mfu'] <= 1, row
    assert row['tokens_per_second_per_device'] == pytest.approx(row['tokens_per_second'] / 2)
  assert summary['mfu'] == trained[-1]['mfu']
  assert glob.glob(str(workdir / 'tensorboard' / 'plugins' / 'profile' / '*' / '*.xplane.pb'))
  speed = {'tokens_per_second': 2000.0, 'tokens_per_second_per_device': 1000.0, 'mfu': 0.4123}
  assert trainer._progress_fields(2.0, speed) == {'loss': '2.000', 'tok_s': '2,000',
                                                  'tok_s_dev': '1,000', 'mfu': '41.2%'}


@pytest.mark.slow
def test_a_cli_run_logs_mfu_per_device_speed_and_writes_a_profile(data_dir, tmp_path):
  workdir, cache = tmp_path / 'run', tmp_path / 'cache'
  result = run_main([
      '--config=configs/quickstart.py', f'--config.data.data_dir={data_dir}',
      '--config.model.width=32', '--config.model.depth=1', '--config.model.num_heads=2',
      '--config.model.vocab_size=320', '--config.model.k_unroll=2', '--config.train.k_min=0',
      '--config.data.seq_len=16', '--config.batch_size=4', '--config.eval_batches=1',
      '--config.sample.num_tokens=0', '--config.total_steps=4', '--config.log_every=2',
      '--config.profile_steps=1,3', f'--workdir={workdir}'],
      env_extra={'CTR_JAX_CACHE': str(cache), 'CTR_JAX_PEAK_FLOPS': ''}, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  trained = [r for r in rows if 'train_loss' in r]
  assert [r['step'] for r in trained] == [2, 4]
  for row in trained:
    assert 0 < row['mfu'] <= 1, row
    assert row['tokens_per_second_per_device'] == row['tokens_per_second'] > 0  # one device
  summary = json.loads((workdir / 'summary.json').read_text())
  assert 0 < summary['mfu'] <= 1
  assert 'mfu=' in result.stderr  # the progress bar
  events = glob.glob(str(workdir / 'tensorboard' / 'events.out.tfevents.*'))
  assert any(b'mfu' in open(path, 'rb').read() for path in events)
  # Steps 2 and 3 traced, where TensorBoard's profile tab looks.
  assert glob.glob(str(workdir / 'tensorboard' / 'plugins' / 'profile' / '*' / '*.xplane.pb'))
  # The CPU's matmul peak, measured once, is cached under the CPU's name.
  cached = json.loads((cache / 'peak.json').read_text())
  (key, by_dtype), = cached.items()
  assert key.startswith(peaks.cpu_name.cpu_name()) and by_dtype['float32'] > 0


def test_peak_table_and_the_measured_peak_cache(tmp_path, monkeypatch):
  tera = 1e12
  assert peaks.table_peak('NVIDIA H100 80GB HBM3', 'bfloat16') == 989 * tera
  assert peaks.table_peak('NVIDIA H100 PCIe', 'float32') == 378 * tera
  assert peaks.table_peak('NVIDIA H200', 'bfloat16') == 989 * tera
  assert peaks.table_peak('NVIDIA A100-SXM4-80GB', 'float32') == 156 * tera
  assert peaks.table_peak('NVIDIA L4', 'bfloat16') == 121 * tera
  assert peaks.table_peak('Tesla T4', 'float32') == 8.1 * tera
  assert peaks.table_peak('Tesla V100-SXM2-16GB', 'float32') == 15.7 * tera
  assert peaks.table_peak('NVIDIA L40S', 'bfloat16') == 362 * tera  # not the L4's row
  assert peaks.table_peak('NVIDIA A10', 'float32') == 62.5 * tera  # not the A100's
  for no_bf16 in ('Tesla T4', 'Tesla V100-SXM2-16GB'):  # no bfloat16 units: measured instead
    assert peaks.table_peak(no_bf16, 'bfloat16') is None, no_bf16
  assert peaks.table_peak('TPU v4', 'bfloat16') == 275 * tera
  assert peaks.table_peak('TPU v5 lite', 'bfloat16') == 197 * tera
  assert peaks.table_peak('TPU v5', 'float32') == 459 * tera  # v5p
  assert peaks.table_peak('TPU v6 lite', 'bfloat16') == 918 * tera
  for unknown in ('NVIDIA GeForce RTX 4090', 'cpu'):
    assert peaks.table_peak(unknown, 'bfloat16') is None, unknown
  # A CPU (or an unlisted accelerator) measures once; later calls read the cache.
  monkeypatch.setenv('CTR_JAX_CACHE', str(tmp_path))
  monkeypatch.setenv('CTR_JAX_PEAK_FLOPS', '')  # the test suite's nominal peak (conftest.py)
  calls = []
  monkeypatch.setattr(machine, 'matmul_peak',
                      lambda dtype, size, **_: calls.append((dtype, size)) or 5e10)
  device = jax.local_devices()[0]
  assert peaks.peak_flops(device, 'float32') == (5e10, 'measured')
  assert peaks.peak_flops(device, 'float32') == (5e10, 'measured')
  assert peaks.peak_flops(device, 'bfloat16') == (5e10, 'measured')
  assert calls == [('float32', 2048)] * 3 + [('bfloat16', 2048)] * 3  # the best of three
  cached = json.loads((tmp_path / 'peak.json').read_text())
  assert cached == {peaks.machine_key(device): {'float32': 5e10, 'bfloat16': 5e10}}
  monkeypatch.setenv('CTR_JAX_PEAK_FLOPS', '3e11')  # a user's figure overrides both
  assert peaks.peak_flops(device, 'float32') == (3e11, 'CTR_JAX_PEAK_FLOPS')


def test_mfu_is_model_flops_over_time_and_peak_without_evaluation(monkeypatch):
  clock = itertools.chain([100.0], itertools.repeat(104.0))  # created at 100 s, read at 104 s
  monkeypatch.setattr(metrics, 'time', types.SimpleNamespace(perf_counter=lambda: next(clock)))
  speed = metrics.Throughput(tokens_per_step=512, devices=4, peak_flops=1e9)
  speed.step(1e9)
  speed.step(2e9)
  speed.exclude(1.0)  # an evaluation of 1 s between the steps
  assert speed.read() == {'tokens_per_second': 2 * 512 / 3, 'tokens_per_second_per_device':
                          2 * 512 / 3 / 4, 'mfu': 3e9 / (3 * 1e9)}
  assert 'mfu' not in metrics.Throughput(1, 1, None).read()


def test_flops_per_step_count_the_drawn_k_as_the_benchmarks_do(data_dir):
  config = tiny_train_config(data_dir, **{'train.k_min': 1})
  tokens = config.batch_size * config.data.seq_len
  for k in (1, 2, 3):
    assert metrics.flops_per_step(config, k) == tokens * suite.training_flops_per_token(
        config.model, config.data.seq_len, k)
  assert metrics.flops_per_step(config, 3) > metrics.flops_per_step(config, 2)
  bptt = tiny_train_config(data_dir, **{'train.mode': 'bptt'})
  assert metrics.flops_per_step(bptt, 3) == metrics.flops_per_step(config, 1)  # one scan pass
  truncated = tiny_train_config(data_dir, **{'train.grad_iterations': 1})
  assert metrics.flops_per_step(truncated, 3) == tokens * models.training_flops_per_token(
      config.model, config.data.seq_len, 3, grad_iterations=1)


def test_profile_steps_forms():
  assert metrics.profile_range('', 0) is None and metrics.profile_range('0', 7) is None
  assert metrics.profile_range('10,20', 0) == (10, 20)
  assert metrics.profile_range('10,20', 15) == (10, 20)
  assert metrics.profile_range('3', 0) == (1, 4)  # after the first (compiling) step
  assert metrics.profile_range(' 3 ', 40) == (41, 44)  # a resumed run: from its second step
  for bad in ('20,10', '5,5', '-1', 'a', '1,2,3', '1;2'):
    with pytest.raises(ValueError, match='config.profile_steps'):
      metrics.profile_range(bad, 0)
  config = config_lib.get_base()
  config.profile_steps = 'ten'
  with pytest.raises(ValueError, match='config.profile_steps'):
    config_lib.validate(config)
