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
