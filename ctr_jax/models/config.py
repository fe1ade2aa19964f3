"""Model configuration: defaults, the size table and validation.

A model config is an `ml_collections.ConfigDict` (so trainer configs can nest it and users can
override fields from the command line). `build` turns it into a frozen, hashable `ModelSpec`
that modules hold, which lets `jax.jit` treat a model as a static argument.
"""

import dataclasses
import math
import numbers
import re
from typing import Any

import ml_collections

from ctr_jax.models import families

KINDS = ('transformer', 'context_ready')
CORRECTIONS = ('add', 'token_blind', 'concat', 'none', 'tied')
INITS = ('torch', 'normal')
DTYPES = ('float32', 'bfloat16', 'float64', 'float16')
POSITIONS = ('rope', 'rope_integer', 'learned', 'none')
ACTIVATIONS = ('', 'gelu', 'gelu_tanh', 'silu', 'relu')
LAYER_TYPES = ('sliding_attention', 'full_attention')
KERNEL_LAYOUTS = ('out_in', 'in_out')


def block_names() -> tuple[str, ...]:
  """The allowed `model.block` values (the rows of `families.TRAITS`)."""
  return families.names()


def _family(name: str) -> families.Traits:
  """The traits of family `name` (they decide the family-specific checks)."""
  return families.TRAITS[name]


# Paper sizes (reference section 6.2: the ~85M block-FLOP grid; 16 heads everywhere) and a few
# CPU-sized names. `d` = context-ready unit of D layers, `t` = plain N-layer transformer.
# Any other `d<D>_c<C>` / `t<N>_c<C>` decodes with 16 heads (or `_h<H>` appended, e.g. d2_c256_h4).
SIZES = {
    'd1_c2048': ('context_ready', 1, 2048, 16),
    'd3_c1408': ('context_ready', 3, 1408, 16),
    'd5_c1120': ('context_ready', 5, 1120, 16),
    'd6_c1024': ('context_ready', 6, 1024, 16),
    'd11_c768': ('context_ready', 11, 768, 16),
    'd12_c1408': ('context_ready', 12, 1408, 16),
    't2_c1888': ('transformer', 2, 1888, 16),
    't4_c1344': ('transformer', 4, 1344, 16),
    't6_c1088': ('transformer', 6, 1088, 16),
    't12_c768': ('transformer', 12, 768, 16),
    't24_c1024': ('transformer', 24, 1024, 16),
    # CPU sizes used by quickstart configs and benchmarks.
    'd2_c256': ('context_ready', 2, 256, 4),
    't4_c256': ('transformer', 4, 256, 4),
    'd2_c512': ('context_ready', 2, 512, 8),
    't6_c512': ('transformer', 6, 512, 8),
}
_SIZE_PATTERN = re.compile(r'^([dt])(\d+)_c(\d+)(?:_h(\d+))?$')


def decode_size(name: str) -> dict[str, Any]:
  """Maps a size name such as 'd5_c1120' to kind, depth, width and heads."""
  if name in SIZES:
    kind, depth, width, heads = SIZES[name]
  else:
    match = _SIZE_PATTERN.match(name or '')
    if not match:
      raise ValueError(
          f'model.name={name!r} is not a size name: use one of {sorted(SIZES)} or the pattern '
          "'d<D>_c<C>' / 't<N>_c<C>' with optional '_h<heads>' (e.g. 'd2_c384_h6').")
    letter, depth, width, heads = match.groups()
    kind = 'context_ready' if letter == 'd' else 'transformer'
    depth, width, heads = int(depth), int(width), int(heads or 16)
  return dict(kind=kind, depth=depth, width=width, num_heads=heads)


