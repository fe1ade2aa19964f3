"""FLOP matching: the transformers whose per-token cost equals a context-ready model's.

The paper compares models at equal inference cost per token (reference section 1.4, matmul
weights only): D·12C² + 8C² + VC for a context-ready unit of D layers, N·12C² + VC for an N-layer
transformer. A comparison is FLOP-matched here when the transformer's cost is within `tolerance`
(3% by default, the spread of the paper's own Table 1 pairs) of the context-ready model's, with
the study's vocabulary V in both (at CPU scale V·C is a large share of the cost, so matching the
block FLOPs alone, as the paper's "~85M" budget does, would not be equal cost here).

    crt = models.model_config(name='d2_c128_h4', vocab_size=2048)
    for m in flop_match.matched_transformers(crt, depths=(2, 3, 4, 6)):
      print(m['depth'], m['width'], m['ratio'])
"""

import math

from ctr_jax import models


def cost(kind: str, depth: int, width: int, vocab_size: int, mlp_ratio: int = 4,
         correction: str = 'add') -> int:
  """Per-token cost of a model of this shape (`models.flops_per_token`)."""
  fields = dict(kind=kind, depth=depth, width=width, num_heads=1, vocab_size=vocab_size,
                mlp_ratio=mlp_ratio)
  if kind == 'context_ready':
    fields['correction'] = correction
  return models.flops_per_token(models.model_config(**fields))


def nearest_width(kind: str, depth: int, target: float, vocab_size: int, num_heads: int,
                  mlp_ratio: int = 4, correction: str = 'add') -> int:
  """The width, a multiple of 2 * num_heads (even head dimension, for RoPE), whose per-token
  cost at this depth is nearest to `target`."""
  step = 2 * num_heads
  # The C^2 coefficient a of a C^2 + V C, read off a width-2, V = 1 model.
  per_width_sq = (cost(kind, depth, 2, 1, mlp_ratio, correction) - 2) / 4
  # a C^2 + V C = target, solved for C and rounded both ways to the grid.
  exact = (-vocab_size + math.sqrt(vocab_size ** 2 + 4 * per_width_sq * target)) / (
      2 * per_width_sq)
  candidates = {max(step, step * math.floor(exact / step)), step * math.ceil(exact / step)}
  return min(candidates, key=lambda c: (abs(cost(kind, depth, c, vocab_size, mlp_ratio,
                                                 correction) / target - 1), c))


def _row(depth, width, heads, flops, target):
  return {'kind': 'transformer', 'depth': depth, 'width': width, 'num_heads': heads,
          'flops_per_token': flops, 'target_flops_per_token': target, 'ratio': flops / target}


def matched_transformers(crt_cfg, *, depths=(), widths=(), tolerance: float = 0.03,
                         num_heads: int = 0) -> list[dict]:
  """Transformers within `tolerance` of `crt_cfg`'s per-token cost, same V and MLP ratio.

  For each depth N in `depths` the width C solves N·12C² + VC = cost (`nearest_width`); for each
  width in `widths` the depth N does. Rows that cannot get within the tolerance are left out.
  Each row holds depth, width, num_heads, both costs and their ratio.
  """
  spec = models.spec_of(crt_cfg)
  if not spec.is_context_ready:
    raise ValueError('matched_transformers needs a context-ready model config')
  if spec.mlp_dim % spec.width:
    raise ValueError(f'FLOP matching assumes mlp_dim = ratio * width, got mlp_dim={spec.mlp_dim} '
                     f'at width={spec.width}')
  ratio = spec.mlp_dim // spec.width
  target = models.flops_per_token(spec)
  heads = num_heads or spec.num_heads
  v = spec.vocab_size
  rows = []
  for n in depths:
    c = nearest_width('transformer', n, target, v, heads, ratio)
    flops = cost('transformer', n, c, v, ratio)
    if abs(flops / target - 1) <= tolerance:
      rows.append(_row(n, c, heads, flops, target))
  for c in widths:
    if c % (2 * heads):
      raise ValueError(f'width {c} is not a multiple of 2 * num_heads = {2 * heads}')
    per_layer = cost('transformer', 1, c, 1, ratio) - c  # 12 C^2 per layer
    n = max(1, round((target - v * c) / per_layer))
    flops = cost('transformer', n, c, v, ratio)
    if abs(flops / target - 1) <= tolerance:
      rows.append(_row(n, c, heads, flops, target))
  return rows


def cost_table(rows: list[dict]) -> str:
  """A markdown table of matched rows: both costs and their ratio."""
  lines = ['| transformer | FLOPs/token | CRT FLOPs/token | ratio |', '|---|---|---|---|']
  for r in rows:
    lines.append(f"| N={r['depth']} C={r['width']} | {r['flops_per_token']:,} | "
                 f"{r['target_flops_per_token']:,} | {r['ratio']:.3f} |")
  return '\n'.join(lines) + '\n'
