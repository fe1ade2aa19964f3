"""The peak FLOP/s of one device, the denominator of the trainer's MFU: a vendor figure for common
GPUs and TPUs, otherwise (a CPU, an unlisted accelerator) a matmul rate measured once on this
machine and cached in `~/.cache/ctr_jax/peak.json` (`$CTR_JAX_CACHE` moves the directory).
`$CTR_JAX_PEAK_FLOPS` (FLOP/s of one device) overrides both.

MFU = model FLOPs per step / (step seconds x `mesh_peak_flops(mesh, dtype)`: devices x
`peak_flops(device, dtype)`).
"""

import json
import os
import re

import jax

from ctr_jax.reporting import cpu_name, machine

TERA = 1e12

# Dense (no structured sparsity) peaks per device, in TFLOP/s, from the vendors' data sheets; the
# one table of them (`ctr_jax.bench.devices` reads its bfloat16 column):
#   A100: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
#   H100 (SXM, PCIe, NVL): https://www.nvidia.com/en-us/data-center/h100/
#   H200 (SXM, NVL): https://www.nvidia.com/en-us/data-center/h200/ (GH200: the same Hopper GPU)
#   L40S: https://www.nvidia.com/en-us/data-center/l40s/
#   L4: https://www.nvidia.com/en-us/data-center/l4/
#   A10: https://www.nvidia.com/en-us/data-center/products/a10-gpu/
#   T4: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf
#   V100 (SXM2, PCIe): https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
#   TPU v4, v5e, v5p, v6e (Trillium): https://cloud.google.com/tpu/docs/v4,
#     .../v5e, .../v5p, .../v6e (bf16 per chip)
# The NVIDIA sheets print the 2:4 structured-sparsity figure (with an asterisk) next to the dense
# one from Ampere on: these are the dense ones (half of it). 'float32' is what a float32 matmul
# runs at under JAX's default precision, which "leans toward speed"
# (https://docs.jax.dev/en/latest/201/precision.html): TF32 tensor cores from Ampere on, one
# bfloat16 pass on a TPU (whose sheets list bf16 only). V100 and T4 have no bfloat16 units:
# no 'bfloat16' entry (None), so a bf16 run there measures its peak.
PEAK_TFLOPS = (
    # (pattern on the device_kind, any case; bfloat16; float32), the first match wins (so
    # 'H100 PCIe' before 'H100'; 'L40S' and 'L4', 'A100' and 'A10' are told apart by \b)
    (r'h100.*pcie', 756.0, 378.0),
    (r'h[12]00.*nvl', 835.0, 418.0),
    (r'h100|h200', 989.0, 494.0),  # nvidia-smi: 'NVIDIA H100 80GB HBM3', 'NVIDIA H200'; GH200
    (r'a100', 312.0, 156.0),
    (r'l40s', 362.0, 183.0),
    (r'\bl4\b', 121.0, 60.0),
    (r'\ba10\b', 125.0, 62.5),
    (r'\bt4\b', None, 8.1),
    (r'v100.*pcie', None, 14.0),
    (r'v100', None, 15.7),
    (r'tpu v4', 275.0, 275.0),
    (r'tpu v5 ?(lite|e)', 197.0, 197.0),
    (r'tpu v5', 459.0, 459.0),  # v5p reports 'TPU v5'
    (r'tpu v6 ?(lite|e)', 918.0, 918.0),
)


def table_peak(device_kind: str, dtype: str) -> float | None:
  """FLOP/s of `PEAK_TFLOPS` for a device kind (e.g. 'NVIDIA H100 80GB HBM3') and 'bfloat16' or
  'float32' (float16 counts as bfloat16), or None when the table does not list it."""
  column = 2 if dtype in ('float32', 'float64') else 1
  for row in PEAK_TFLOPS:
    if re.search(row[0], device_kind, re.IGNORECASE):
      return None if row[column] is None else row[column] * TERA
  return None


def cache_path() -> str:
  root = os.environ.get('CTR_JAX_CACHE') or os.path.join(os.path.expanduser('~'), '.cache',
                                                         'ctr_jax')
  return os.path.join(root, 'peak.json')


def machine_key(device) -> str:
  """What a measured peak is cached under: the CPU's model and the cores this process may use,
  or an accelerator's device kind."""
  if device.platform == 'cpu':
    try:
      cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
      cores = os.cpu_count()
    return f'{cpu_name.cpu_name()} ({cores} cores)'
  return f'{device.platform}: {device.device_kind}'


def measured_peak(device, dtype: str) -> float:
  """The best matmul rate XLA reaches on `device` in `dtype` (`machine.matmul_peak`, as the
  benchmarks measure their ceiling), measured on the first call and read from the cache after
  (delete the file to measure again, e.g. after a change of machine load or JAX version)."""
  path, key = cache_path(), machine_key(device)
  try:
    with open(path) as f:
      cached = json.load(f)
  except (OSError, ValueError):
    cached = {}
  value = cached.get(key, {}).get(dtype) if isinstance(cached.get(key), dict) else None
  if isinstance(value, (int, float)) and value > 0:
    return float(value)
  size = 2048 if device.platform == 'cpu' else 8192
  with jax.default_device(device):  # the best of three medians: a moment of load is not kept
    value = max(machine.matmul_peak(dtype, size, warmup=1, repeats=3) for _ in range(3))
  cached = {**cached, key: {**(cached.get(key) or {}), dtype: value}}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f'{path}.{os.getpid()}.tmp'  # atomic: runs starting together never see half a file
  with open(tmp, 'w') as f:
    json.dump(cached, f, indent=1, sort_keys=True)
  os.replace(tmp, path)
  return value


def peak_flops(device, dtype: str) -> tuple[float, str]:
  """(peak FLOP/s of one device in `dtype`, where it came from: 'table', 'measured' or
  'CTR_JAX_PEAK_FLOPS')."""
  given = os.environ.get('CTR_JAX_PEAK_FLOPS', '').strip()
  if given:
    return float(given), 'CTR_JAX_PEAK_FLOPS'
  dtype = 'bfloat16' if dtype == 'float16' else dtype
  if device.platform != 'cpu':
    value = table_peak(device.device_kind, dtype)
    if value is not None:
      return value, 'table'
  return measured_peak(device, dtype), 'measured'


def mesh_peak_flops(mesh: jax.sharding.Mesh, dtype) -> float:
  """The peak FLOP/s of all the devices of `mesh` in `dtype` (a training run's MFU denominator):
  `peak_flops` of this process's first device in it times the devices. CPU devices of one
  process share its cores, whose measured rate is the peak of them all: one per process."""
  device = next(d for d in mesh.devices.flat if d.process_index == jax.process_index())
  one = peak_flops(device, str(dtype))[0]
  return one * (jax.process_count() if device.platform == 'cpu' else mesh.size)
