"""Test set-up: 8 fake CPU devices (for sharding tests) before JAX initialises."""

import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# MFU's peak: a nominal one, not a CPU matmul measured (slowly) under the unoptimised XLA below.
os.environ.setdefault('CTR_JAX_PEAK_FLOPS', '1e12')

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')
# Tests compile many small programs; XLA's optimisation passes would dominate their run time.
jax.config.update('jax_disable_most_optimizations', True)
# Many tests (and their subprocesses) compile the same small programs: share them on disk.
CACHE_DIR = os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', '/tmp/ctr_jax_test_xla_cache')
jax.config.update('jax_compilation_cache_dir', CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


@pytest.fixture
def rng():
  return jax.random.key(0)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """The embedded corpus and a 320-token tokenizer, built once per test module."""
  path = str(tmp_path_factory.mktemp('data'))
  from ctr_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  pipeline.load('kjv_bible', data_dir=path, vocab_size=320)
  return path
