"""The CPU's model name and the GPUs, without importing JAX: launch drivers record them in their
ledgers too."""

import platform
import shutil
import subprocess


def cpu_name() -> str:
  """/proc/cpuinfo's first "model name" (Linux), else what `platform` reports."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def gpu_names() -> str:
  """'1 x NVIDIA H200' from `nvidia-smi`, '' where it is missing or lists none. Asked of the
  driver rather than of JAX: a launch driver that initialised the GPU would hold its memory
  while the trainers it starts need it."""
  if not shutil.which('nvidia-smi'):
    return ''
  try:
    listed = subprocess.run(['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
                            capture_output=True, text=True, timeout=30, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return ''
  names = [line.strip() for line in listed.splitlines() if line.strip()]
  return ', '.join(f'{names.count(n)} x {n}' for n in dict.fromkeys(names))
