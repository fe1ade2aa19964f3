"""Helpers for experiment configs: `file.py:k=v,...` args, validation and the CPU shrink."""

import ast
import os

import ml_collections

from ctr_jax import models
from ctr_jax import train_step

JOBS = ('train', 'evaluate', 'generate', 'prepare')


def parse_arg(arg: str | None, **spec) -> ml_collections.ConfigDict:
  """Parses 'a=1,b=x,flag' against typed defaults in `spec`; a bare name sets a bool to True.

  >>> parse_arg('runlocal,k=8', runlocal=False, k=5)  # -> {'runlocal': True, 'k': 8}
  """
  values = ml_collections.ConfigDict(dict(spec))
  for item in filter(None, (arg or '').split(',')):
    key, _, raw = item.partition('=')
    key = key.strip()
    if key not in spec:
      raise ValueError(f'config arg {key!r} is unknown; allowed: {sorted(spec)}')
    default = spec[key]
    if not _:
      if not isinstance(default, bool):
        raise ValueError(f'config arg {key!r} needs a value ({key}=...)')
      values[key] = True
      continue
    if isinstance(default, bool):
      values[key] = raw.lower() in ('1', 'true', 'yes', 'on')
    elif isinstance(default, (int, float)):
      try:
        values[key] = type(default)(ast.literal_eval(raw))
      except (ValueError, SyntaxError):
        raise ValueError(f'config arg {key}={raw!r} is not a {type(default).__name__}') from None
    else:
      values[key] = raw
  return values


def default_data_dir() -> str:
  return os.path.expanduser(os.environ.get('TFDS_DATA_DIR', '~/tensorflow_datasets'))


def _check(ok, field, message):
  if not ok:
    raise ValueError(f'config.{field}: {message}')


def validate(config) -> None:
  """Checks a whole experiment config before anything touches the workdir."""
  _check(config.job in JOBS, 'job', f'got {config.job!r}, allowed {list(JOBS)}')
  models.validate(config.model)
  train_step.validate(config.train, config.model)
  from ctr_jax import tasks  # pylint: disable=g-import-not-at-top  (tasks import config_lib)
  tasks.validate_config(config)  # data.name, and the fields of that task
  for field in ('total_steps', 'batch_size', 'log_every', 'eval_every', 'checkpoint_every'):
    _check(int(config[field]) >= 1, field, f'must be >= 1, got {config[field]!r}')
  _check(config.data.seq_len >= 1, 'data.seq_len', 'must be >= 1')
  _check(config.data.seq_len <= config.model.max_len, 'data.seq_len',
         f'{config.data.seq_len} exceeds model.max_len={config.model.max_len}')
  _check(config.optim.lr > 0, 'optim.lr', 'must be > 0')
  _check(0 <= config.optim.warmup_steps, 'optim.warmup_steps', 'must be >= 0')
  _check(0 <= config.optim.min_lr_ratio <= 1, 'optim.min_lr_ratio', 'must be in [0, 1]')
  _check(config.optim.grad_clip >= 0, 'optim.grad_clip', 'must be >= 0 (0 = off)')
  for axis in ('data', 'fsdp', 'tensor'):
    size = config.mesh[axis]
    _check(size == -1 or size >= 1, f'mesh.{axis}', 'must be -1 (all remaining) or >= 1')
  _check([config.mesh[a] for a in ('data', 'fsdp', 'tensor')].count(-1) <= 1, 'mesh',
         'at most one axis may be -1')
  _check(config.sample.num_tokens >= 0, 'sample.num_tokens', 'must be >= 0')
  _check(config.sample.temperature >= 0, 'sample.temperature', 'must be >= 0')
  # Workdir safety (docs/reliability.md): 0 would delete every checkpoint after saving it.
  _check(isinstance(config.keep_checkpoints, int) and config.keep_checkpoints >= 1,
         'keep_checkpoints', f'must be an integer >= 1, got {config.keep_checkpoints!r}')
  _check(config.get('strict_resume', False) in (True, False), 'strict_resume',
         f"got {config.get('strict_resume')!r}, allowed [True, False]")


def check_moved_overrides(argv) -> None:
  """`--config.model.k_min=...` and the other recipe fields now live in `config.train`."""
  for arg in argv:
    name = arg.lstrip('-').split('=', 1)[0]
    if name.startswith('config.model.'):
      models.validate_not_moved([name[len('config.model.'):]])


def shrink_for_cpu(config) -> None:
  """The `:runlocal` arg: a few hundred steps of a small model that runs in minutes on a CPU."""
  keep = {k: config.model[k] for k in ('kind', 'correction', 'cumulative', 'k_unroll', 'block')}
  config.model = models.model_config(
      **keep, width=128, depth=min(config.model.depth, 2) if keep['kind'] == 'context_ready'
      else min(config.model.depth, 4), num_heads=4, vocab_size=2048, max_len=128)
  config.model.k_unroll = min(config.model.k_unroll, 5)
  config.train.k_min = min(config.train.k_min, config.model.k_unroll)
  config.data.name = 'kjv_bible'
  config.data.seq_len = 64
  config.batch_size = 16
  config.total_steps = 200
  config.optim.warmup_steps = 20
  config.optim.lr = 1e-3
  config.log_every = 20
  config.eval_every = 100
  config.checkpoint_every = 100
  config.eval_batches = 4
  config.sample.num_tokens = 32


def parse_flags_one_line_errors(flag_values, argv, program: str):
  """Parses absl flags; a bad config file, arg or override ends as one line and exit code 2."""
  import sys  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    argv = flag_values(argv)
    flag_values.config.get('name')  # a config file that failed to load raises here
    return argv
  except (flags.Error, KeyError, OSError, ValueError, TypeError, AttributeError) as e:
    print(f'{program}: error: {_one_line(e)}', file=sys.stderr)
    sys.exit(2)


def _one_line(error: BaseException) -> str:
  error = error.__cause__ or error
  text = str(error)
  if isinstance(error, KeyError) and error.args:
    text = f'unknown config field {error.args[0]}'
  lines = [l.strip() for l in str(text).splitlines() if l.strip()]
  if any(l.startswith('Traceback') for l in lines):
    lines = lines[-1:]  # a config file that raised: its last line is the actual message
  return ' '.join(l for l in lines if not l.startswith('Pass --helpshort'))
