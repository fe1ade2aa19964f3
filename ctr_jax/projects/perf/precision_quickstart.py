"""The quickstart in float32 and in bfloat16 (`config.precision`), one after the other, and their
summary.json numbers side by side in docs/precision_quickstart.json.

  python -m ctr_jax.projects.perf.precision_quickstart                  # the README's quickstart
  python -m ctr_jax.projects.perf.precision_quickstart --arg=runlocal   # its 200-step smoke run

Each run is the README's command with `--config.precision=P` added, in its own process and
workdir (`--workdir_root`, default /tmp/precision_quickstart; an existing workdir resumes, so a
finished run only re-evaluates). `--reuse` takes a workdir that already has its summary.json as
it is (e.g. the two commands were run by hand, side by side). The json keeps the commands, the
machine and each run's summary.json fields, copied as written.
"""

import argparse
import json
import os
import subprocess
import sys

from ctr_jax.projects import paths
from ctr_jax.reporting import machine

PRECISIONS = ('float32', 'bfloat16')
FIELDS = ('step', 'train_loss', 'val_loss', 'val_ppl', 'val_loss_sequential',
          'val_ppl_sequential', 'tokens_per_second', 'wall_time_seconds', 'num_params')


def command(precision: str, workdir: str, arg: str = '') -> list[str]:
  """The README's quickstart command at one precision."""
  config = 'configs/quickstart.py' + (f':{arg}' if arg else '')
  return ['python', '-m', 'ctr_jax.main', f'--config={config}', f'--workdir={workdir}',
          f'--config.precision={precision}']


def run(precision: str, workdir: str, arg: str = '', reuse: bool = False) -> dict:
  """Runs the quickstart at `precision` (output shown as it comes), unless `reuse` and its
  summary.json exists; its summary.json fields."""
  args = command(precision, workdir, arg)
  if not (reuse and os.path.exists(os.path.join(workdir, 'summary.json'))):
    subprocess.run([sys.executable, *args[1:]], cwd=paths.REPO_ROOT, check=True)
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  return {'command': ' '.join(args), **{k: summary[k] for k in FIELDS if k in summary}}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--arg', default='', help="the quickstart config's arg, e.g. 'runlocal'")
  parser.add_argument('--workdir_root', default='/tmp/precision_quickstart')
  parser.add_argument('--reuse', action='store_true',
                      help='take a workdir that has its summary.json as it is')
  parser.add_argument('--note', default='', help='recorded in the json (e.g. the machine load)')
  parser.add_argument('--out', default=os.path.join(paths.REPO_ROOT, 'docs',
                                                    'precision_quickstart.json'))
  args = parser.parse_args(argv)
  runs = {p: run(p, os.path.join(args.workdir_root, p + (f'_{args.arg}' if args.arg else '')),
                 args.arg, args.reuse) for p in PRECISIONS}
  f32, bf16 = runs['float32']['val_loss'], runs['bfloat16']['val_loss']
  result = {'machine': machine.describe(), **({'note': args.note} if args.note else {}),
            'runs': runs,
            'val_loss_bfloat16_minus_float32': bf16 - f32,
            'val_loss_relative_difference': (bf16 - f32) / f32}
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=2)
    f.write('\n')
  print(f'float32 val_loss {f32:.4f}, bfloat16 {bf16:.4f} ({(bf16 - f32) / f32:+.2%}); '
        f'written to {args.out}')
  return result


if __name__ == '__main__':
  main()
