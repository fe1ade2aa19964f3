"""Orbax checkpoints of {train state, data-iterator state, config} in `<workdir>/checkpoints`.

Restores go through explicit abstract targets carrying the *current* shardings, so a checkpoint
written on 8 devices restores on 1 (or on another mesh) without reshaping errors.
"""

import json
import os

import jax
import orbax.checkpoint as ocp


def manager(workdir: str, max_to_keep: int = 3) -> ocp.CheckpointManager:
  path = os.path.join(os.path.abspath(workdir), 'checkpoints')
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(path, options=options, item_names=('state', 'data_iter', 'meta'))


def save(mngr: ocp.CheckpointManager, step: int, state, data_iter_state, meta: dict) -> None:
  mngr.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data_iter=ocp.args.JsonSave(data_iter_state or {}),
      meta=ocp.args.JsonSave(meta)), force=True)
  mngr.wait_until_finished()


def read_meta(workdir: str) -> dict | None:
  """The metadata (config, step) of the latest checkpoint in `workdir`, or None."""
  path = os.path.join(os.path.abspath(workdir), 'checkpoints')
  if not os.path.isdir(path):
    return None
  steps = sorted(int(d) for d in os.listdir(path) if d.isdigit())
  if not steps:
    return None
  meta_file = os.path.join(path, str(steps[-1]), 'meta', 'metadata')
  if not os.path.exists(meta_file):
    return None
  with open(meta_file) as f:
    return json.load(f)


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """Restores (state, data-iterator state, meta) onto the shardings of `abstract_state`."""
  restored = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      data_iter=ocp.args.JsonRestore(),
      meta=ocp.args.JsonRestore()))
  return restored['state'], restored['data_iter'], restored['meta']


def abstract_with_shardings(abstract_tree, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_tree, shardings)
