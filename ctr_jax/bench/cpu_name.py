"""The CPU's model name, without importing JAX: launch drivers record it in their ledgers too."""

import platform


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
