"""python -m ctr_jax.bench --config=configs/bench/cpu.py [--output=docs/benchmarks.md]

Prints the tables and, with --output (default: the config's `output`), writes the config's
section of that markdown file and the raw numbers to <output stem>_<name>.json (after every row
too where the config's `write_partial` is set).
"""

import os
import shlex
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from ctr_jax import config_lib
from ctr_jax.bench import report, runner, validation

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', 'configs/bench/cpu.py', 'Bench config file.',
                                lock_config=True)
flags.DEFINE_string('output', None, "Markdown file for the results ('' = print only); "
                    "default: the config's `output`.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not any(a.startswith(('--verbosity', '-v')) for a in sys.argv[1:]):
    logging.set_verbosity(logging.WARNING)
  config = FLAGS.config
  # The results record the command as typed, overrides included, not the config's own line.
  config.command = ' '.join(['python -m ctr_jax.bench', *map(shlex.quote, sys.argv[1:])])
  output = config.output if FLAGS.output is None else FLAGS.output
  progress = None
  if output and config.write_partial:  # a run stopped from outside keeps what it measured
    progress = lambda partial: _write(output, config.name, partial)
  try:
    validation.validate(config)
    if output:
      _check_writable(output)
    results = runner.run(config, progress=progress)
  except ValueError as e:
    if os.environ.get('CTR_JAX_TRACEBACK'):
      raise
    print(f'ctr_jax.bench: error: {" ".join(str(e).split())}', file=sys.stderr)
    sys.exit(2)
  section = report.markdown(results)
  print(section)
  if output:
    _write(output, config.name, results, section)
    print(f'wrote the {config.name!r} section of {output} and {_json_path(output, config.name)}')


def _json_path(output: str, name: str) -> str:
  return f'{os.path.splitext(output)[0]}_{name}.json'


def _write(output: str, name: str, results: dict, section: str | None = None) -> None:
  report.write_section(output, name, section or report.markdown(results))
  report.write_json(_json_path(output, name), results)


def _check_writable(path: str) -> None:
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise ValueError(f'--output: cannot create {folder!r}: {e.strerror}') from None
  if not os.access(folder, os.W_OK):
    raise ValueError(f'--output: cannot write to {folder!r}')


def _parse_flags(argv):
  return config_lib.parse_flags_one_line_errors(FLAGS, argv, 'ctr_jax.bench')


if __name__ == '__main__':
  app.run(main, flags_parser=_parse_flags)
