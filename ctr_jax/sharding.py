"""Device mesh and sharding by logical axis names.

Parameters (and the optimizer state that mirrors them) get logical axis names from their module
and parameter names (`param_logical_axes`); activations are annotated inside the model with
`nn.with_logical_constraint(x, ('act_batch', 'act_length', 'act_embed'))`. The config's rules map
logical names onto the mesh axes ('data', 'fsdp', 'tensor').
"""

import math

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

MESH_AXES = ('data', 'fsdp', 'tensor')

# Logical name -> mesh axes. Weights are sharded over fsdp along C and over tensor along
# heads / mlp / vocab; activations along the batch over data and fsdp.
DEFAULT_RULES = (
    ('act_batch', ('data', 'fsdp')),
    ('act_length', None),
    ('act_embed', None),
    ('embed', 'fsdp'),
    ('heads', 'tensor'),
    ('mlp', 'tensor'),
    ('vocab', 'tensor'),
    ('experts', None),
)

_KERNEL_AXES = {  # module name -> logical axes of its [in, out] kernel
    'query': ('embed', 'heads'), 'key': ('embed', 'heads'), 'value': ('embed', 'heads'),
    'out': ('heads', 'embed'), 'fc_in': ('embed', 'mlp'), 'fc_out': ('mlp', 'embed'),
    'gate': ('embed', 'mlp'), 'up': ('embed', 'mlp'), 'down': ('mlp', 'embed'),
    'head': ('embed', 'vocab'),
}


def make_mesh(mesh_config, devices=None) -> jax.sharding.Mesh:
  """A ('data', 'fsdp', 'tensor') mesh; one axis may be -1 = all remaining devices."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f'config.mesh: {len(devices)} devices are not divisible by {known}')
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f'config.mesh: {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} '
                     f'devices, {len(devices)} are available')
  return jax.sharding.Mesh(np.array(devices).reshape(sizes), MESH_AXES)


def _names(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def param_logical_axes(path, shape) -> tuple:
  """Logical axis names of one parameter (or optimizer-state leaf) from its tree path."""
  names = _names(path)
  if len(shape) == 0 or len(names) < 2:
    return (None,) * len(shape)
  module, leaf = names[-2], names[-1]
  if leaf == 'embedding':
    return ('vocab', 'embed')
  axes = _KERNEL_AXES.get(module)
  if axes is None:
    return (None,) * len(shape)
  if leaf == 'kernel' and len(shape) >= 2:
    return (None,) * (len(shape) - 2) + axes  # leading axes (experts) stay replicated
  if leaf == 'weight' and len(shape) == 2:  # layers.Linear: [out, in]
    return axes[::-1]
  if leaf == 'bias' and len(shape) >= 1:
    return (None,) * (len(shape) - 1) + (axes[-1],)
  return (None,) * len(shape)


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


def tree_shardings(tree, mesh, rules=DEFAULT_RULES):
  """NamedShardings for every leaf of a (possibly abstract) params/state tree."""
  def one(path, leaf):
    shape = getattr(leaf, 'shape', ())
    return NamedSharding(mesh, _mesh_spec(param_logical_axes(path, shape), shape, mesh, rules))
  return jax.tree_util.tree_map_with_path(one, tree)


def batch_sharding(mesh, rules=DEFAULT_RULES) -> NamedSharding:
  batch_axes = dict(rules).get('act_batch')
  return NamedSharding(mesh, P(batch_axes))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def activation_rules(rules=DEFAULT_RULES):
  """Context manager that lets the model's logical activation constraints resolve."""
  return nn.logical_axis_rules(tuple(rules))
