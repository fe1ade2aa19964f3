"""Command-line entry point: python -m ctr_jax.main --config=configs/NAME.py[:arg] --workdir=DIR.

Kept short on purpose: the logic lives in importable libraries (ctr_jax.trainer) that notebooks and
tests call directly. The job (train / evaluate / generate) is chosen by `config.job`.
"""

import os
import sys

from absl import app, flags, logging
import jax
from ml_collections import config_flags

from ctr_jax import config_lib, trainer
from ctr_jax.training import distributed, preemption

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and summaries.')
config_flags.DEFINE_config_file('config', None, 'Experiment config file (get_config(arg)).',
                                lock_config=True)
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not any(a.startswith(('--verbosity', '-v')) for a in sys.argv[1:]):
    logging.set_verbosity(logging.WARNING)  # library INFO logs (orbax, grain) drown the progress bar
  try:
    if distributed.maybe_initialize(FLAGS.config.distributed, FLAGS.config.job):
      # A lost process ends the others in one line within a bound (training/preemption.py).
      preemption.watch_peers(FLAGS.config.distributed, FLAGS.workdir)
    logging.info('JAX process %d/%d, devices: %s', jax.process_index(), jax.process_count(),
                 jax.devices())
    summary = trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    if summary.get('signal') == 'SIGINT':
      # What was saved is said; 128 + SIGINT, as a shell expects of a program stopped by Ctrl-C,
      # so that `a && b` and shell loops stop too. SIGTERM (preemption) ends with 0.
      sys.exit(130)
  except (ValueError, OSError, RuntimeError) as e:
    preemption.settle()  # a lost process, not the collective that failed with it, is the error
    # One line, no traceback (CTR_JAX_TRACEBACK=1 shows it). Exit 2: the input (config, flags,
    # workdir) is wrong; 3: the run failed (NaN, damaged checkpoint, disk full, I/O error).
    if os.environ.get('CTR_JAX_TRACEBACK'):
      raise
    print(f'ctr_jax: error: {" ".join(str(e).split())}', file=sys.stderr)
    user_error = isinstance(e, (ValueError, FileNotFoundError, PermissionError))
    sys.exit(2 if user_error else 3)
  finally:
    preemption.stop_watching()


def parse_flags(argv):
  """absl flag parsing whose errors (bad config file, arg or override) end as one line."""
  try:  # before absl, whose message for a missing field would not say where it went
    config_lib.check_moved_overrides(argv[1:])
  except ValueError as e:
    print(f'ctr_jax: error: {e}', file=sys.stderr)
    sys.exit(2)
  return config_lib.parse_flags_one_line_errors(FLAGS, argv, 'ctr_jax')


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
