"""Multi-host set-up through JAX's own cluster detection, explicit fields overriding (issue 40).

The environments are faked (SLURM variables, a TPU VM's metadata server, GKE's worker list);
`jax.distributed.initialize` is replaced by a recorder, so nothing is really initialised.
"""

import jax
from jax._src.clusters import cloud_tpu_cluster
import ml_collections
import pytest

from ctr_jax import config_lib
from ctr_jax.training import distributed

CLUSTER_VARS = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID',
                'SLURM_LOCALID', 'OMPI_MCA_orte_hnp_uri', 'TPU_WORKER_HOSTNAMES',
                'TPU_PROCESS_ADDRESSES', 'TPU_WORKER_ID', 'MEGASCALE_COORDINATOR_ADDRESS',
                'KUBERNETES_SERVICE_HOST', 'MEGASCALE_NUM_SLICES', 'MEGASCALE_SLICE_ID')


@pytest.fixture(autouse=True)
def plain_machine(monkeypatch):
  """No cluster variables, not a Cloud TPU VM, and a recorder instead of the real initialise."""
  for name in CLUSTER_VARS:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(cloud_tpu_cluster, 'running_in_cloud_tpu_vm', False)
  calls = []
  monkeypatch.setattr(jax.distributed, 'initialize', lambda **kw: calls.append(kw))
  return calls


def _dist(**fields):
  c = config_lib.get_base().distributed
  c.update(fields)
  return c


def _slurm(monkeypatch, ntasks, procid=0):
  monkeypatch.setenv('SLURM_JOB_ID', '4242')
  monkeypatch.setenv('SLURM_STEP_NODELIST', 'gpu[001-002]')
  monkeypatch.setenv('SLURM_NTASKS', str(ntasks))
  monkeypatch.setenv('SLURM_PROCID', str(procid))
  monkeypatch.setenv('SLURM_LOCALID', str(procid % 8))


def test_a_plain_machine_is_never_initialised(plain_machine):
  assert distributed.detect() is None
  assert distributed.plan(_dist()) is None
  assert distributed.maybe_initialize(_dist()) is False
  assert plain_machine == []


def test_slurm_with_several_tasks_initialises_through_jax_detection(monkeypatch, plain_machine):
  _slurm(monkeypatch, ntasks=16, procid=3)
  assert distributed.detect() == distributed.Cluster('slurm', 16)
  assert distributed.maybe_initialize(_dist()) is True
  # JAX's heartbeat comes after ctr_jax's own bound on a lost process (training/preemption.py).
  assert plain_machine == [{'coordinator_address': None, 'num_processes': None,
                            'process_id': None, 'cluster_detection_method': 'slurm',
                            'heartbeat_timeout_seconds': 180}]
  # JAX itself fills in what we left unset from the same variables.
  from_jax = jax._src.clusters.ClusterEnv.auto_detect_unset_distributed_params(
      None, None, None, None, 'slurm', 10)
  assert from_jax[:3] == ('gpu001:' + str(4242 % 2**12 + 65535 - 2**12 + 1), 16, 3)


def test_a_one_task_slurm_step_and_a_prepare_job_do_not_initialise(monkeypatch, plain_machine):
  _slurm(monkeypatch, ntasks=1)
  assert distributed.plan(_dist()) is None
  _slurm(monkeypatch, ntasks=8)
  assert distributed.plan(_dist(), job='prepare') is None  # one worker prepares alone
  assert distributed.plan(_dist(auto=False)) is None
  assert plain_machine == []


def test_explicit_fields_override_the_detected_cluster(monkeypatch):
  _slurm(monkeypatch, ntasks=8, procid=5)
  assert distributed.plan(_dist(num_processes=4, process_id=1)) == {
      'coordinator_address': None, 'num_processes': 4, 'process_id': 1,
      'cluster_detection_method': 'slurm'}
  assert distributed.plan(_dist(coordinator_address='10.0.0.1:1234')) == {
      'coordinator_address': '10.0.0.1:1234', 'num_processes': None, 'process_id': None,
      'cluster_detection_method': 'slurm'}