def default_model_config() -> ml_collections.ConfigDict:
  """Every model field with its default; `model_config` overrides these."""
  c = ml_collections.ConfigDict()
  c.name = ''                 # size name from SIZES ('' = sizes given explicitly)
  c.kind = 'context_ready'    # 'transformer' (the paper's "roformer") | 'context_ready'
  c.block = 'gpt'             # block family: a key of families.TRAITS (models.BLOCKS)
  c.vocab_size = 32000
  c.width = 256               # C
  c.depth = 2                 # D for context_ready, N for transformer
  c.num_heads = 4             # H
  c.num_kv_heads = 0          # G; 0 means G = H (multi-head), 1 is multi-query attention
  c.head_dim = 0              # 0 means C / H
  c.mlp_ratio = 4             # F = mlp_ratio * C unless mlp_dim is set
  c.mlp_dim = 0
  c.max_len = 1024            # longest sequence (decode-state length) the model is built for
  c.rope_base = 10000.0       # standard RoPE frequency ladder (author's code used integer angles)
  c.dropout = 0.0             # on the embedding and on each residual branch
  c.layer_norm_eps = 1e-5
  c.init = 'torch'            # 'torch': N(0,1) embeddings, U(±1/sqrt(fan_in)) linears (author's
                              # PyTorch defaults); 'normal': GPT-2 style N(0, 0.02)
  c.dtype = 'float32'         # compute dtype; 'bfloat16' for mixed precision
  c.param_dtype = 'float32'
  c.kernel_layout = 'out_in'  # dense weights stored [out, in] ('weight', as PyTorch) or [in, out]
                              # ('kernel', as Flax); same maths, out_in is faster on XLA:CPU
  c.attention_blocks = 1      # causal self-attention in this many query blocks, skipping the
                              # score tiles above the diagonal (exact; no faster at T = 256 on
                              # CPU: docs/benchmarks.md)
  # Context-ready fields (ignored by kind='transformer').
  c.k_unroll = 5              # K: fixed-point iterations in the parallel forward
  c.correction = 'add'        # 'add' | 'token_blind' | 'concat' | 'none' | 'tied'
  c.cumulative = False        # ablation: u^(k) = u^(k-1) + c^(k-1) (breaks streaming exactness)
  # Block-family fields (used by the non-'gpt' families).
  c.qk_norm = False
  c.sliding_window = 0        # 0 = global attention everywhere
  c.num_experts = 4
  c.experts_per_token = 2
  c.tie_embeddings = False
  # Fields real checkpoints need (see ctr_jax/pretrained/hf/); the defaults keep every family as before.
  c.positions = 'rope'        # 'rope' | 'rope_integer' (angle position * j for pair j, as the
                              # author's code) | 'learned' (GPT-2's position table, max_len rows)
                              # | 'none' (no position signal but the causal mask: the author's
                              # no-RoPE option for pointer chasing)
  c.activation = ''           # '' = family default: gpt 'gelu' (erf), gemma 'gelu_tanh',
                              # llama/moe 'silu', falcon 'gelu'; or 'relu'
  c.layer_types = ()          # per layer 'sliding_attention' | 'full_attention' (Gemma 3);
                              # () = every layer uses `sliding_window` (0 = global)
  c.rope_local_base = 0.0     # RoPE base of sliding layers (Gemma 3: 10k); 0 = rope_base
  c.rope_scaling_factor = 1.0  # linear RoPE scaling (positions / factor) of the global layers
  c.query_pre_attn_scalar = 0.0  # attention scale = this ** -0.5; 0 = head_dim
  c.embed_scale = 0.0         # embeddings times this; 0 = family default (sqrt(width) for gemma)
  c.use_bias = False          # biases on the falcon block's dense layers
  c.parallel_norms = 1        # falcon: 1 LayerNorm feeds attention and MLP, 2 = one each
  return c


def model_config(name: str | None = None, **overrides) -> ml_collections.ConfigDict:
  """A validated model config: defaults, then the size `name`, then `overrides`.

  >>> model_config(kind='context_ready', vocab_size=97, width=64, depth=2, num_heads=4,
  ...              max_len=64, k_unroll=4)
  >>> model_config(name='d5_c1120', vocab_size=32000)
  """
  cfg = default_model_config()
  if name:
    cfg.update(decode_size(name))
    cfg.name = name
  unknown = sorted(set(overrides) - set(cfg.keys()))
  if unknown:
    raise ValueError(f'model config has no field(s) {unknown}; known fields: {sorted(cfg.keys())}')
  for key, value in overrides.items():
    try:
      cfg[key] = value
    except TypeError as e:  # ConfigDict refuses type changes, e.g. a string for an int.
      raise ValueError(f'model.{key}={value!r}: {e}') from None
  validate(cfg)
  return cfg


def _check(ok: bool, field: str, message: str):
  if not ok:
    raise ValueError(f'model.{field}: {message}')


def validate(cfg) -> None:
  """Raises ValueError naming the first bad field; returns None for a valid config."""
  _check(cfg.kind in KINDS, 'kind', f'got {cfg.kind!r}, allowed {list(KINDS)}')
  blocks = block_names()
  _check(cfg.block in blocks, 'block', f'got {cfg.block!r}, allowed {list(blocks)}')
  for field in ('vocab_size', 'width', 'depth', 'num_heads', 'max_len', 'mlp_ratio'):
    _check(int(cfg[field]) >= 1, field, f'must be a positive integer, got {cfg[field]!r}')
  for field in ('head_dim', 'mlp_dim'):  # 0 = derived (C / H, mlp_ratio * C)
    _check(isinstance(cfg[field], numbers.Integral) and cfg[field] >= 0, field,
           f'must be an integer >= 0 (0 = derived from width), got {cfg[field]!r}')
  _check(isinstance(cfg.layer_norm_eps, numbers.Real) and math.isfinite(cfg.layer_norm_eps)
         and cfg.layer_norm_eps >= 0, 'layer_norm_eps',
         f'must be a finite number >= 0, got {cfg.layer_norm_eps!r}')
  _check(cfg.width % cfg.num_heads == 0 or cfg.head_dim > 0, 'width',
         f'width={cfg.width} is not divisible by num_heads={cfg.num_heads}')
  head_dim = cfg.head_dim or cfg.width // cfg.num_heads
  _check(head_dim % 2 == 0, 'head_dim', f'RoPE needs an even head dimension, got {head_dim}')
  kv_heads = cfg.num_kv_heads or cfg.num_heads
  _check(kv_heads >= 1 and cfg.num_heads % kv_heads == 0, 'num_kv_heads',
         f'num_heads={cfg.num_heads} must be a multiple of num_kv_heads={kv_heads}')
  _check(0.0 <= cfg.dropout < 1.0, 'dropout', f'must be in [0, 1), got {cfg.dropout}')
  _check(cfg.init in INITS, 'init', f'got {cfg.init!r}, allowed {list(INITS)}')
  _check(cfg.dtype in DTYPES, 'dtype', f'got {cfg.dtype!r}, allowed {list(DTYPES)}')
  _check(cfg.param_dtype in DTYPES, 'param_dtype',
         f'got {cfg.param_dtype!r}, allowed {list(DTYPES)}')
  _check(cfg.k_unroll >= 1, 'k_unroll', f'K must be >= 1, got {cfg.k_unroll}')
  _check(cfg.correction in CORRECTIONS, 'correction',
         f'got {cfg.correction!r}, allowed {list(CORRECTIONS)}')
  _check(cfg.rope_base > 0, 'rope_base', 'must be > 0')
  _check(cfg.sliding_window >= 0, 'sliding_window', 'must be >= 0 (0 = global attention)')
  if _family(cfg.block).routed_experts:
    _check(1 <= cfg.experts_per_token <= cfg.num_experts, 'experts_per_token',
           f'must be in [1, num_experts={cfg.num_experts}]')
  _validate_family_fields(cfg)


