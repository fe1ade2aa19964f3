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


def _transformer_cost(depth: int, width: int, vocab_size: int, mlp_ratio: int) -> int:
  return models.flops_per_token(models.model_config(
      kind='transformer', depth=depth, width=width, num_heads=1, vocab_size=vocab_size,
      mlp_ratio=mlp_ratio))


def _row(depth, width, heads, cost, target):
  return {'kind': 'transformer', 'depth': depth, 'width': width, 'num_heads': heads,
          'flops_per_token': cost, 'target_flops_per_token': target, 'ratio': cost / target}


def matched_transformers(crt_cfg, *, depths=(), widths=(), tolerance: float = 0.03,
                         num_heads: int = 0) -> list[dict]:
  """Transformers within `tolerance` of `crt_cfg`'s per-token cost, same V and MLP ratio.

  For each depth N in `depths` the width C solves N·12C² + VC = cost (rounded to a multiple of
  2·heads, so the head dimension stays even for RoPE); for each width in `widths` the depth N
  does. Rows that cannot get within the tolerance are left out. Each row holds depth, width,
  num_heads, both costs and their ratio.
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
  v, per_layer = spec.vocab_size, 4 + 2 * ratio  # N·(4 + 2r)C² + VC
  rows = []
  for n in depths:
    exact = (-v + math.sqrt(v * v + 4 * n * per_layer * target)) / (2 * n * per_layer)
    step = 2 * heads
    candidates = {max(step, step * math.floor(exact / step)), step * math.ceil(exact / step)}
    best = min(((_transformer_cost(n, c, v, ratio), c) for c in candidates),
               key=lambda cost_width: abs(cost_width[0] / target - 1))
    if abs(best[0] / target - 1) <= tolerance:
      rows.append(_row(n, best[1], heads, best[0], target))
  for c in widths:
    if c % (2 * heads):
      raise ValueError(f'width {c} is not a multiple of 2 * num_heads = {2 * heads}')
    n = max(1, round((target - v * c) / (per_layer * c * c)))
    cost = _transformer_cost(n, c, v, ratio)
    if abs(cost / target - 1) <= tolerance:
      rows.append(_row(n, c, heads, cost, target))
  return rows


def cost_table(rows: list[dict]) -> str:
  """A markdown table of matched rows: both costs and their ratio."""
  lines = ['| transformer | FLOPs/token | CRT FLOPs/token | ratio |', '|---|---|---|---|']
  for r in rows:
    lines.append(f"| N={r['depth']} C={r['width']} | {r['flops_per_token']:,} | "
                 f"{r['target_flops_per_token']:,} | {r['ratio']:.3f} |")
  return '\n'.join(lines) + '\n'
