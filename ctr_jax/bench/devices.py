"""The device a benchmark runs on, and its data-sheet bfloat16 peak (the denominator of MFU):
the bfloat16 column of `ctr_jax.reporting.peaks.PEAK_TFLOPS`, the table the trainer's MFU uses.
"""

import jax

from ctr_jax.reporting import cpu_name, peaks


def device_kind() -> str:
  """JAX's name of the first device ('NVIDIA H100 80GB HBM3', 'cpu', 'TPU v5 lite')."""
  return jax.devices()[0].device_kind


def device_name() -> str:
  """The accelerator the benchmark runs on, as a reader knows it: the device kind of a GPU or
  TPU (the name nvidia-smi prints), the CPU's model name on a CPU."""
  device = jax.devices()[0]
  if device.platform == 'cpu':
    return f'{cpu_name.cpu_name()} (cpu)'
  return device.device_kind


def peak_flops(kind: str, dtype: str) -> float | None:
  """The data-sheet dense peak of device `kind` for products in `dtype`; None where the table
  has none (every CPU, float32 products, a GPU without bfloat16 units or not listed): MFU then
  uses the measured peak."""
  if dtype != 'bfloat16':
    return None
  return peaks.table_peak(kind, 'bfloat16')
