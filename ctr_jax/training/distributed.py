"""Multi-host set-up: `jax.distributed.initialize`, explicit or auto-detected (SLURM, TPU VMs)."""

import os

import jax


def _auto_detected() -> bool:
  slurm = int(os.environ.get('SLURM_NTASKS', '1')) > 1
  tpu_pod = ',' in os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return slurm or tpu_pod


def maybe_initialize(dist_config) -> bool:
  """Initialises the JAX distributed runtime when asked to or when a cluster is detected.

  Must run before anything touches a JAX device. Returns True if initialised.
  """
  explicit = bool(dist_config.coordinator_address)
  if not explicit and not (dist_config.auto and _auto_detected()):
    return False
  if jax.config.jax_platforms in (None, '', 'cpu') and explicit:
    # CPU processes exchange collectives over gloo (TCP); GPUs/TPUs use their own transport.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if explicit:
    jax.distributed.initialize(coordinator_address=dist_config.coordinator_address,
                               num_processes=dist_config.num_processes,
                               process_id=dist_config.process_id)
  else:
    jax.distributed.initialize()
  return True
