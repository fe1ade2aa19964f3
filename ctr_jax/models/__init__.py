"""Models: configs, the size table, construction, parameter and FLOP counting.

    from ctr_jax import models
    cfg = models.model_config(name='d5_c1120', vocab_size=32000)
    model = models.build(cfg)
    variables = model.init(jax.random.key(0), tokens)
    logits = model.apply(variables, tokens, k_unroll=5)
"""

import math

import jax

from ctr_jax.models import families
from ctr_jax.models.config import (
  CORRECTIONS,
  KERNEL_LAYOUTS,
  KINDS,
  SIZES,
  ModelSpec,
  decode_size,
  default_model_config,
  model_config,
  validate,
)
from ctr_jax.models.lm import ContextReadyLM, TransformerLM
from ctr_jax.ops.recurrence import DecodeState, fixed_point_unroll, shift_right

BLOCKS = families.names()  # the allowed model.block values

__all__ = [
    'BLOCKS', 'CORRECTIONS', 'KERNEL_LAYOUTS', 'KINDS',
    'SIZES', 'ModelSpec', 'decode_size', 'default_model_config', 'model_config',
    'validate', 'ContextReadyLM', 'TransformerLM',
    'DecodeState', 'fixed_point_unroll', 'shift_right', 'build', 'spec_of', 'count_params',
    'flops_per_token', 'training_flops_per_token',
]


def spec_of(cfg) -> ModelSpec:
  """The frozen spec of a config (a ModelSpec passes through)."""
  return cfg if isinstance(cfg, ModelSpec) else ModelSpec.from_config(cfg)


def build(cfg):
  """A flax.linen Module for the config: TransformerLM or ContextReadyLM."""
  spec = spec_of(cfg)
  return ContextReadyLM(spec) if spec.is_context_ready else TransformerLM(spec)


def count_params(variables) -> int:
  """Number of parameters in `variables` (or its 'params'); works on jax.eval_shape output."""
  params = variables.get('params', variables) if hasattr(variables, 'get') else variables
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))


def flops_per_token(cfg) -> int:
  """The paper's per-token cost (matmul weights only, no attention scores).

  context-ready: D*12C^2 + 8C^2 + V*C ;  transformer: N*12C^2 + V*C. The correction term follows
  the variant: 12C^2 for 'concat' (2C-wide input), 0 for 'none' and 'tied' adds 8C^2 (it runs the
  shared FFN once more).
  """
  s = spec_of(cfg)
  c, v = s.width, s.vocab_size
  block = 4 * c * c + 2 * c * s.mlp_dim  # = 12C^2 with F = 4C
  total = s.depth * block + v * c
  if s.is_context_ready:
    total += {'add': 2, 'token_blind': 2, 'tied': 2, 'concat': 3, 'none': 0}[s.correction] * (
        c * s.mlp_dim)
  return total



def training_flops_per_token(cfg, seq_len: int, k_unroll: int, grad_iterations: int = 0) -> float:
  """Model FLOPs per trained token (forward + backward = 3x forward, no rematerialisation): the
  numerator of MFU, in the benchmarks and in the trainer's metrics.

  Forward per token: 2 x the matmul weights each token passes through, plus causal attention
  counted as 4 T C per layer (scores and weighted sum over all T keys, the usual MFU
  convention). A context-ready model runs its D-layer unit and its correction K times forward
  and backpropagates through the last m of them (`grad_iterations`; 0 = all K): (K + 2m) unit
  passes, the embedding and head 3 times.
  """
  s = spec_of(cfg)
  c = s.width
  layer = 2 * (4 * c * c + 2 * c * s.mlp_dim) + 4 * seq_len * c
  head = 2 * s.vocab_size * c
  if not s.is_context_ready:
    return 3 * (s.depth * layer + head)
  inference = flops_per_token(s)  # D*12C^2 + correction + V*C (weights only)
  correction = inference - s.depth * (4 * c * c + 2 * c * s.mlp_dim) - s.vocab_size * c
  m = grad_iterations if 0 < grad_iterations < k_unroll else k_unroll
  return (k_unroll + 2 * m) * (s.depth * layer + 2 * correction) + 3 * head
