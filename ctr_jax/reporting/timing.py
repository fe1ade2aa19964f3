"""Wall-clock medians of jitted work (outputs are blocked on, so async dispatch is counted)."""

import statistics
import time
from typing import Any, Callable

import jax
import numpy as np


def median_seconds(fn: Callable[[], Any], *, warmup: int, repeats: int) -> float:
  """Median wall time of `fn()` over `repeats` runs after `warmup` (>= 1) untimed ones."""
  for _ in range(max(warmup, 1)):
    jax.block_until_ready(fn())
  times = []
  for _ in range(max(repeats, 1)):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def interleaved_seconds(fns: dict, *, warmup: int, repeats: int) -> dict:
  """Wall times of several callables run in turn, one call of each per round, `repeats` rounds
  after `warmup` untimed ones: {name: [seconds per round]}.

  A comparison of two implementations (ours against the peer) is made from the same rounds, so
  the minutes-long drifts of a shared machine (10-15% here) fall on both sides alike instead of
  on whichever ran later. The order within a round rotates from round to round, so that no
  callable always runs first (after the others' cache and frequency effects) or last.
  """
  for _ in range(max(warmup, 1)):
    for fn in fns.values():
      jax.block_until_ready(fn())
  names = list(fns)
  times = {name: [] for name in names}
  for round_index in range(max(repeats, 1)):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      start = time.perf_counter()
      jax.block_until_ready(fns[name]())
      times[name].append(time.perf_counter() - start)
  return times


def median_ratio(numerators, denominators) -> float:
  """Median over rounds of numerator / denominator (paired: the same round's two times)."""
  return statistics.median(a / b for a, b in zip(numerators, denominators))


def per_item_seconds(run: Callable[[int], Any], small: int, large: int, *, warmup: int,
                     repeats: int) -> float:
  """Marginal seconds per item: (t(large) - t(small)) / (large - small).

  Used for decode latency: the difference of two generation lengths cancels the prefill and
  the fixed per-call overhead.
  """
  t_small = median_seconds(lambda: run(small), warmup=warmup, repeats=repeats)
  t_large = median_seconds(lambda: run(large), warmup=warmup, repeats=repeats)
  return max(t_large - t_small, 0.0) / (large - small)


def power_law_exponent(xs, ys) -> float:
  """Least-squares slope of log y against log x: y ~ x^slope."""
  lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
  return float(np.polyfit(lx, ly, 1)[0])
