#!/usr/bin/env bash
# Common environment for cluster runs, then `python -m ctr_jax.main "$@"`.
# Usage (from the repository root): bash launch/run.sh --config=configs/d5_c1120.py --workdir=DIR
set -euo pipefail
cd "$(dirname "$0")/.."
# Let JAX take most of each accelerator's memory, but not all (XLA needs scratch space).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
# Overlap collectives with compute on GPUs (ignored on TPUs and CPUs).
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_enable_latency_hiding_scheduler=true}"
# Datasets and tokenizers live here; set it to a shared filesystem on multi-host runs.
export TFDS_DATA_DIR="${TFDS_DATA_DIR:-$HOME/tensorflow_datasets}"
exec python -m ctr_jax.main "$@"
