"""The FLOP matcher: matched transformers cost what the context-ready model costs (paper §1.4)."""

import numpy as np
import pytest

from ctr_jax import models
from ctr_jax.models import flop_match


def _paper_cost(kind, depth, width, vocab):
  # The paper's formulas, written out independently of models.flops_per_token.
  block = depth * 12 * width ** 2 + vocab * width
  return block + 8 * width ** 2 if kind == 'context_ready' else block


def test_paper_pair_d5_c1120_finds_n6_c1088():
  crt = models.model_config(name='d5_c1120', vocab_size=32000)
  rows = flop_match.matched_transformers(crt, depths=(6,), widths=(1088,))
  assert [(r['depth'], r['width']) for r in rows] == [(6, 1088), (6, 1088)]
  target = _paper_cost('context_ready', 5, 1120, 32000)
  assert rows[0]['target_flops_per_token'] == target == 121_139_200  # reference §1.4: 121.1M
  assert rows[0]['flops_per_token'] == _paper_cost('transformer', 6, 1088, 32000)


@pytest.mark.parametrize('seed', range(5))
def test_random_sizes_are_within_tolerance_and_nearest(seed):
  rng = np.random.default_rng(seed)
  heads = int(rng.choice([2, 4]))
  depth, width = int(rng.integers(1, 4)), int(rng.choice([64, 96, 128, 192, 256]))
  vocab = int(rng.choice([512, 2048, 4096]))
  crt = models.model_config(kind='context_ready', depth=depth, width=width, num_heads=heads,
                            vocab_size=vocab)
  target = _paper_cost('context_ready', depth, width, vocab)
  rows = {r['depth']: r for r in flop_match.matched_transformers(crt, depths=(2, 3, 4, 6))}
  for n in (2, 3, 4, 6):
    # Brute force over every admissible width (multiples of 2 * heads, for RoPE).
    best = min(range(2 * heads, 4096, 2 * heads),
               key=lambda c: abs(_paper_cost('transformer', n, c, vocab) / target - 1))
    best_error = abs(_paper_cost('transformer', n, best, vocab) / target - 1)
    assert (n in rows) == (best_error <= 0.03)
    if n in rows:
      r = rows[n]
      cost = _paper_cost('transformer', n, r['width'], vocab)
      assert r['flops_per_token'] == cost and r['target_flops_per_token'] == target
      assert abs(cost / target - 1) == pytest.approx(best_error)
      assert r['ratio'] == pytest.approx(cost / target)


def test_rejects_transformer_and_reports_table():
  with pytest.raises(ValueError, match='context-ready'):
    flop_match.matched_transformers(models.model_config(kind='transformer'), depths=(2,))
  crt = models.model_config(kind='context_ready', depth=2, width=128, num_heads=4,
                            vocab_size=2048)
  table = flop_match.cost_table(flop_match.matched_transformers(crt, depths=(3,)))
  assert table.count('\n') == 3 and '| N=3 C=' in table


def test_nearest_width_of_a_context_ready_model():
  # D = 3 at ~the d2_c144 cost: 44 C^2 + 2048 C within a grid step of the target.
  target = _paper_cost('context_ready', 2, 144, 2048)
  c = flop_match.nearest_width('context_ready', 3, target, 2048, num_heads=4)
  assert c % 8 == 0
  errors = {w: abs(_paper_cost('context_ready', 3, w, 2048) / target - 1)
            for w in (c - 8, c, c + 8)}
  assert errors[c] == min(errors.values())
  assert flop_match.cost('context_ready', 3, c, 2048) == _paper_cost('context_ready', 3, c, 2048)


# Training FLOPs per token by hand (docs/benchmarks.md: 3 x forward, forward = 2 x the matmul
# weights + 4 T C per layer for attention), V = 2048, T = 128:
#   N = 2, C = 160: layer 2*12*160^2 + 4*128*160 = 696,320; head 2*2048*160 = 655,360;
#     3 * (2 * 696,320 + 655,360) = 6,144,000.
#   D = 1, C = 176: unit layer 2*12*176^2 + 4*128*176 = 833,536; correction 2*8*176^2 = 495,616;
#     one iteration 1,329,152; head 2*2048*176 = 720,896 (3 x: 2,162,688).
#     K ~ U{2..5}: forward 3.5 + backward 7 = 10.5 iterations -> 16,118,784;
#     with m = 2: forward 3.5 + backward 4 -> 7.5 x 1,329,152 + 2,162,688 = 12,131,328;
#     fixed K = 5: 15 iterations -> 22,099,968; K ~ U{1..5}, m = 2: forward 3, backward
#     2 x mean(1, 2, 2, 2, 2) = 3.6 -> 6.6 x 1,329,152 + 2,162,688 = 10,935,091.2.
def test_training_flops_per_token_by_hand():
  t2 = models.model_config(kind='transformer', depth=2, width=160, num_heads=4, vocab_size=2048)
  assert flop_match.training_flops_per_token(t2, 128) == 6_144_000
  d1 = models.model_config(kind='context_ready', depth=1, width=176, num_heads=4,
                           vocab_size=2048, k_unroll=5)
  train = lambda **kw: flop_match.training_flops_per_token(d1, 128, **kw)
  assert train(k_min=2) == 16_118_784
  assert train(k_min=2, grad_iterations=2) == 12_131_328
  assert train() == 22_099_968
  assert train(k_min=1, grad_iterations=2) == pytest.approx(10_935_091.2)
  assert train(grad_iterations=5) == train()  # m = K backpropagates through all of them
  assert flop_match.training_cost('context_ready', 1, 176, 2048, 128, k_unroll=5, k_min=2,
                                  grad_iterations=2) == 12_131_328
  assert flop_match.training_cost('transformer', 2, 160, 2048, 128) == 6_144_000


def test_training_flops_agree_with_the_benchmark_at_fixed_k():
  from ctr_jax.bench import suite  # pylint: disable=g-import-not-at-top
  for kind, depth, correction in (('context_ready', 2, 'add'), ('context_ready', 1, 'concat'),
                                  ('transformer', 3, 'add')):
    cfg = models.model_config(kind=kind, depth=depth, width=96, num_heads=4, vocab_size=512,
                              **({'k_unroll': 4, 'correction': correction}
                                 if kind == 'context_ready' else {}))
    for m in (0, 1, 3):
      assert flop_match.training_flops_per_token(cfg, 64, grad_iterations=m) == pytest.approx(
          suite.training_flops_per_token(cfg, 64, 4, m))


def test_nearest_training_width_matches_the_d1_crt():
  # Target: the D = 1, C = 176 CRT with K ~ U{2..5} (16,118,784). N = 2: C = 280 gives
  # 3 x (2 x (2*12*280^2 + 4*128*280) + 2*2048*280) = 15,590,400 (-3.3%), C = 288 gives
  # 16,367,616 (+1.5%).
  width = flop_match.nearest_training_width(2, 16_118_784, 2048, 128, num_heads=4)
  assert width == 288
  assert flop_match.training_cost('transformer', 2, 280, 2048, 128) == 15_590_400
  assert flop_match.training_cost('transformer', 2, 288, 2048, 128) == 16_367_616
