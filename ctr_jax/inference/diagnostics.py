"""Convergence diagnostics of the K-step unroll (paper section 4 / 5.8).

The map F(c) = CorrFFN(LN(shift(Block(e + c)) + e)) is iterated from c^(0) = 0. Reported per
iteration k: the max-norm and RMS of c^(k) - c^(k-1). The empirical contraction ratio L is the
geometric mean of successive max-norm ratios; if F contracts with rate L < 1, the distance to the
fixed point after K steps is at most L / (1 - L) * ||c^(K) - c^(K-1)|| (a-posteriori bound).
"""

import numpy as np


def unroll_diagnostics(model, variables, tokens, k_unroll: int | None = None) -> dict:
  """Correction-change norms per iteration and the empirical contraction ratio for a batch."""
  if not model.spec.is_context_ready:
    raise ValueError('unroll diagnostics need a context-ready model')
  _, aux = model.apply(variables, tokens, k_unroll=k_unroll, return_aux=True)
  change_max = np.asarray(aux['change_max'], np.float64)
  change_rms = np.asarray(aux['change_rms'], np.float64)
  ratio = contraction_ratio(change_max)
  last = float(change_max[-1])
  bound = ratio / (1 - ratio) * last if ratio < 1 else float('inf')
  return {'change_max': change_max.tolist(), 'change_rms': change_rms.tolist(),
          'ratios': _successive_ratios(change_max).tolist(), 'contraction_ratio': ratio,
          'error_bound': bound, 'convergence_loss': float(aux['convergence_loss'])}


def _successive_ratios(changes: np.ndarray) -> np.ndarray:
  changes = np.asarray(changes, np.float64)
  return changes[1:] / np.maximum(changes[:-1], 1e-30)


def contraction_ratio(changes) -> float:
  """Geometric mean of change[k+1] / change[k] over iterations whose change is still nonzero."""
  changes = np.asarray(changes, np.float64)
  live = changes > 1e-30
  if live.sum() < 2:
    return 0.0
  first, last = np.argmax(live), len(live) - 1 - np.argmax(live[::-1])
  steps = last - first
  if steps == 0:
    return 0.0
  return float((changes[last] / changes[first]) ** (1.0 / steps))
