"""What the benchmark ran on, and the two ceilings it is compared against.

The peaks are measured in the same run on the same device, not taken from a data sheet:
`matmul_peak` is the best square-matmul rate XLA reaches (the denominator of MFU) and
`memory_bandwidth` the streaming rate of a matrix-vector product over a matrix much larger than
the caches (the denominator of the decode roofline).
"""

import functools
import os
import platform

import jax
import jax.numpy as jnp

from ctr_jax.reporting import cpu_name, timing


def describe() -> dict:
  """CPU model and cores, accelerator devices and library versions."""
  devices = jax.devices()
  versions = {'python': platform.python_version(), 'jax': jax.__version__}
  for name in ('jaxlib', 'flax', 'optax', 'torch', 'transformers'):
    try:
      versions[name] = __import__(name).__version__
    except ImportError:
      pass
  return {'cpu': cpu_name.cpu_name(), 'cores': os.cpu_count(), 'platform': devices[0].platform,
          'devices': f'{len(devices)} x {devices[0].device_kind}', 'versions': versions}


def summary_line(info: dict) -> str:
  libs = ', '.join(f'{k} {v}' for k, v in info['versions'].items())
  return (f"{info['cpu']}, {info['cores']} logical cores; devices: {info['devices']} "
          f"({info['platform']}); {libs}")


def matmul_peak(dtype: str, size: int, *, warmup: int, repeats: int) -> float:
  """FLOP/s of a jitted [size, size] @ [size, size] product in `dtype`, accumulated in float32
  (for bfloat16 the form the models' products take, `kernels.bf16_product`, and the only one
  XLA:CPU sends to bf16 matrix units)."""
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  b = jax.random.normal(jax.random.key(1), (size, size), dtype)
  product = jax.jit(functools.partial(jnp.matmul, preferred_element_type=jnp.float32))
  seconds = timing.median_seconds(lambda: product(a, b), warmup=warmup, repeats=repeats)
  return 2 * size ** 3 / seconds


def memory_bandwidth(megabytes: int, *, warmup: int, repeats: int) -> float:
  """Bytes/s streamed by a float32 matrix-vector product over a `megabytes`-sized matrix."""
  rows = 4096
  cols = max(megabytes * 2 ** 20 // (4 * rows), 1)
  w = jnp.ones((rows, cols), jnp.float32)
  x = jnp.ones((cols,), jnp.float32)
  matvec = jax.jit(jnp.matmul)
  seconds = timing.median_seconds(lambda: matvec(w, x), warmup=warmup, repeats=repeats)
  return w.size * 4 / seconds