def test_explicit_fields_without_a_cluster(monkeypatch):
  assert distributed.plan(_dist(coordinator_address='127.0.0.1:5', num_processes=2,
                                process_id=1)) == {
      'coordinator_address': '127.0.0.1:5', 'num_processes': 2, 'process_id': 1}
  # Also for a prepare job: explicit fields are the user's choice.
  assert distributed.plan(_dist(coordinator_address='127.0.0.1:5', num_processes=2,
                                process_id=0), job='prepare') is not None
  with pytest.raises(ValueError, match=r'also needs config.distributed.num_processes and '
                     r'config.distributed.process_id'):
    distributed.plan(_dist(coordinator_address='127.0.0.1:5'))
  with pytest.raises(ValueError, match='need config.distributed.coordinator_address'):
    distributed.plan(_dist(num_processes=2))


def test_gke_tpu_slice_is_detected_from_its_worker_list(monkeypatch, plain_machine):
  monkeypatch.setenv('TPU_WORKER_HOSTNAMES', 'w0,w1,w2,w3')
  monkeypatch.setenv('TPU_WORKER_ID', '2')
  assert distributed.detect() is None  # no TPU chips: not a TPU slice
  monkeypatch.setattr(cloud_tpu_cluster, 'running_in_cloud_tpu_vm', True)
  monkeypatch.setenv('TPU_SKIP_MDS_QUERY', '1')
  monkeypatch.setenv('MEGASCALE_NUM_SLICES', '1')  # GKE sets it; otherwise JAX asks the metadata
  assert distributed.detect() == distributed.Cluster('gketpu', 4)
  assert distributed.maybe_initialize(_dist()) is True
  assert plain_machine[0]['cluster_detection_method'] == 'gketpu'


@pytest.mark.parametrize('workers, initialised', [('10.0.0.2,10.0.0.3', True), ('10.0.0.2', False)])
def test_gce_tpu_vm_pod_is_detected_through_the_metadata_server(monkeypatch, plain_machine,
                                                                workers, initialised):
  """The path launch/tpu_vm.sh takes: no TPU variables, the pod is known to the metadata server."""
  metadata = {'agent-worker-number': '0', 'worker-network-endpoints': workers, 'tpu-env': ''}
  asked = []

  def fake_metadata(key):
    asked.append(key)
    return metadata[key], 200

  monkeypatch.delenv('TPU_SKIP_MDS_QUERY', raising=False)
  monkeypatch.setattr(cloud_tpu_cluster, 'running_in_cloud_tpu_vm', True)
  monkeypatch.setattr(cloud_tpu_cluster, 'get_metadata', fake_metadata)
  assert distributed.detect() == distributed.Cluster('gcetpu', len(workers.split(',')))
  assert distributed.maybe_initialize(_dist()) is initialised
  assert 'agent-worker-number' in asked
  if initialised:
    assert plain_machine == [{'coordinator_address': None, 'num_processes': None,
                              'process_id': None, 'cluster_detection_method': 'gcetpu',
                              'heartbeat_timeout_seconds': 180}]
  else:
    assert plain_machine == []  # a single-host TPU VM


def test_an_unreachable_metadata_server_is_one_line(monkeypatch):
  def broken(key):
    raise ConnectionError(f'cannot reach metadata.google.internal for {key}\n(details)')

  monkeypatch.delenv('TPU_SKIP_MDS_QUERY', raising=False)
  monkeypatch.setattr(cloud_tpu_cluster, 'running_in_cloud_tpu_vm', True)
  monkeypatch.setattr(cloud_tpu_cluster, 'get_metadata', broken)
  with pytest.raises(RuntimeError, match=r'config.distributed.auto: reading the gcetpu cluster '
                     r'environment failed \(cannot reach .*\(details\)\); pass '
                     r'--config.distributed.auto=False') as e:
    distributed.plan(_dist())
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('fields, message', [
    ({'num_processes': 0}, 'distributed.num_processes: must be -1'),
    ({'num_processes': 2, 'process_id': 2}, r'distributed.process_id: must be -1 .* got 2'),
    ({'process_id': -2}, 'distributed.process_id'),
])
def test_config_validation_names_the_field(fields, message):
  config = config_lib.get_base()
  config.distributed.update(fields)
  with pytest.raises(ValueError, match=message):
    config_lib.validate(config)


def test_the_defaults_mean_from_the_cluster():
  c = config_lib.get_base().distributed
  assert (c.auto, c.coordinator_address, c.num_processes, c.process_id) == (True, '', -1, -1)
  assert isinstance(c, ml_collections.ConfigDict)
