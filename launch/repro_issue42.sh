#!/usr/bin/env bash
# Issue 42's table1 runs in the issue's order (docs/reproduction.md): item 1 at ~1M FLOPs/token,
# the ~1M seeds not run yet, the ~0.25M level (3 seeds of every row), the ~4M level (one seed),
# the best ~1M pair for 3x the steps.
#
#   nohup taskset -c 1 bash launch/repro_issue42.sh > run_item1.log 2>&1 &
#
# One call of python -m ctr_jax.projects.reproduce per group (--only matches group names by
# substring), in this order, each training that group's missing seeds (SEEDS:group, --seeds=SEEDS);
# after each call the study's json,
# figure and section of docs/reproduction.md are committed (COMMIT=0: not committed). Resumable:
# run it again; finished runs are skipped (a finished workdir, or their record in the committed
# docs/reproduction/table1.json), an interrupted run resumes from its latest checkpoint.
set -u
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
)
OUTPUTS=(docs/reproduction/table1.json docs/reproduction/table1.png docs/reproduction.md)
for item in "${ONLY[@]}"; do
  seeds=${item%%:*} only=${item#*:}
  echo "=== $(date -u +%FT%TZ) python -m ctr_jax.projects.reproduce --study=table1 --seeds=$seeds --only='$only'"
  "$PYTHON" -m ctr_jax.projects.reproduce --study=table1 --seeds="$seeds" --only="$only"
  echo "=== $(date -u +%FT%TZ) exit code $?"
  if [ "$COMMIT" = 1 ] && ! git diff --quiet -- "${OUTPUTS[@]}"; then
    git commit -q -m "table1: the runs of group '$only' (launch/repro_issue42.sh; numbers in docs/reproduction/table1.json)" -- "${OUTPUTS[@]}"
  fi
done
echo "=== $(date -u +%FT%TZ) done"
