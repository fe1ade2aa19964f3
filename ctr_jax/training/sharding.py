"""Device mesh and sharding by logical axis names.

Every parameter is annotated with logical axis names where it is created (ctr_jax/models:
`nn.with_logical_partitioning`, e.g. a dense layer's [in, out] matrix ('embed', 'mlp'));
`param_axes` reads them off the model, and `tree_shardings` maps a train state (the params and
the optimizer state that mirrors them) to NamedShardings with the config's rules
(`config.sharding_rules`, logical name -> mesh axes 'data', 'fsdp', 'tensor'). Activations are
annotated inside the model with `nn.with_logical_constraint(x, ('act_batch', 'act_length',
'act_embed'))`, resolved under `activation_rules`.

    axes = sharding.param_axes(model, tokens)     # {'blocks': {...: PartitionSpec('embed', ..)}}
    shardings = sharding.tree_shardings(state, mesh, rules, axes)
"""

import math

import flax.linen as nn
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

MESH_AXES = ('data', 'fsdp', 'tensor')

# Logical name -> mesh axes. Weights are sharded over fsdp along C (and the head dimension of
# the QK-norm scales) and over tensor along heads / mlp / vocab; activations along the batch
# over data and fsdp. An axis whose size the mesh axes do not divide stays replicated.
DEFAULT_RULES = (
    ('act_batch', ('data', 'fsdp')),
    ('act_length', None),
    ('act_embed', None),
    ('embed', 'fsdp'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('head_dim', 'fsdp'),
    ('mlp', 'tensor'),
    ('vocab', 'tensor'),
    ('position', None),
    ('experts', None),
)


def mesh_shape(mesh_config, num_devices: int) -> dict[str, int]:
  """{'data': .., 'fsdp': .., 'tensor': ..} of the mesh `make_mesh` builds on `num_devices`
  devices (the -1 axis resolved); a ValueError naming config.mesh when they do not fit."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'config.mesh: {num_devices} devices are not divisible by {known}')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f'config.mesh: {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} '
                     f'devices, {num_devices} are available')
  return dict(zip(MESH_AXES, sizes))


def make_mesh(mesh_config, devices=None) -> jax.sharding.Mesh:
  """A ('data', 'fsdp', 'tensor') mesh; one axis may be -1 = all remaining devices."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = list(mesh_shape(mesh_config, len(devices)).values())
  return jax.sharding.Mesh(np.array(devices).reshape(sizes), MESH_AXES)


def batch_axes(rules=DEFAULT_RULES) -> tuple[str, ...]:
  """The mesh axes a batch is split over (the 'act_batch' rule), as a tuple."""
  axes = dict(rules).get('act_batch')
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def param_axes(model, *init_args) -> dict:
  """The logical axes of every parameter of `model`, as a tree of PartitionSpecs of logical names
  in the structure of `variables['params']`, from the annotations the modules create them with.

  `init_args` are what `model.init` takes after the rng (e.g. a token batch); nothing is
  computed (`jax.eval_shape`). A parameter created without an annotation gets P() (replicated).
  """
  boxed = jax.eval_shape(lambda: model.init_with_output(jax.random.key(0), *init_args)[1])
  return nn.get_partition_spec(boxed)['params']


def _names(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _by_path(axes) -> dict:
  leaves = jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, P))
  return {_names(path): tuple(spec) for path, spec in leaves}


def _mesh_spec(logical, shape, mesh, rules) -> P:
  """PartitionSpec for a leaf; an axis whose size does not divide evenly is replicated."""
  rule = dict(rules)
  spec = []
  for name, size in zip(logical, shape):
    target = rule.get(name) if name else None
    if target is not None:
      axes = target if isinstance(target, (tuple, list)) else (target,)
      count = math.prod(mesh.shape[a] for a in axes)
      if size % count:
        target = None
    spec.append(tuple(target) if isinstance(target, list) else target)
  return P(*spec)


def tree_shardings(tree, mesh, rules, axes):
  """NamedShardings for every leaf of a (possibly abstract) train-state tree.

  `axes` is `param_axes(model, ...)`. A leaf whose tree path ends with a parameter's path and
  has its rank (the parameter itself under state['params'], AdamW's mu and nu of it in the
  optimizer state) is sharded by that parameter's logical axes; every other leaf (step counters,
  scalars) is replicated.
  """
  by_path = _by_path(axes)

  def one(path, leaf):
    shape = getattr(leaf, 'shape', ())
    names = _names(path)
    logical = (None,) * len(shape)
    for start in range(len(names)):  # the longest matching suffix
      found = by_path.get(names[start:])
      if found is not None and len(found) == len(shape):
        logical = found
        break
    return NamedSharding(mesh, _mesh_spec(logical, shape, mesh, rules))
  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh, rules=DEFAULT_RULES) -> NamedSharding:
  batch_axes = dict(rules).get('act_batch')
  return NamedSharding(mesh, P(batch_axes))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def activation_rules(rules=DEFAULT_RULES):
  """Context manager that lets the model's logical activation constraints resolve."""
  return nn.logical_axis_rules(tuple(rules))
