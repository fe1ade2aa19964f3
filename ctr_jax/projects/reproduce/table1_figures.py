"""The table1 study's figures (docs/reproduction/table1*.png) and the validation-curve crossover
that its verdicts and its curves share."""

import math

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce.studies import Scale


def mean_curve(runs: list[dict], value=lambda e: e['val_loss']) -> dict[int, float]:
  """{step: mean over the runs of `value` of their evaluation at that step}."""
  steps = sorted({e['step'] for r in runs for e in r['evals']})
  return {s: float(np.mean([value(e) for r in runs for e in r['evals'] if e['step'] == s]))
          for s in steps}


def crossover_step(crt: list[dict], baseline: list[dict]) -> int | None:
  """The first evaluation step from which the CRT's mean validation loss (parallel) stays below
  the baseline's; None if it never does."""
  a, b = mean_curve(crt), mean_curve(baseline)
  steps = sorted(set(a) & set(b))
  below = [a[s] < b[s] for s in steps]
  for i, s in enumerate(steps):
    if all(below[i:]):
      return s
  return None


def _finish(fig, ax, path: str, legend_size: int = 7) -> None:
  ax.grid(alpha=0.3)
  ax.legend(fontsize=legend_size)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_gaps(gaps: dict, scale: Scale, path: str) -> None:
  """The D = 1 CRT's PPL gap against FLOPs per token, one series per kind of matching, with
  95% intervals (a point without a bar: one seed); left in PPL, right as a fraction of the
  baseline's PPL (PPL differs between levels)."""
  matplotlib.use('Agg')
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  targets = [lv.flops_per_token for lv in scale.levels]
  for ax, relative in zip(axes, (False, True)):
    for k, (matching, marker) in enumerate((('inference', 'o'), ('training FLOPs/token', 's'),
                                            ('total training FLOPs', '^'),
                                            ('longer training', 'D'))):
      points = [(g['flops_per_token'] * (1 + 0.04 * k), g[matching]) for g in gaps.values()
                if matching in g]
      if not points:
        continue
      unit = [100 / p[1]['reference'] if relative else 1.0 for p in points]
      y = [p[1]['delta_mean'] * u for p, u in zip(points, unit)]
      low = [0 if np.isnan(p[1]['ci'][0]) else (p[1]['delta_mean'] - p[1]['ci'][0]) * u
             for p, u in zip(points, unit)]
      high = [0 if np.isnan(p[1]['ci'][1]) else (p[1]['ci'][1] - p[1]['delta_mean']) * u
              for p, u in zip(points, unit)]
      ax.errorbar([p[0] for p in points], y, yerr=[low, high], fmt=marker + '-', capsize=3,
                  label=f'matched in {matching}')
    ax.axhline(0, color='gray', lw=0.8)
    ax.set_xscale('log')
    # Every level of the scale on the axis, run or not, named as in the tables.
    ax.set_xlim(min(targets) / 1.6, max(targets) * 1.6)
    ax.set_xticks(targets, [f'{lv.name}\n{lv.flops_per_token:,}' for lv in scale.levels])
    ax.minorticks_off()
    ax.set_xlabel('inference FLOPs per token (level)')
    ax.set_ylabel('% of the baseline\'s PPL' if relative else 'PPL, D = 1 CRT minus baseline')
    ax.set_title(('relative gap' if relative else 'the CRT\'s PPL gap')
                 + ', 95% intervals over seeds')
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_curves(records: list[dict], scale: Scale, inference: set[str], path: str) -> None:
  """Validation PPL against step, one panel per cost level with runs; `inference`: the
  inference-matched groups (solid/dashed; the compute-matched ones dotted)."""
  matplotlib.use('Agg')
  groups = repro_lib.by_group(records)
  # Levels with no finished run get no panel (the table says "not run yet").
  levels = [lv.name for lv in scale.levels
            if any(g.startswith(f'{lv.name} ') for g in groups)] or [scale.levels[0].name]
  fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 4), squeeze=False)
  for ax, level in zip(axes[0], levels):
    mine = {g: rs for g, rs in groups.items() if g.startswith(f'{level} ')}
    for g, rs in sorted(mine.items()):
      curve = mean_curve(rs, lambda e: math.exp(e['val_loss']))
      style = ('-' if ' D=' in g else '--') if g in inference else ':'
      ax.plot(list(curve), list(curve.values()), style, marker='o' if g in inference else 's',
              ms=3, label=g.split(' ', 1)[1])
    crts = [g for g in mine if ' D=' in g and g in inference]
    ts = [g for g in mine if ' N=' in g and g in inference]
    if crts and ts:
      best = lambda gs: min(gs, key=lambda g: np.mean([repro_lib.final_ppl(r) for r in mine[g]]))
      step = crossover_step(mine[best(crts)], mine[best(ts)])
      first = min(e['step'] for r in mine[best(crts)] for e in r['evals'])
      if step is not None and step > first:
        ax.axvline(step, color='gray', ls=':', label=f'crossover (best CRT vs best N) {step}')
      elif step is not None:
        ax.text(0.02, 0.03, f'best CRT below best N from the first evaluation (step {first}) on',
                transform=ax.transAxes, fontsize=7, color='gray')
    ax.set_title(f'cost level {level} FLOPs/token')
    ax.set_xlabel('step')
    ax.set_ylabel('validation PPL (parallel K; mean over seeds)')
    ax.set_yscale('log')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_longer(records: list[dict], pairs: list[tuple[str, str]], path: str) -> None:
  """Validation PPL against step for each (CRT, transformer) pair, the CRT solid and the
  transformer dashed, one colour per training length; the band is the range over seeds."""
  matplotlib.use('Agg')
  groups = repro_lib.by_group(records)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  lowest = math.inf
  for colour, pair in zip(('tab:blue', 'tab:orange', 'tab:green'), pairs):
    for group, style in zip(pair, ('-', '--')):
      runs = groups.get(group, [])
      if not runs:
        continue
      steps = sorted({e['step'] for r in runs for e in r['evals']})
      per_seed = [[math.exp(e['val_loss']) for r in runs for e in r['evals'] if e['step'] == s]
                  for s in steps]
      lowest = min(lowest, *map(min, per_seed))
      ax.plot(steps, [np.mean(v) for v in per_seed], style, color=colour, marker='.', ms=3,
              label=f'{group} ({len(runs)} seed{"s" if len(runs) > 1 else ""})')
      if len(runs) > 1:
        ax.fill_between(steps, [min(v) for v in per_seed], [max(v) for v in per_seed],
                        color=colour, alpha=0.15, lw=0)
  if math.isfinite(lowest):  # the end of training is where the pairs differ: zoom there
    ax.set_ylim(0.95 * lowest, 2 * lowest)
  ax.set_xlabel('step')
  ax.set_ylabel('validation PPL (parallel K; mean, range over seeds)')
  ax.set_title('does the gap close with longer training?')
  _finish(fig, ax, path)
