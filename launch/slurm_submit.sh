#!/usr/bin/env bash
# SLURM: the data is prepared in a CPU-only job, and the GPU job starts only once it succeeded
# (`--dependency=afterok`), so no GPU waits for the preparation.
#
#   bash launch/slurm_submit.sh configs/d5_c1120.py /shared/workdirs/d5_c1120 \
#       --config.data.manual_dir=/shared/raw/openwebtext
#
# Extra sbatch options for each job: PREPARE_SBATCH_ARGS (e.g. "--partition=cpu") and
# GPU_SBATCH_ARGS (e.g. "--partition=gpu --nodes=2").
set -euo pipefail
USAGE='usage: bash launch/slurm_submit.sh CONFIG WORKDIR [--config.x=y ...]'
: "${1:?$USAGE}" "${2:?$USAGE}"
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086
PREPARE_JOB="$(sbatch --parsable ${PREPARE_SBATCH_ARGS:-} launch/slurm_prepare.sbatch "$@")"
PREPARE_JOB="${PREPARE_JOB%%;*}"  # --parsable prints "id" or "id;cluster"
echo "ctr_jax: submitted the data preparation as job $PREPARE_JOB"
# shellcheck disable=SC2086
sbatch --dependency=afterok:"$PREPARE_JOB" --kill-on-invalid-dep=yes ${GPU_SBATCH_ARGS:-} \
    launch/slurm_gpu.sbatch "$@"
