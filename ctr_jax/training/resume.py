"""What a resumed run must share with its checkpoint beyond the model: the data position.

The data iterator's saved state counts *global batches* of the checkpoint's batch_size and
seq_len, drawn from windows shuffled with its seed (ctr_jax/data/pipeline.py). The same count
with another batch size, window length or shuffle points elsewhere in the data: a smaller batch
replays windows already trained on, a larger one skips some, another seed reorders them. Such a
resume is refused, in one line naming the field, like an optimizer change
(`config_lib.check_resumable`).
"""

# The fields that give the saved data position its meaning, as config paths.
DATA_POSITION_FIELDS = ('batch_size', 'data.seq_len', 'seed')


def _lookup(config, dotted: str):
  node = config
  for part in dotted.split('.'):
    if part not in node:
      return None  # a field the saved config lacks: nothing to compare
    node = node[part]
  return node


def data_position_changes(saved_config: dict, config) -> list[tuple[str, object, object]]:
  """(field, saved, current) for each DATA_POSITION_FIELDS value that differs from the saved."""
  changes = []
  for field in DATA_POSITION_FIELDS:
    saved, current = _lookup(saved_config, field), _lookup(config, field)
    if saved is not None and saved != current:
      changes.append((field, saved, current))
  return changes


def check_data_position(saved_config: dict, config, workdir: str) -> None:
  """Raises a one-line ValueError when resuming training in `workdir` would mix up the data."""
  if config.job != 'train':  # evaluation and sampling do not read the training stream
    return
  changes = data_position_changes(saved_config, config)
  if changes:
    fields = ', '.join(f'config.{f}={c!r} (the checkpoint has {s!r})' for f, s, c in changes)
    flags = ' '.join(f'--config.{f}={s!r}' for f, s, _ in changes)
    raise ValueError(
        f'{fields}: the data position saved in {workdir} counts batches of the checkpoint\'s '
        f'batch_size and data.seq_len in the order of its seed, so this resume would train on '
        f'windows again or skip some; pass {flags} to resume, or use a new --workdir')
