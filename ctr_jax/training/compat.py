"""Reading what earlier versions of ctr_jax wrote: checkpoints' saved configs and old overrides.

Kept out of the model and config code so their public API is today's; the trainer calls this
when it resumes a run or converts one (`config.init_from`).
"""

import dataclasses

import ml_collections

from ctr_jax import models
from ctr_jax.ops import recurrence

# Training-recipe fields that used to sit in the model config (old checkpoints' saved configs
# still hold them): model field -> its field in the training config `config.train`.
MOVED_TO_TRAIN = {'remat': 'remat', 'k_min': 'k_min', 'convergence_weight': 'convergence_weight',
                  'train_mode': 'mode'}

# What a saved model config means by a field it lacks: the fields added after the first
# release, with the value the model had before each existed. That is the field's default except
# for kernel_layout: checkpoints from before it hold [in, out] 'kernel's.
LEGACY_DEFAULTS = {**{f.name: f.default for f in dataclasses.fields(models.ModelSpec)
                      if f.default is not dataclasses.MISSING},
                   'kernel_layout': 'in_out'}


def check_not_moved(fields) -> None:
  """Raises ValueError for a model field that moved to the training config."""
  moved = [f for f in MOVED_TO_TRAIN if f in fields]
  if moved:
    raise ValueError('; '.join(f'model.{f} moved to the training config: set config.train.'
                               f'{MOVED_TO_TRAIN[f]} instead' for f in moved))


def split_moved_fields(saved_model: dict) -> tuple[dict, dict]:
  """A saved model config without the recipe fields older versions kept there, and those fields
  under their `config.train` names."""
  kept = {k: v for k, v in saved_model.items() if k not in MOVED_TO_TRAIN}
  moved = {MOVED_TO_TRAIN[k]: v for k, v in saved_model.items() if k in MOVED_TO_TRAIN}
  if 'remat' in moved:  # a boolean then: True / False are 'iteration' / 'none' now
    moved['remat'] = recurrence.remat_name(moved['remat'])
  return kept, moved


def saved_model_config(saved) -> ml_collections.ConfigDict:
  """The model config of a saved config dict, reading a missing field as `LEGACY_DEFAULTS`."""
  return models.model_config(**{**LEGACY_DEFAULTS, **dict(saved)})
