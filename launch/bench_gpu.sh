#!/usr/bin/env bash
# The GPU benchmark in one device call (configs/bench/gpu.py): batch-1 decode of the paper's pairs
# (d5_c1120 vs t12_c768, d1_c2048 vs t6_c1088) beside the paper's A100 ratios, training tokens/s
# and MFU of d5_c1120, t12_c768 and t6_c1088 at the paper's batch (64 x 256, K = 5), and the time
# to the first token after 512- and 2,048-token prompts (exact scan, chunked fixed point, a
# transformer's parallel prefill); bfloat16 products, float32 parameters. Writes the 'gpu'
# section of docs/benchmarks.md and docs/benchmarks_gpu.json after every row, so a run stopped
# from outside keeps what it measured.
#
#   bash launch/bench_gpu.sh            # on a GPU machine, from a checkout (no pip install needed)
#   bash launch/bench_gpu.sh --smoke    # every section at toy sizes on any machine; writes to a
#                                       # temporary folder (BENCH_OUTPUT=path.md to choose)
#
# Finishes in under 8 minutes: ~10 s of checks, then the bench under a 400 s budget (decode 90 s,
# train 130 s, ttft 180 s; an item whose estimate would overrun is skipped with a note), and
# `timeout` stops it at BENCH_TIMEOUT_S (455 s) whatever happens. What a run needs besides the
# repository, and how the budgets were derived: launch/README.md, "The GPU benchmark". A missing
# package or a JAX without a GPU is one line on stderr and exit status 3. Extra arguments go to
# `python -m ctr_jax.bench` (e.g. --config.sections=decode).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
SMOKE=0
ARGS=()
for arg in "$@"; do
  if [[ "${arg}" == --smoke ]]; then SMOKE=1; else ARGS+=("${arg}"); fi
done

if (( SMOKE )); then
  CONFIG="configs/bench/gpu.py:smoke"
  OUTPUT="${BENCH_OUTPUT:-$(mktemp -d)/benchmarks.md}"
  LIMIT="${BENCH_TIMEOUT_S:-0}"  # 0: no limit
  "${PYTHON}" -m ctr_jax.bench.preflight || exit 3
else
  CONFIG="${BENCH_CONFIG:-configs/bench/gpu.py}"
  OUTPUT="${BENCH_OUTPUT:-docs/benchmarks.md}"
  LIMIT="${BENCH_TIMEOUT_S:-455}"
  "${PYTHON}" -m ctr_jax.bench.preflight --gpu || exit 3
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
fi

# Most of the GPU's memory for one process (d5_c1120's step needs tens of GiB without remat), and
# a compilation cache, so that a second run on the same machine skips most compilation.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/ctr_jax/jax_compilation}"

START=${SECONDS}
STATUS=0
timeout -k 10 "${LIMIT}" "${PYTHON}" -m ctr_jax.bench --config="${CONFIG}" --output="${OUTPUT}" \
  ${ARGS[@]+"${ARGS[@]}"} || STATUS=$?
JSON="${OUTPUT%.md}_gpu.json"
if (( STATUS == 124 || STATUS == 137 )); then
  echo "bench_gpu.sh: stopped at the ${LIMIT} s limit; the rows it finished are in ${OUTPUT} and ${JSON}" >&2
elif (( STATUS == 0 )); then
  echo "bench_gpu.sh: ${OUTPUT} and ${JSON} written in $(( SECONDS - START )) s"
fi
exit "${STATUS}"
