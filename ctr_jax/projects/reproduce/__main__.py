"""Reproduces the CRT paper's claims at CPU scale: one command per study (docs/reproduction.md).

  python -m ctr_jax.projects.reproduce --study=table1 --seeds=3    # train what is missing, then report
  python -m ctr_jax.projects.reproduce --study=k_min --seeds=3
  python -m ctr_jax.projects.reproduce --study=table1 --report_only # re-read finished runs only
  python -m ctr_jax.projects.reproduce --study=table1 --jobs=2     # two runs at a time
  python -m ctr_jax.projects.reproduce --list                       # every study's runs and commands
  python -m ctr_jax.projects.reproduce --status --study=table1      # finished, at step S of N, not started

Studies: table1, seq_vs_parallel, k_eval, k_min, conversion, width, ablations and, beyond the
paper, grad_iterations (backpropagating through the last m of K iterations only).

Each run is `python -m ctr_jax.main --config=configs/repro.py:...` in its own workdir under
--root; finished runs are skipped and an interrupted one resumes from its checkpoint when the
study is run again. A study writes docs/reproduction/NAME.json (every run: its commands, config,
seed, steps, tokens, wall time, final and per-evaluation validation loss/PPL) and regenerates its
section of docs/reproduction.md (table, figure, one-line verdict). Numbers in that doc come only
from those files. The scale (V = 2,048 on the KJV corpus, C = 64-320, T = 64-256, about a million
training tokens per run) is stated in each section.
"""

import os
import sys

from absl import app, flags, logging

from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce import registry as repro_registry
from ctr_jax.projects.reproduce import studies as repro_studies

FLAGS = flags.FLAGS
flags.DEFINE_string('study', None, f'One of {sorted(repro_registry.STUDIES)}.')
flags.DEFINE_integer('seeds', 3, 'Seeds per group (0, 1, ...).')
flags.DEFINE_string('root', os.path.join(repro_lib.ROOT, 'workdirs', 'repro'), 'Workdirs root.')
flags.DEFINE_string('docs', os.path.join(repro_lib.ROOT, 'docs'), 'Where the report goes.')
flags.DEFINE_bool('report_only', False, 'Only aggregate finished runs.')
flags.DEFINE_bool('list', False, 'Print every run of --study (or of all studies) and exit.')
flags.DEFINE_bool('status', False, 'Print where each run of --study (or of all studies) stands '
                  '(finished, at its latest checkpoint, not started) and exit; trains nothing.')
flags.DEFINE_enum('scale', 'cpu', sorted(repro_studies.SCALES), 'Sizes and steps (tiny: tests).')
flags.DEFINE_list('only', [], 'Train only the groups whose name contains one of these '
                  "strings, e.g. --only='~1M', or is one ending in $, e.g. --only='~4M N=2 C=376$' "
                  '(the report still reads every finished run).')
flags.DEFINE_integer('jobs', 1, 'Runs trained at once (>= 1): on a CPU each pinned to its share '
                     "of the cores, on a GPU sharing it (each run's output then in <workdir>.log).")
flags.DEFINE_multi_string('extra', [], 'Extra flags for every run, e.g. '
                          '--extra=--config.data.data_dir=/data (recorded in each command).')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax's and TFDS's INFO lines drown the report
  scale = repro_studies.SCALES[FLAGS.scale]
  names = [FLAGS.study] if FLAGS.study else sorted(repro_registry.STUDIES)
  for name in names:
    if name not in repro_registry.STUDIES:
      refuse(f'--study={name!r}: allowed {sorted(repro_registry.STUDIES)}')
  if FLAGS.jobs < 1:
    refuse(f'--jobs={FLAGS.jobs}: allowed 1 or more')
  if FLAGS.list:
    for name in names:
      for run in repro_registry.STUDIES[name].runs(scale, FLAGS.seeds):
        print(' '.join(run.command(FLAGS.root, tuple(FLAGS.extra))))
    return
  if FLAGS.status:
    for name in names:
      print_status(name, scale)
    return
  if not FLAGS.study:
    refuse('--study is required (or --list, --status)')
  report = repro_registry.run_study(FLAGS.study, scale, FLAGS.seeds, FLAGS.root, FLAGS.docs,
                                    tuple(FLAGS.extra), train=not FLAGS.report_only,
                                    only=tuple(FLAGS.only), jobs=FLAGS.jobs)
  print(report)


def print_status(name: str, scale) -> None:
  """A line per run of `name` that --seeds and --only pick, then the command that trains the rest
  (it resumes runs from their checkpoints)."""
  states = repro_registry.run_states(name, scale, FLAGS.seeds, FLAGS.root, FLAGS.docs,
                                     tuple(FLAGS.extra), tuple(FLAGS.only))
  done = sum(state.startswith('finished') for _, state in states)
  print(f'{name}: {done}/{len(states)} runs finished')
  for run, state in states:
    print(f'  {state:<30} {run.group} (seed {run.seed})')
  if done < len(states):
    only = f" --only='{','.join(FLAGS.only)}'" if FLAGS.only else ''
    print(f'  the rest: python -m ctr_jax.projects.reproduce --study={name} '
          f'--seeds={FLAGS.seeds}{only}')


def refuse(message: str):
  """Bad input: one line, exit code 2, nothing run or written."""
  print(f'reproduce: error: {message}', file=sys.stderr)
  sys.exit(2)


def parse_flags(argv):
  try:
    return FLAGS(argv)
  except flags.Error as e:  # an unknown flag, a value of the wrong type or outside an enum
    refuse(str(e).splitlines()[0])


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
