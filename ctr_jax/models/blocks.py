"""Block families and the block stack (notation: ctr_jax/notation.py).

Every block has the signature of the layers it is built from:
`(x [B, T, C], positions, cache, cache_index, deterministic) -> (y, new_cache)`. Families are
selected by `spec.block`; each is one `_FamilyBlock` subclass registered in `BLOCK_FAMILIES`,
whose keys are the allowed values of `model.block`. A family's traits (final norm, head,
embeddings, MLP activation) are its row of `ctr_jax.models.families.TRAITS`.

Adding a family takes: its traits row, its class here (three stages, one `BLOCK_FAMILIES` entry), its
patch rule in `ctr_jax.implicit.blocks._FAMILIES` (for the implicit updates), and, to load real
checkpoints, its architecture in `ctr_jax.pretrained.hf` (a config mapping and a parameter mapping).
"""

import flax.linen as nn
import jax.numpy as jnp

from ctr_jax.models.attention import Attention, Cache
from ctr_jax.models.config import ModelSpec
from ctr_jax.models.layers import GatedMlp, Mlp, MoeMlp, activation_name, compute_dtype, norm
from ctr_jax.ops.recurrence import SAVE_MATMULS

# ------------------------------------------------------------------------------------------------
# Block families.
# ------------------------------------------------------------------------------------------------


def layer_attention(spec: ModelSpec, layer_index: int, **kwargs) -> Attention:
  """The attention of layer `layer_index`: window and RoPE base from `spec.layer_types`.

  Sliding layers use `sliding_window` and `rope_local_base` (unscaled); full layers are global
  and use `rope_base` with linear scaling `rope_scaling_factor`. Without `layer_types` every
  layer uses `sliding_window` (0 = global) and `rope_base`.
  """
  kind = spec.layer_types[layer_index] if spec.layer_types else ''
  if kind == 'sliding_attention':
    window, base, factor = spec.sliding_window, spec.rope_local_base or spec.rope_base, 1.0
  elif kind == 'full_attention':
    window, base, factor = 0, spec.rope_base, spec.rope_scaling_factor
  else:
    window, base, factor = spec.sliding_window, spec.rope_base, spec.rope_scaling_factor
  return Attention(spec, window=window, rope_base=base, rope_factor=factor, **kwargs)


class _FamilyBlock(nn.Module):
  """The shared `__call__` of every family; subclasses define three stages.

  The stages (ctr_jax/implicit patches between them): v = attend(x) is the residual after the
  attention sub-layer, z = mlp_input(x, v) the normalised MLP input, and the block output is
  v + mlp_branch(z).
  """
  spec: ModelSpec
  layer_index: int = 0

  def __call__(self, x, positions, cache=None, cache_index=None, deterministic=True):
    v, new_cache = self.attend(x, positions, cache, cache_index, deterministic)
    y = self.mlp_branch(self.mlp_input(x, v))
    return v + self.drop(y, deterministic=deterministic), new_cache

  def attention_scale(self) -> float:
    s = self.spec
    return (s.query_pre_attn_scalar or s.head_dim) ** -0.5


