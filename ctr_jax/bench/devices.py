"""The device a benchmark runs on, and its data-sheet bfloat16 peak (the denominator of MFU).

Small and local on purpose: a shared table of GPU/TPU peaks (bf16 and fp32) is to come in
`ctr_jax.reporting`; `peak_flops` is the one function to point at it then.
"""

import re

import jax

from ctr_jax.reporting import cpu_name

# Dense bfloat16 Tensor Core peaks, FLOP/s, from NVIDIA's data sheets. The sheets print the 2:4
# structured-sparsity figure with an asterisk; the dense figure is half of it. First match wins
# (so 'H100 PCIe' before 'H100', 'A100' before 'A10', 'L40S' before 'L4').
BF16_PEAKS = (
    # "NVIDIA H100 Tensor Core GPU" data sheet: H100 PCIe BF16 1,513 TFLOPS with sparsity.
    (r'H100.*PCIe', 756e12),
    # the same sheet: H100 NVL BF16 1,671 TFLOPS with sparsity; "NVIDIA H200" sheet: H200 NVL
    # 1,671.
    (r'H[12]00.*NVL', 835e12),
    # the same sheets: H100 SXM and H200 SXM BF16 1,979 TFLOPS with sparsity (GH200: the same
    # Hopper GPU). nvidia-smi names the SXM parts 'NVIDIA H100 80GB HBM3' and 'NVIDIA H200'.
    (r'H100|H200|GH200', 989e12),
    # "NVIDIA A100 Tensor Core GPU" data sheet: BF16 312 TFLOPS (624 with sparsity), SXM and
    # PCIe, 40 and 80 GB.
    (r'A100', 312e12),
    # "NVIDIA L40S" data sheet: BF16 362.05 TFLOPS (733 with sparsity).
    (r'L40S', 362e12),
    # "NVIDIA L4" data sheet: BF16 242 TFLOPS with sparsity.
    (r'\bL4\b', 121e12),
    # "NVIDIA A10" data sheet: BF16 125 TFLOPS (250 with sparsity).
    (r'\bA10\b', 125e12),
)


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
  has none (every CPU, float32 products, a GPU not listed): MFU then uses the measured peak."""
  if dtype != 'bfloat16':
    return None
  for pattern, peak in BF16_PEAKS:
    if re.search(pattern, kind):
      return peak
  return None
