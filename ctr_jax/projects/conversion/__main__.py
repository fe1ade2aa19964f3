"""A pretrained model converted to a context-ready one and fine-tuned against the original.

The command is in configs/convert_pretrained.py; writes docs/conversion/<model>.json and the
model's generated section of docs/conversion.md.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from ctr_jax.projects.conversion import experiment as convert_pretrained

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'configs/convert_pretrained.py[:arg]',
                                lock_config=True)
flags.mark_flags_as_required(['config'])


def log(message):
  print(message, flush=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # backend INFO lines drown the report
  # pylint: disable-next=g-import-not-at-top
  results = convert_pretrained.run(
      FLAGS.config, ' '.join(['python -m ctr_jax.projects.conversion', *sys.argv[1:]]), log=log)
  log(f"wrote {FLAGS.config.docs_dir}/conversion/{results['model']}.json and "
      f'{FLAGS.config.docs_dir}/conversion.md')


if __name__ == '__main__':
  app.run(main)
