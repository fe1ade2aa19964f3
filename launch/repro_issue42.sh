#!/usr/bin/env bash
# Issue 42's runs in the issue's order (docs/reproduction.md): table1's item 1 at ~1M FLOPs/token,
# the ~1M seeds not run yet, the ~0.25M level (3 seeds of every row), the ~4M level (one seed),
# the best ~1M pair for 3x the steps; then 3 seeds of the other studies.
#
#   nohup taskset -c 1 bash launch/repro_issue42.sh > run_item1.log 2>&1 &
#
# Arguments, if any, replace the list below; JOBS=N trains N runs at a time (--jobs: on a CPU
# each on its share of the cores, on a GPU sharing it):
#   JOBS=2 nohup bash launch/repro_issue42.sh '3:~0.25M' '3:3600 steps' > run.log 2>&1 &
#
# One call of python -m ctr_jax.projects.reproduce per entry, in this order, each training the
# missing seeds of the groups whose name contains GROUP (SEEDS:GROUP for table1,
# SEEDS:GROUP@STUDY for another study; an empty GROUP is every group; GROUP ending in $ names one
# group whole); after each call the
# study's json, figures and section of docs/reproduction.md are committed (COMMIT=0: not). Resumable:
# run it again; finished runs are skipped (a finished workdir, or their record in the committed
# docs/reproduction/table1.json), an interrupted run resumes from its latest checkpoint.
set -u
shopt -s nullglob  # a study without figures has no png to commit
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
COMMIT=${COMMIT:-1}
ONLY=(
  '3:~1M N=1'        # N = 1 among the inference-matched transformers
  '3:~1M N=2 C=288 train-matched'  # N = 2 widened to the D = 1 CRT's training FLOPs per token
  '3:~1M N=2 C=160 3148 steps'     # N = 2 C = 160 trained for the D = 1 CRT's total training FLOPs
  '3:~1M D=1 C=176 m=2'            # the D = 1 CRT backpropagating through the last 2 of K
  '3:~1M D=2' '3:~1M D=3' '3:~1M N=3' '3:~1M N=4' '3:~1M N=6'  # their seeds 1 and 2
  '3:~0.25M'         # the cheap level: every row, compute-matched ones included
  '1:~4M'            # the large level: one seed of every row first
  '3:3600 steps'     # item 4: the best ~1M CRT and transformer for 3x the steps
  '3:@k_min' '3:@seq_vs_parallel' '3:@k_eval' '3:@conversion'  # item 3: their seeds 1 and 2
  '3:width @width'   # the width pairs (not its context-length runs)
)
if [ $# -gt 0 ]; then ONLY=("$@"); fi
for item in "${ONLY[@]}"; do
  seeds=${item%%:*} only=${item#*:} study=table1
  if [[ $only == *@* ]]; then study=${only#*@} only=${only%@*}; fi
  OUTPUTS=(docs/reproduction/$study.json docs/reproduction/$study*.png docs/reproduction.md)
  echo "=== $(date -u +%FT%TZ) python -m ctr_jax.projects.reproduce --study=$study --seeds=$seeds --jobs=${JOBS:-1} --only='$only'"
  "$PYTHON" -m ctr_jax.projects.reproduce --study="$study" --seeds="$seeds" --jobs="${JOBS:-1}" \
    ${only:+--only="$only"}
  echo "=== $(date -u +%FT%TZ) exit code $?"
  if [ "$COMMIT" = 1 ] && ! git diff --quiet -- "${OUTPUTS[@]}"; then
    git add -- "${OUTPUTS[@]}"
    git commit -q -m "$study: the runs of group '${only:-all}' (launch/repro_issue42.sh; numbers in docs/reproduction/$study.json)" -- "${OUTPUTS[@]}"
  fi
done
echo "=== $(date -u +%FT%TZ) done"
