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

Training compute is counted apart (`training_flops_per_token`), as docs/benchmarks.md counts
model FLOPs: 3 x forward, where a context-ready model's forward passes its unit and correction
once per iteration of the K drawn.
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


def training_flops_per_token(cfg, seq_len: int, *, k_min: int = 0,
                             grad_iterations: int = 0) -> float:
  """Model FLOPs per trained token, counted as docs/benchmarks.md counts them (MFU).

  3 x forward (forward + backward, no rematerialisation), forward = 2 x the matmul weights a
  token passes through + 4 T C per layer for causal attention (T = `seq_len`). A context-ready
  model passes its D-layer unit and its correction once per iteration, K times for the K
  drawn, and its output layer once: forward K (unit + correction) + head. With
  `grad_iterations` m < K only the last m iterations are differentiated (the first K - m run on
  stop_gradient'ed parameters): forward K passes, backward 2 m passes, so (K + 2 m) passes and
  the head 3 times. Random depth (`k_min` > 0: K ~ U{k_min..K} per batch) gives the mean over
  the draw: (k_min + K) / 2 forward passes and 2 x the mean of min(m, K) backward. A transformer
  is 3 x (N layers + head). The mean over the draw of `models.training_flops_per_token` (fixed K).
  """
  s = models.spec_of(cfg)
  if not s.is_context_ready:
    return float(models.training_flops_per_token(s, seq_len, 1))
  draws = range(k_min, s.k_unroll + 1) if k_min > 0 else (s.k_unroll,)
  return sum(models.training_flops_per_token(s, seq_len, k, grad_iterations)
             for k in draws) / len(draws)


def training_cost(kind: str, depth: int, width: int, vocab_size: int, seq_len: int, *,
                  k_unroll: int = 1, k_min: int = 0, grad_iterations: int = 0,
                  mlp_ratio: int = 4, correction: str = 'add') -> float:
  """`training_flops_per_token` of a model of this shape (num_heads does not change it)."""
  fields = dict(kind=kind, depth=depth, width=width, num_heads=1, vocab_size=vocab_size,
                mlp_ratio=mlp_ratio)
  if kind == 'context_ready':
    fields.update(correction=correction, k_unroll=k_unroll)
  return training_flops_per_token(models.model_config(**fields), seq_len, k_min=k_min,
                                  grad_iterations=grad_iterations)


def nearest_training_width(depth: int, target: float, vocab_size: int, seq_len: int,
                           num_heads: int, mlp_ratio: int = 4) -> int:
  """The width of an N = `depth` transformer, a multiple of 2 * num_heads, whose training
  FLOPs per token (`training_cost`) are nearest to `target`."""
  step = 2 * num_heads
  cost_of = lambda w: training_cost('transformer', depth, w, vocab_size, seq_len,
                                    mlp_ratio=mlp_ratio)
  width = step
  while cost_of(width + step) < target:  # the cost grows with the width
    width += step
  return min((width, width + step), key=lambda w: (abs(cost_of(w) / target - 1), w))


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
