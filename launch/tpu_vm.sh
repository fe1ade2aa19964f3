#!/usr/bin/env bash
# TPU VM (single host or pod slice), in three steps over `gcloud compute tpus tpu-vm ssh`:
#   1. every worker installs the repository and jax[tpu];
#   2. worker 0 alone prepares the data (`--config.job=prepare`: dataset, tokenizer and token
#      caches, on all of its cores) while the other workers wait for the ssh to return;
#   3. every worker trains; jax.distributed initialises itself from the TPU VM's metadata
#      (JAX's own detection, ctr_jax/training/distributed.py) and finds the prepared caches.
#
#   bash launch/tpu_vm.sh my-tpu us-central2-b configs/d5_c1120.py /mnt/shared/workdirs/d5 \
#       --config.data.manual_dir=/mnt/shared/raw/openwebtext
#
# Assumes the repository is cloned at ~/ctr_jax on every worker and that WORKDIR and the data
# directory (TFDS_DATA_DIR, default /mnt/shared/tensorflow_datasets) are on a filesystem all
# workers share (e.g. a Filestore/NFS mount). TPU_SKIP_PREPARE=1 skips step 2.
set -euo pipefail
USAGE='usage: bash launch/tpu_vm.sh TPU_NAME ZONE CONFIG WORKDIR [--config.x=y ...]'
TPU_NAME="${1:?$USAGE}"
ZONE="${2:?$USAGE}"
CONFIG="${3:?$USAGE}"
WORKDIR="${4:?$USAGE}"
shift 4
# Quoted for the remote shell, so an argument with spaces stays one argument there.
ARGS="--config=$(printf '%q' "$CONFIG") --workdir=$(printf '%q' "$WORKDIR")"
for arg in "$@"; do ARGS="$ARGS $(printf '%q' "$arg")"; done
SETUP='set -e; cd ~/ctr_jax; export TFDS_DATA_DIR="${TFDS_DATA_DIR:-/mnt/shared/tensorflow_datasets}"'

on_workers() {  # on_workers WORKERS COMMAND
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --worker="$1" --command "$2"
}

on_workers all "$SETUP; python3 -m pip install -q -e . 'jax[tpu]'"
if [[ "${TPU_SKIP_PREPARE:-0}" != 1 ]]; then
  on_workers 0 "$SETUP; bash launch/run.sh $ARGS --config.job=prepare"
fi
on_workers all "$SETUP; bash launch/run.sh $ARGS"
