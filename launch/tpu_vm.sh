#!/usr/bin/env bash
# TPU VM (single host or pod slice): the same command on every worker; jax.distributed
# initialises itself from the TPU environment.
#
#   bash launch/tpu_vm.sh my-tpu us-central2-b configs/d5_c1120.py /mnt/shared/workdirs/d5 \
#       --config.data.manual_dir=/mnt/shared/raw/openwebtext
#
# Assumes the repository is cloned at ~/ctr_jax on every worker and that WORKDIR and the data
# directory are on a filesystem all workers share (e.g. a Filestore/NFS mount).
set -euo pipefail
TPU_NAME="${1:?usage: bash launch/tpu_vm.sh TPU_NAME ZONE CONFIG WORKDIR [--config.x=y ...]}"
ZONE="${2:?zone}"
CONFIG="${3:?config}"
WORKDIR="${4:?workdir}"
shift 4
EXTRA="$*"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker=all --command "
  set -e
  cd ~/ctr_jax
  python3 -m pip install -q -e . 'jax[tpu]'
  TFDS_DATA_DIR=\${TFDS_DATA_DIR:-/mnt/shared/tensorflow_datasets} \
    bash launch/run.sh --config=$CONFIG --workdir=$WORKDIR $EXTRA
"
