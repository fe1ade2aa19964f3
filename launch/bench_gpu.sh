#!/usr/bin/env bash
# The paper's decode pairs (d5_c1120 vs t12_c768, d1_c2048 vs t6_c1088) in bfloat16 at batch 1
# and 8, paper-size training throughput and a 512-token parallel prefill, on one GPU, in well
# under 10 minutes. Writes the 'gpu' section of docs/benchmarks.md (+ docs/benchmarks_gpu.json).
#
#   bash launch/bench_gpu.sh                  # on a GPU machine with this repo checked out
#   BENCH_CONFIG=configs/bench/tiny.py bash launch/bench_gpu.sh   # smoke run anywhere
#
# Installs JAX with CUDA into ./.venv-gpu unless JAX already sees a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${BENCH_CONFIG:-configs/bench/gpu.py}"
OUTPUT="${BENCH_OUTPUT:-docs/benchmarks.md}"

if ! python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null \
    && [[ "${CONFIG}" == *gpu.py ]]; then
  python -m venv .venv-gpu
  # shellcheck disable=SC1091
  source .venv-gpu/bin/activate
  pip install -q -e . "jax[cuda12]"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec python -m ctr_jax.bench --config="${CONFIG}" --output="${OUTPUT}"
