"""Constrained RMS inversion for the numerically stable Gemma update (the paper's Appendix B).

The post-MLP RMSNorm makes the branch output m ⊙ N(h): whatever h is, N(h) lies on the sphere
‖y‖² = d. The stable update chooses the point of that sphere closest to the wanted branch output
g, realises it with a rank-1 patch of W_down, and leaves only the (small) remainder to the scale
patch Δm. This module solves

    min_y ‖m ⊙ y − g‖²   subject to   mean(y²) = 1

in float64 numpy. Stationarity gives y_i = m_i g_i / (m_i² − μ) with μ < min m² at the global
minimum (a trust-region problem). With t = min m² − μ > 0 the secular equation

    F(t) = Σ_i (m_i g_i)² / (m_i² − min m² + t)² − d = 0

is strictly decreasing in t and F(max|m g|) ≤ 0, so one root is bracketed; bisection on log t
finds it. The *hard case*: if m_i g_i = 0 on every coordinate where m² is minimal (an exact zero
scale 1 + w_i = 0 is the usual cause) and the other coordinates alone stay inside the sphere,
there is no root; then μ = min m², the formula holds off the minimal set and the missing norm
goes onto the minimal coordinates (any split there has the same objective).

One departure from the plain least-squares problem: the scale patch Δm_i = r_i / y_i can only
repair a residual r_i where y_i ≠ 0. Outside the hard case the optimum has y_i = 0 wherever
m_i = 0, although r_i = g_i ≠ 0 there. Such coordinates get |y_i| = 1 instead (their residual is
g_i whatever y_i is, and an RMS-sized value keeps Δm_i = g_i / y_i as small as the direct
update's), and the other coordinates are solved on the sphere with the norm that is left.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.models import layers

_BISECTION_STEPS = 120  # log t spans < 2**10; 120 halvings reach far below float64 resolution.
_TINY = 1e-300


def _solve(m2, b, norm_sq):
  """Rows of min ‖m ⊙ y − g‖² s.t. Σ y² = norm_sq, given m² and b = m ⊙ g.

  Coordinates with m² = inf are left out (y = 0 there). Returns (y, mu, hard_case).
  """
  m2_min = m2.min(axis=1, keepdims=True)
  gap = m2 - m2_min  # >= 0, exactly 0 on the minimal coordinates (inf where left out)
  minimal = gap == 0
  with np.errstate(divide='ignore', invalid='ignore'):
    rest = np.where(minimal | (b == 0), 0.0, b / np.where(minimal, 1.0, gap))
  rest_sq = np.sum(rest * rest, axis=1)
  hard = np.all(np.where(minimal, b == 0, True), axis=1) & (rest_sq <= norm_sq)

  b_sq = b * b

  def secular(t):
    with np.errstate(divide='ignore', over='ignore', under='ignore', invalid='ignore'):
      terms = np.where(b_sq == 0, 0.0, b_sq / np.square(gap + t[:, None]))
    return np.sum(terms, axis=1) - norm_sq

  hi = np.log(np.maximum(np.abs(b).max(axis=1) * np.sqrt(b.shape[1] / norm_sq), _TINY))
  lo = np.full_like(hi, np.log(_TINY))
  for _ in range(_BISECTION_STEPS):
    mid = 0.5 * (lo + hi)
    positive = secular(np.exp(mid)) > 0
    lo = np.where(positive, mid, lo)
    hi = np.where(positive, hi, mid)
  t = np.exp(hi)
  with np.errstate(divide='ignore', invalid='ignore'):
    y = np.where(b == 0, 0.0, b / (gap + t[:, None]))
  # Bisection leaves Σ y² a few ulps (more near a pole) from its target; a rescale makes the
  # point exactly feasible at a negligible cost in optimality. All-zero rows are hard cases.
  norm = np.sqrt(np.sum(y * y, axis=1, keepdims=True) / norm_sq[:, None])
  y = y / np.where(norm == 0, 1.0, norm)

  count = minimal.sum(axis=1, keepdims=True)
  fill = np.sqrt(np.maximum(norm_sq - rest_sq, 0.0)[:, None] / count)
  y = np.where(hard[:, None], np.where(minimal, fill, rest), y)
  mu = np.where(hard, m2_min[:, 0], m2_min[:, 0] - t)
  return y, mu, hard


def solve_rms_inversion(m, g):
  """argmin_y ‖m ⊙ y − g‖² s.t. mean(y²) = 1, row-wise over the last axis, in float64.

  Returns (y, info) with info = {'mu': [..], 'hard_case': [..] bool, 'constraint':
  |mean(y²) − 1| [..]}; see the module docstring for zero-scale coordinates.
  """
  m = np.asarray(m, np.float64)
  g = np.asarray(g, np.float64)
  shape = np.broadcast_shapes(m.shape, g.shape)
  d = shape[-1]
  m = np.broadcast_to(m, shape).reshape(-1, d)
  g = np.broadcast_to(g, shape).reshape(-1, d)
  m2, b = m * m, m * g
  y, mu, hard = _solve(m2, b, np.full(len(m), float(d)))

  dead = (m == 0) & (g != 0) & (y == 0)
  rows = dead.any(axis=1) & (dead.sum(axis=1) < d)
  if rows.any():
    kept = dead[rows]
    y_kept, mu[rows], hard[rows] = _solve(np.where(kept, np.inf, m2[rows]), b[rows],
                                          d - kept.sum(axis=1).astype(np.float64))
    y[rows] = np.where(kept, np.where(g[rows] < 0, -1.0, 1.0), y_kept)
  info = {'mu': mu.reshape(shape[:-1]), 'hard_case': hard.reshape(shape[:-1]),
          'constraint': np.abs(np.mean(y * y, axis=1) - 1.0).reshape(shape[:-1])}
  return y.reshape(shape), info


def rms_inversion(m: jax.Array, g: jax.Array):
  """`solve_rms_inversion` inside traced JAX code (a host callback; float64 on the host).

  Returns (y, constraint residual, hard_case, mu) with y, mu in float32 (float64 under x64).
  """
  dtype = np.dtype(layers.accumulation_dtype(g.dtype))
  batch = g.shape[:-1]
  # JAX canonicalises a callback's operands and results with the x64 flag of the thread the
  # callback runs on, which need not be the one that traced it under `jax.enable_x64`: float64
  # would arrive and return as float32 (and be refused). 64-bit values therefore cross as pairs of
  # uint32 words, canonical under either flag, and are bitcast back bit for bit.
  wide = dtype.itemsize == 8

  def to_words(x):  # traced side
    return jax.lax.bitcast_convert_type(x.astype(dtype), jnp.uint32) if wide else x

  def from_words(x):  # traced side
    return jax.lax.bitcast_convert_type(x, dtype) if wide else x

  def host_in(x):
    x = np.ascontiguousarray(x)
    return x.view(np.float64).reshape(x.shape[:-1]) if wide else x

  def host_out(x):
    x = np.ascontiguousarray(x, dtype)
    return x.view(np.uint32).reshape(x.shape + (2,)) if wide else x

  def host(m, g):
    y, info = solve_rms_inversion(host_in(m), host_in(g))
    return host_out(y), host_out(info['constraint']), info['hard_case'], host_out(info['mu'])

  def result(shape):
    return (jax.ShapeDtypeStruct(shape + (2,), np.uint32) if wide
            else jax.ShapeDtypeStruct(shape, dtype))

  out_shapes = (result(g.shape), result(batch), jax.ShapeDtypeStruct(batch, jnp.bool_),
                result(batch))
  y, constraint, hard, mu = jax.pure_callback(
      host, out_shapes, to_words(jnp.broadcast_to(m, g.shape)), to_words(g),
      vmap_method='expand_dims')
  return from_words(y), from_words(constraint), hard, from_words(mu)
