"""The train state and the jitted train step of a config on a mesh, built from shapes alone.

The trainer's loop (`ctr_jax.trainer`) and the ahead-of-time compile job (`ctr_jax.training.aot`)
both build their step here, so the job compiles the program the run executes:

    program = program.build(config, model_config, mesh, task)  # or `tasks.abstract`'s objective
    state = program.init(jax.random.key(config.seed))
    with program.context():
      state, metrics = program.step(k)(state, batch)           # one jitted step per K value
"""

import contextlib
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
import optax

from ctr_jax import models
from ctr_jax.training import optim, sharding, train_step


@dataclasses.dataclass
class Program:
  """What a training run compiles: the model, its optimiser, the state's shapes and shardings and
  the step. Nothing is allocated until `init` (or a restore) makes the state."""
  model: nn.Module
  tx: optax.GradientTransformation
  mesh: Mesh
  rules: tuple
  init_state: Callable        # rng -> {'step', 'params', 'opt_state'} (`train_step.init_state`)
  abstract_state: Any         # its jax.eval_shape: shapes and dtypes only
  state_shardings: Any        # a NamedSharding per leaf of the state
  batch_sharding: NamedSharding
  replicated: NamedSharding
  step_fn: Callable           # (state, batch, k_unroll) -> (state, metrics), not jitted
  _steps: dict = dataclasses.field(default_factory=dict, repr=False)

  def init(self, rng) -> dict:
    """A fresh state from `rng`, created sharded on the mesh."""
    return jax.jit(self.init_state, out_shardings=self.state_shardings)(rng)

  def step(self, k_unroll: int) -> Callable:
    """The jitted step `(state, batch) -> (state, metrics)` at K = k_unroll (the state donated);
    call or lower it inside `context()`."""
    if k_unroll not in self._steps:
      self._steps[k_unroll] = jax.jit(
          functools.partial(self.step_fn, k_unroll=k_unroll),
          in_shardings=(self.state_shardings, self.batch_sharding),
          out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))
    return self._steps[k_unroll]

  @contextlib.contextmanager
  def context(self):
    """The mesh and the activation sharding rules the step is traced under."""
    with jax.set_mesh(self.mesh), sharding.activation_rules(self.rules):
      yield


def build(config, model_config, mesh: Mesh, objective) -> Program:
  """The program of `config` on `mesh`. `model_config`: `config.model` with the compute dtype
  resolved for the mesh's platform (`config_lib.model_config_for`); `objective` scores a batch
  (`inputs`, `loss`): the task when training, `tasks.abstract(config)[0]` for a compile without
  data."""
  rules = tuple(tuple(r) for r in config.sharding_rules)
  model = models.build(model_config)
  tx = optim.make_optimizer(config.optim, config.total_steps)
  dummy = jnp.zeros((1, config.data.seq_len), jnp.int32)

  def init_state(rng):
    params = model.init(rng, dummy)['params']
    return train_step.init_state(params, tx)

  # Shapes first: nothing full-size is ever made on one device.
  abstract_state = jax.eval_shape(init_state, jax.random.key(config.seed))
  state_shardings = sharding.tree_shardings(abstract_state, mesh, rules,
                                           sharding.param_axes(model, dummy))
  step_fn = train_step.make_train_step(model, tx, objective,
                                       recipe=train_step.Recipe.from_config(config.train),
                                       base_rng=jax.random.key(config.seed + 1),
                                       deterministic=config.model.dropout == 0)
  return Program(model=model, tx=tx, mesh=mesh, rules=rules, init_state=init_state,
                 abstract_state=abstract_state, state_shardings=state_shardings,
                 batch_sharding=sharding.batch_sharding(mesh, rules),
                 replicated=sharding.replicated(mesh), step_fn=step_fn)