class GptBlock(_FamilyBlock):
  """Pre-LN block of the paper's "roformer": h += Attn(LN(h)); h += FFN(LN(h)); with biases."""

  def setup(self):
    self.ln_attn = norm(self.spec)
    self.attn = Attention(self.spec)
    self.ln_mlp = norm(self.spec)
    self.mlp = Mlp(self.spec, activation=activation_name(self.spec))
    self.drop = nn.Dropout(self.spec.dropout)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.ln_attn(x), positions, cache, cache_index)
    return x + self.drop(a, deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del x
    return self.ln_mlp(v)

  def mlp_branch(self, z):
    return self.mlp(z)


class GemmaBlock(_FamilyBlock):
  """Gemma 2/3: RMSNorm (1 + w) before and after attention and MLP, GeGLU-tanh, no biases.

  v = x + PostAttnNorm(Attn(PreAttnNorm(x)));  out = v + PostMlpNorm(Mlp(PreMlpNorm(v))).
  """

  def setup(self):
    s = self.spec
    self.attn_norm = norm(s)
    self.attn = layer_attention(s, self.layer_index, use_bias=False,
                                qk_norm='gemma' if s.qk_norm else '',
                                scale=self.attention_scale())
    self.post_attn_norm = norm(s)
    self.mlp_norm = norm(s)
    self.mlp = GatedMlp(s)
    self.post_mlp_norm = norm(s)
    self.drop = nn.Dropout(s.dropout)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.attn_norm(x), positions, cache, cache_index)
    return x + self.drop(self.post_attn_norm(a), deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del x
    return self.mlp_norm(v)

  def mlp_branch(self, z):
    return self.post_mlp_norm(self.mlp(z))


class LlamaBlock(_FamilyBlock):
  """Llama/Mistral/Qwen2: pre-RMSNorm only, SwiGLU, no biases (optional QK-norm as Qwen3)."""

  def setup(self):
    s = self.spec
    self.attn_norm = norm(s)
    self.attn = layer_attention(s, self.layer_index, use_bias=False,
                                qk_norm='llama' if s.qk_norm else '',
                                scale=self.attention_scale())
    self.mlp_norm = norm(s)
    self.mlp = self.make_mlp()
    self.drop = nn.Dropout(s.dropout)

  def make_mlp(self):
    return GatedMlp(self.spec)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.attn_norm(x), positions, cache, cache_index)
    return x + self.drop(a, deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del x
    return self.mlp_norm(v)

  def mlp_branch(self, z):
    return self.mlp(z)


class MoeBlock(LlamaBlock):
  """Mixtral: the Llama block with its MLP replaced by top-k routed SwiGLU experts."""

  def make_mlp(self):
    return MoeMlp(self.spec)


class FalconBlock(_FamilyBlock):
  """Falcon/GPT-J parallel block: out = x + Attn(LN(x)) + Mlp(LN'(x)); the MLP never sees v.

  LN' is the same LayerNorm (parallel_norms=1, Falcon-7B) or its own (2, Falcon-40B).
  """

  def setup(self):
    s = self.spec
    self.attn_norm = norm(s)
    if s.parallel_norms == 2:
      self.mlp_norm = norm(s)
    self.attn = layer_attention(s, self.layer_index, use_bias=s.use_bias,
                                scale=self.attention_scale())
    self.mlp = Mlp(s, activation=activation_name(s), use_bias=s.use_bias)
    self.drop = nn.Dropout(s.dropout)

  def attend(self, x, positions, cache=None, cache_index=None, deterministic=True):
    a, new_cache = self.attn(self.attn_norm(x), positions, cache, cache_index)
    return x + self.drop(a, deterministic=deterministic), new_cache

  def mlp_input(self, x, v):
    del v
    return (self.mlp_norm if self.spec.parallel_norms == 2 else self.attn_norm)(x)

  def mlp_branch(self, z):
    return self.mlp(z)


# The registry: `model.block` names (in this order in error messages) -> family classes.
BLOCK_FAMILIES: dict[str, type[_FamilyBlock]] = {
    'gpt': GptBlock, 'gemma': GemmaBlock, 'llama': LlamaBlock, 'falcon': FalconBlock,
    'moe': MoeBlock}


def block_class(spec: ModelSpec) -> type[_FamilyBlock]:
  """The block class of `spec.block` (its traits: `families.traits(spec.block)`)."""
  if spec.block not in BLOCK_FAMILIES:
    raise ValueError(f'model.block={spec.block!r} is not implemented yet; available: '
                     f'{sorted(BLOCK_FAMILIES)}')
  return BLOCK_FAMILIES[spec.block]


class BlockStack(nn.Module):
  """`spec.depth` blocks with separate weights (the context-ready unit, or a whole transformer)."""
  spec: ModelSpec

  def setup(self):
    cls = block_class(self.spec)
    self.layers = [cls(self.spec, layer_index=i, name=f'block_{i}')
                   for i in range(self.spec.depth)]

  def __call__(self, x, positions, caches=None, cache_index=None, deterministic=True,
               remat: str = 'none'):
    """x [B, T, C] -> ([B, T, C], per-layer caches or None).

    `remat` 'layer' recomputes each block from its input in the backward pass, 'matmuls' too
    but keeps its weight products (`ctr_jax.ops.recurrence.REMAT`); any other value, or caches
    (decoding), stores everything.
    """
    new_caches = []
    for i, layer in enumerate(self.layers):
      x = nn.with_logical_constraint(x, ('act_batch', 'act_length', 'act_embed'))
      if caches is None and remat in ('layer', 'matmuls'):
        x, cache = _rematerialised(remat, deterministic)(layer, x, positions)
      else:
        x, cache = layer(x, positions, None if caches is None else caches[i], cache_index,
                         deterministic)
      new_caches.append(cache)
    return x, (None if caches is None else tuple(new_caches))


def _rematerialised(remat: str, deterministic: bool):
  """`(block, x, positions) -> block(x, positions)` recomputed in the backward pass."""
  def run(block, x, positions):
    return block(x, positions, None, None, deterministic)
  return nn.remat(run, policy=SAVE_MATMULS if remat == 'matmuls' else None)


def init_cache(spec: ModelSpec, batch_size: int, length: int, dtype=None) -> tuple[Cache, ...]:
  """Zeroed per-layer KV caches for `length` positions."""
  dtype = dtype or compute_dtype(spec)
  g, dh = spec.num_kv_heads, spec.head_dim
  return tuple({'k': jnp.zeros((batch_size * g, dh, length), dtype),
                'v': jnp.zeros((batch_size * g, length, dh), dtype)}
               for _ in range(spec.depth))
