"""The block families' traits: one row per allowed `model.block` value.

A family's traits shape the model around its blocks (final norm, head, embeddings, MLP
activation) and the checks of its config; the rest of the code reads them here instead of
switching on the family's name. The blocks themselves are `ctr_jax.models.blocks.BLOCK_FAMILIES`
(one class per row of this table).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Traits:
  """What a family decides beyond its block's three stages.

  norm_kind           'layer' (layer_norm.LayerNorm), 'rms' (RMSNorm) or 'rms_offset' (Gemma's
                      RMSNorm storing w of (1 + w)); the family's norm, the final one included
  default_activation  the MLP nonlinearity when `spec.activation` is '' (layers.ACTIVATIONS)
  scale_embeddings    token embeddings times sqrt(C) unless `spec.embed_scale` is set
  head_bias           an untied head has a bias
  routed_experts      its MLP routes each token to `experts_per_token` of `num_experts`
  learned_positions   accepts `positions='learned'` (a position table instead of RoPE)
  """
  norm_kind: str = 'rms'
  default_activation: str = 'silu'
  scale_embeddings: bool = False
  head_bias: bool = False
  routed_experts: bool = False
  learned_positions: bool = False


TRAITS: dict[str, Traits] = {
    'gpt': Traits(norm_kind='layer', default_activation='gelu', head_bias=True,
                  learned_positions=True),  # GPT-2's position table
    'gemma': Traits(norm_kind='rms_offset', default_activation='gelu_tanh',
                    scale_embeddings=True),
    'llama': Traits(),
    'falcon': Traits(norm_kind='layer', default_activation='gelu'),
    'moe': Traits(routed_experts=True),
}


def names() -> tuple[str, ...]:
  """The allowed `model.block` values."""
  return tuple(TRAITS)


def traits(name: str) -> Traits:
  if name not in TRAITS:
    raise ValueError(f'model.block: got {name!r}, allowed {sorted(TRAITS)}')
  return TRAITS[name]
