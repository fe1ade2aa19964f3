"""Multi-host set-up: `jax.distributed.initialize`, from our explicit fields or JAX's own detection.

JAX recognises these clusters by itself (`jax._src.clusters`, checked on jax 0.10.2), in this
order: Open MPI (`mpirun`: OMPI_MCA_orte_hnp_uri), SLURM (`srun`: SLURM_JOB_ID,
SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID), a TPU slice on GKE
(TPU_WORKER_HOSTNAMES or TPU_PROCESS_ADDRESSES) and a TPU VM pod slice on GCE (the metadata server's
`agent-worker-number` and `worker-network-endpoints`; both TPU kinds only where JAX found TPU chips).
With `config.distributed.auto`, a run initialises through that detection (no arguments) when the
cluster has more than one process; a single machine, a one-task SLURM step and a single-host TPU VM
are never initialised. JAX's Kubernetes detection is not used automatically: it holds for any pod (a
notebook server's too) and queries the Kubernetes API; give the explicit fields there.

Explicit fields override: `coordinator_address` initialises explicitly (with `num_processes` and
`process_id`, which a detected cluster may fill in when they are -1), and `num_processes` /
`process_id` >= 0 replace what the detection would give. A `prepare` job builds the data only and
needs no other process: it never initialises by detection (so one worker of a pod can prepare
alone), only with an explicit `coordinator_address`.
"""

import dataclasses

import jax
from jax._src import clusters as jax_clusters

from ctr_jax.training import preemption

# JAX's cluster environments (`ClusterEnv.name`) that `auto` uses, in JAX's own order of detection.
AUTO_CLUSTERS = ('ompi', 'slurm', 'gketpu', 'gcetpu')


@dataclasses.dataclass(frozen=True)
class Cluster:
  name: str           # JAX's cluster_detection_method
  num_processes: int  # as the cluster reports it


def detect() -> Cluster | None:
  """The cluster JAX would initialise from (one of `AUTO_CLUSTERS`), or None."""
  for env in jax_clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if env.name not in AUTO_CLUSTERS or env.opt_in_only_method:
      continue
    try:
      if not env.is_env_present():
        continue
      count = int(env.get_process_count())
    except Exception as e:  # pylint: disable=broad-except  (requests, metadata, env parsing)
      raise RuntimeError(
          f'config.distributed.auto: reading the {env.name} cluster environment failed '
          f'({" ".join(str(e).split()) or type(e).__name__}); pass --config.distributed.auto=False '
          'on a single machine, or the explicit config.distributed fields') from None
    return Cluster(env.name, count)
  return None


def _set(value) -> int | None:
  return None if value is None or int(value) < 0 else int(value)


def plan(dist_config, job: str = 'train') -> dict | None:
  """The keyword arguments for `jax.distributed.initialize`, or None: do not initialise.

  Raises a one-line ValueError for fields that cannot work (explicit process fields without a
  coordinator or a cluster to complete them).
  """
  coordinator = (dist_config.coordinator_address or '').strip()
  num_processes = _set(dist_config.num_processes)
  process_id = _set(dist_config.process_id)
  cluster = None
  if dist_config.auto and (job != 'prepare' or coordinator):
    cluster = detect()
  if coordinator:
    missing = [f for f, v in (('num_processes', num_processes), ('process_id', process_id))
               if v is None]
    if missing and cluster is None:
      raise ValueError(
          f'config.distributed.coordinator_address={coordinator!r} also needs '
          f'{" and ".join("config.distributed." + f for f in missing)} (no cluster that JAX '
          'recognises was detected to fill them in): set num_processes >= 1 and process_id in '
          '[0, num_processes)')
    kwargs = {'coordinator_address': coordinator, 'num_processes': num_processes,
              'process_id': process_id}
    if cluster is not None:
      kwargs['cluster_detection_method'] = cluster.name
    return kwargs
  if cluster is not None and (num_processes or cluster.num_processes) > 1:
    return {'coordinator_address': None, 'num_processes': num_processes,
            'process_id': process_id, 'cluster_detection_method': cluster.name}
  if (num_processes or 1) > 1 or process_id:
    raise ValueError(
        f'config.distributed.num_processes={dist_config.num_processes} / process_id='
        f'{dist_config.process_id} need config.distributed.coordinator_address (no multi-process '
        'cluster that JAX recognises was detected); leave them at -1 on a single machine')
  return None


def maybe_initialize(dist_config, job: str = 'train') -> bool:
  """Initialises the JAX distributed runtime when asked to or when a cluster is detected.

  Must run before anything touches a JAX device. Returns True if initialised.
  """
  kwargs = plan(dist_config, job)
  if kwargs is None:
    return False
  # Longer than the bound in which ctr_jax's own watch ends a run that lost a process, so that
  # JAX's abort (a long log) never comes first (ctr_jax/training/preemption.py).
  heartbeat = preemption.heartbeat_seconds(dist_config)
  if jax.config.jax_platforms in (None, '', 'cpu'):
    # CPU processes exchange collectives over gloo (TCP); GPUs/TPUs use their own transport and
    # ignore this setting.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(**kwargs, heartbeat_timeout_seconds=heartbeat)
  return True
