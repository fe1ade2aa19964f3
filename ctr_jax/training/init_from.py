"""`config.init_from`: a new run's parameters from a finished transformer run's checkpoint.

The source's parameters only (its optimizer and its state do not matter: a fresh optimizer and
schedule start), converted to a context-ready model (zero-initialised correction FFN), kept as
they are for a transformer run (a continuation: the baseline a converted model's fine-tune is
compared with), or grown by pass-through blocks on top for a deeper transformer
(`convert.grow_transformer`).

Equal parameter shapes do not make the same model (another num_heads, block family, position
scheme or kernel layout can share every shape and compute something else), so the source's full
model config is compared first: only the fields in MAY_DIFFER may differ.
"""

import json

import jax

from ctr_jax.models import convert
from ctr_jax.training import checkpointing, compat, optim

# Model fields a run may set apart from its source's: the size label, what the conversion or the
# growth changes (kind, depth, the context-ready fields), and what leaves the source's function
# as it was (compute dtype, dropout, the attention's query blocks, the longest sequence; learned
# position tables are checked by their shapes).
MAY_DIFFER = ('name', 'kind', 'depth', 'k_unroll', 'correction', 'cumulative', 'dtype', 'dropout',
              'attention_blocks', 'max_len')


class InitFromError(ValueError):
  """A source run that this config cannot start from (one line, exit code 2)."""


def model_differences(source_model: dict, target_model: dict) -> list[tuple[str, object, object]]:
  """(field, source's value, target's value) for each model field outside MAY_DIFFER that
  differs, both configs as JSON stores them."""
  return [(k, source_model.get(k), target_model.get(k))
          for k in sorted(set(source_model) | set(target_model))
          if k not in MAY_DIFFER and source_model.get(k) != target_model.get(k)]


def load_into(config, state: dict, state_shardings, mesh, rules) -> dict:
  """`state` with the parameters of `config.init_from` (see the module docstring) and a fresh
  optimizer state for them."""
  source = config.init_from
  try:
    _, source_meta = checkpointing.newest_meta(source)
  except ValueError as e:
    raise InitFromError(f'config.init_from: {e}') from None
  except checkpointing.CheckpointError as e:
    raise checkpointing.CheckpointError(f'config.init_from: {e}') from None
  source_cfg = compat.saved_model_config(
      compat.split_moved_fields(source_meta['config']['model'])[0])
  if source_cfg.kind != 'transformer':
    raise InitFromError('config.init_from must point at a transformer run')
  differences = model_differences(json.loads(source_cfg.to_json()),
                                  json.loads(config.model.to_json()))
  if differences:
    fields = ', '.join(f'model.{k}={t!r} (the source has {s!r})' for k, s, t in differences)
    flags = ' '.join(f'--config.model.{k}={s!r}' for k, s, _ in differences)
    raise InitFromError(f'config.init_from={source!r} was trained with another model: {fields}; '
                        f'pass {flags} to start from it (only {", ".join(MAY_DIFFER)} may differ)')
  try:
    _, source_params = checkpointing.load_params(source, mesh=mesh, rules=rules)
  except checkpointing.CheckpointError as e:
    raise checkpointing.CheckpointError(f'config.init_from: {e}') from None
  if config.model.kind == 'transformer':
    shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
    if shapes(source_params) == shapes(state['params']):
      params = source_params
    elif source_cfg.depth < config.model.depth:
      try:  # a deeper transformer: the source's blocks below new pass-through ones
        params = convert.grow_transformer(source_params, state['params'])
      except ValueError as e:
        raise InitFromError(f'config.init_from: {e}') from None
    else:
      raise InitFromError(f'config.init_from: continuing a transformer needs the same parameter '
                          f'shapes (or fewer blocks, to grow it); {source} has others')
  else:
    try:
      params = convert.transformer_to_context_ready({'params': source_params},
                                                    config.model)['params']
    except ValueError as e:
      raise InitFromError(f'config.init_from: {e}') from None
  params = jax.device_put(params, state_shardings['params'])
  return {**state, 'params': params,
          'opt_state': jax.jit(optim.make_optimizer(config.optim, config.total_steps).init,
                               out_shardings=state_shardings['opt_state'])(params)}
