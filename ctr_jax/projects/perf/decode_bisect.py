r"""Decode step time (or training step time) of the peer-shape model at several commits, in
interleaved rounds.

  python -m ctr_jax.projects.perf.decode_bisect --commits=b084e0c,0377b23,HEAD --rounds=2
  python -m ctr_jax.projects.perf.decode_bisect --commits=9d0b22a,HEAD --train   # step ms

Each commit is checked out in a temporary git worktree; every round runs each commit once, in
a fresh process, in rotating order (this machine drifts by 10-15% over minutes, so commits
timed minutes apart are not comparable). Each process times `suite.decode_latency` (marginal
ms per token: 65 minus 1 decode steps after a 16-token prefill, medians of 5 after 2 warm-ups),
or with --train `suite.train_throughput` (ms per training step, T = 256, B = 8, median of 5 after
2 warm-ups), with the code of that commit (the bench configs' module is found where that commit
keeps it). Prints one row per commit: the median over rounds and every
round's figure. Run it on a quiet machine.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from ctr_jax.projects import paths

ROOT = paths.REPO_ROOT


_BASE = ('try:\n  from ctr_jax.bench import configs as base\n'
         'except ImportError:  # commits before the package layout\n'
         '  from configs.bench import base\n'
         'from ctr_jax.bench import suite\n')
CHILD = _BASE + ('print(suite.decode_latency(base.peer_shape(), batch={batch}, prompt_len=16, '
                 'new_tokens=64, warmup=2, repeats=5)["ms_per_token"])')
TRAIN_CHILD = _BASE + ('print(suite.train_throughput(base.peer_shape(), seq_len=256, batch=8, '
                       'k_unroll=0, warmup=2, repeats=5)["step_ms"])')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--commits', default='HEAD')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--train', action='store_true', help='time a training step instead')
  args = parser.parse_args(argv)
  child = TRAIN_CHILD if args.train else CHILD.format(batch=args.batch)
  unit = 'ms/step (train, T = 256, B = 8)' if args.train else f'ms/token (B = {args.batch})'
  commits = args.commits.split(',')
  times = {c: [] for c in commits}
  with tempfile.TemporaryDirectory() as scratch:
    trees = {}
    for c in commits:
      trees[c] = os.path.join(scratch, c.replace('/', '_'))
      subprocess.run(['git', 'worktree', 'add', '--detach', '-f', trees[c], c], cwd=ROOT,
                     check=True, capture_output=True)
    try:
      for r in range(args.rounds):
        shift = r % len(commits)
        for c in commits[shift:] + commits[:shift]:
          out = subprocess.run([sys.executable, '-c', child],
                               cwd=trees[c], env={**os.environ, 'PYTHONPATH': trees[c]},
                               check=True, capture_output=True, text=True)
          times[c].append(float(out.stdout.split()[-1]))
          print(f'round {r + 1}: {c} {times[c][-1]:.3f} {unit}', flush=True)
    finally:
      for tree in trees.values():
        subprocess.run(['git', 'worktree', 'remove', '--force', tree], cwd=ROOT,
                       capture_output=True)
  print(f'\n| commit | {unit}, median | rounds |\n|---|---|---|')
  for c in commits:
    print(f"| {c} | {statistics.median(times[c]):.3f} | "
          f"{', '.join(f'{t:.3f}' for t in times[c])} |")


if __name__ == '__main__':
  main()
