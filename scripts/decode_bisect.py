r"""Batch-1 decode step time of the peer-shape model at several commits, in interleaved rounds.

  python scripts/decode_bisect.py --commits=b084e0c,0377b23,HEAD --rounds=2

Each commit is checked out in a temporary git worktree; every round runs each commit once, in
a fresh process, in rotating order (this machine drifts by 10-15% over minutes, so commits
timed minutes apart are not comparable). Each process times `suite.decode_latency` (marginal
ms per token: 65 minus 1 decode steps after a 16-token prefill, medians of 5 after 2 warm-ups)
with the code of that commit. Prints one row per commit: the median over rounds and every
round's figure. Run it on a quiet machine.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = ('from configs.bench import base; from ctr_jax.bench import suite; '
         'print(suite.decode_latency(base.peer_shape(), batch={batch}, prompt_len=16, '
         'new_tokens=64, warmup=2, repeats=5)["ms_per_token"])')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--commits', default='HEAD')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--batch', type=int, default=1)
  args = parser.parse_args(argv)
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
          out = subprocess.run([sys.executable, '-c', CHILD.format(batch=args.batch)],
                               cwd=trees[c], env={**os.environ, 'PYTHONPATH': trees[c]},
                               check=True, capture_output=True, text=True)
          times[c].append(float(out.stdout.split()[-1]))
          print(f'round {r + 1}: {c} {times[c][-1]:.3f} ms/token', flush=True)
    finally:
      for tree in trees.values():
        subprocess.run(['git', 'worktree', 'remove', '--force', tree], cwd=ROOT,
                       capture_output=True)
  print(f'\n| commit | B = {args.batch} ms/token (median) | rounds |\n|---|---|---|')
  for c in commits:
    print(f"| {c} | {statistics.median(times[c]):.3f} | "
          f"{', '.join(f'{t:.3f}' for t in times[c])} |")


if __name__ == '__main__':
  main()