def _validate_family_fields(cfg) -> None:
  # Configs saved before these fields existed lack them; ModelSpec's defaults apply.
  defaults = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
  get = lambda field: cfg.get(field, defaults[field])
  _check(get('positions') in POSITIONS, 'positions',
         f"got {get('positions')!r}, allowed {list(POSITIONS)}")
  _check(get('activation') in ACTIVATIONS, 'activation',
         f"got {get('activation')!r}, allowed {list(ACTIVATIONS)}")
  layer_types = tuple(get('layer_types'))
  _check(not layer_types or len(layer_types) == cfg.depth, 'layer_types',
         f'needs one entry per layer (depth={cfg.depth}), got {len(layer_types)}')
  _check(all(t in LAYER_TYPES for t in layer_types), 'layer_types',
         f'entries must be in {list(LAYER_TYPES)}, got {layer_types}')
  _check(get('rope_local_base') >= 0, 'rope_local_base', 'must be >= 0 (0 = rope_base)')
  _check(get('rope_scaling_factor') > 0, 'rope_scaling_factor', 'must be > 0')
  _check(get('query_pre_attn_scalar') >= 0, 'query_pre_attn_scalar',
         'must be >= 0 (0 = head_dim)')
  _check(get('embed_scale') >= 0, 'embed_scale', 'must be >= 0 (0 = family default)')
  _check(get('parallel_norms') in (1, 2), 'parallel_norms', 'must be 1 or 2')
  _check(isinstance(get('attention_blocks'), int) and get('attention_blocks') >= 1,
         'attention_blocks', f"must be an integer >= 1, got {get('attention_blocks')!r}")
  _check(get('kernel_layout') in KERNEL_LAYOUTS, 'kernel_layout',
         f"got {get('kernel_layout')!r}, allowed {list(KERNEL_LAYOUTS)}")
  _check(get('positions') != 'learned' or _family(cfg.block).learned_positions, 'positions',
         f"'learned' positions are only wired into the families "
         f"{[n for n in block_names() if _family(n).learned_positions]}, got block={cfg.block!r}")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The frozen, hashable form of a model config that modules carry."""
  kind: str
  block: str
  vocab_size: int
  width: int
  depth: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  max_len: int
  rope_base: float
  dropout: float
  layer_norm_eps: float
  init: str
  dtype: str
  param_dtype: str
  k_unroll: int
  correction: str
  cumulative: bool
  qk_norm: bool
  sliding_window: int
  num_experts: int
  experts_per_token: int
  tie_embeddings: bool
  name: str = ''
  positions: str = 'rope'
  activation: str = ''
  layer_types: tuple = ()
  rope_local_base: float = 0.0
  rope_scaling_factor: float = 1.0
  query_pre_attn_scalar: float = 0.0
  embed_scale: float = 0.0
  use_bias: bool = False
  parallel_norms: int = 1
  kernel_layout: str = 'out_in'  # the config's default (older checkpoints: training.compat)
  attention_blocks: int = 1

  @classmethod
  def from_config(cls, cfg) -> 'ModelSpec':
    validate(cfg)
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: cfg[k] for k in fields if k in cfg}
    values['num_kv_heads'] = cfg.num_kv_heads or cfg.num_heads
    values['head_dim'] = cfg.head_dim or cfg.width // cfg.num_heads
    values['mlp_dim'] = cfg.mlp_dim or cfg.mlp_ratio * cfg.width
    if 'layer_types' in values:
      values['layer_types'] = tuple(values['layer_types'])
    return cls(**values)

  @property
  def is_context_ready(self) -> bool:
    return self.kind == 'context_ready'
