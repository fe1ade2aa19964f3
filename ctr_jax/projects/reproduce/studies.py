"""The studies of ctr_jax.projects.reproduce that train and compare models: which runs each trains and
how its section reads; the scales and the table helpers every study shares.

Reference sections: 6.2 (table1), 6.5 (k_min), 6.4 (width), 8 (ablations); grad_iterations is
beyond the paper. The studies that also evaluate trained models (seq_vs_parallel, k_eval,
conversion) are in repro_evaluated, the registry and the driver in repro_registry; the claims are
those of reference section 9.
"""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from ctr_jax import models
from ctr_jax.models import flop_match
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce.lib import Run, compare, fmt, mean_std


@dataclasses.dataclass(frozen=True)
class Scale:
  """Sizes and budgets of one scale; every run of a study shares them."""
  vocab: int
  steps: int
  batch: int
  seq_len: int
  heads: int
  levels: tuple          # (name, FLOPs/token of the level); every table1 model is within 3%
  base_width: int        # the single-size studies (k_min, ablations, ...)
  widths: tuple          # the width study
  tokens_per_param: float
  context_lengths: tuple  # the context-length pair of the width study


SCALES = {
    'cpu': Scale(vocab=2048, steps=1200, batch=16, seq_len=128, heads=4,
                 levels=(('~1M', 965_000), ('~4M', 4_114_432)), base_width=144, widths=(64, 128, 256),
                 tokens_per_param=2.0, context_lengths=(64, 256)),
    # Seconds per run: what the tests use (the data_dir of the test fixtures has V = 320).
    'tiny': Scale(vocab=320, steps=4, batch=2, seq_len=16, heads=2, levels=(('tiny', 43_008),),
                  base_width=32, widths=(16, 32), tokens_per_param=0.002,
                  context_lengths=(8, 16)),
}


def recipe_arg(scale: Scale, **fields) -> str:
  """A configs/repro.py arg: the scale's shared recipe plus `fields`."""
  values = dict(steps=scale.steps, batch=scale.batch, seq_len=scale.seq_len, vocab=scale.vocab,
                **fields)
  return ','.join(f'{k}={v}' for k, v in values.items())


def size_name(kind: str, depth: int, width: int, heads: int) -> str:
  return f"{'d' if kind == 'context_ready' else 't'}{depth}_c{width}_h{heads}"


def _label(kind: str, depth: int, width: int) -> str:
  return f"{'D' if kind == 'context_ready' else 'N'}={depth} C={width}"


# ------------------------------------------------------------------------------------------------
# table1: context-ready D = 1, 2, 3 against FLOP-matched transformers of 2, 3, 4 and 6 layers.
# ------------------------------------------------------------------------------------------------

TABLE1_CRT_DEPTHS = (1, 2, 3)
TABLE1_TRANSFORMER_DEPTHS = (2, 3, 4, 6)


def table1_models(scale: Scale) -> list[dict]:
  """Every model of the table1 study with its cost, the level target and their ratio."""
  out = []
  for level, target in scale.levels:
    for kind, depths in (('context_ready', TABLE1_CRT_DEPTHS),
                         ('transformer', TABLE1_TRANSFORMER_DEPTHS)):
      for depth in depths:
        c = flop_match.nearest_width(kind, depth, target, scale.vocab, scale.heads)
        flops = flop_match.cost(kind, depth, c, scale.vocab)
        out.append({'level': level, 'kind': kind, 'depth': depth, 'width': c,
                    'flops_per_token': flops, 'target_flops_per_token': target,
                    'ratio': flops / target, 'matched': abs(flops / target - 1) <= 0.03})
  return out


def table1_runs(scale, seeds):
  runs = []
  for m in table1_models(scale):
    if not m['matched']:
      continue  # reported as unmatched in the table; never trained
    size = size_name(m['kind'], m['depth'], m['width'], scale.heads)
    for seed in range(seeds):
      runs.append(Run('table1', f"{m['level']} {_label(m['kind'], m['depth'], m['width'])}",
                      seed, recipe_arg(scale, size=size), info=tuple(sorted(m.items()))))
  return runs


def table1_report(records, scale, figure):
  lines = ['FLOPs/token is the paper\'s per-token inference cost (D·12C² + 8C² + VC against '
           'N·12C² + VC, at this V); the models see the same tokens. Training compute is not '
           'matched: the CRTs train with K ~ U{2..5} (configs/repro.py defaults), so each '
           'training token passes their block 2-5 times (the wall-time column shows the cost).',
           '']
  verdicts = []
  groups = repro_lib.by_group(records)
  for level, _ in scale.levels:
    models = [m for m in table1_models(scale) if m['level'] == level]
    lines += [f'### Cost level {level} FLOPs/token', '',
              '| model | kind | FLOPs/token | ratio to level | params | val PPL (sequential for '
              'CRTs) | val PPL parallel K | seeds | wall time / run |',
              '|---|---|---|---|---|---|---|---|---|']
    for m in models:
      group = f"{level} {_label(m['kind'], m['depth'], m['width'])}"
      rs = groups.get(group, [])
      kind = 'CRT' if m['kind'] == 'context_ready' else 'transformer'
      if not m['matched']:
        lines.append(f"| {group} | {kind} | {m['flops_per_token']:,} | {m['ratio']:.3f} | - | "
                     'not FLOP-matched within 3%: not trained | | | |')
        continue
      if not rs:
        lines.append(f"| {group} | {kind} | {m['flops_per_token']:,} | {m['ratio']:.3f} | | "
                     'not run yet | | 0 | |')
        continue
      ppl = fmt(*mean_std(repro_lib.final_ppl(r) for r in rs))
      par = fmt(*mean_std(r['final']['val_ppl'] for r in rs))
      wall = np.mean([r['wall_time_seconds'] or 0 for r in rs]) / 60
      lines.append(f"| {group} | {kind} | {m['flops_per_token']:,} | {m['ratio']:.3f} | "
                   f"{rs[0]['num_params']:,} | {ppl} | {par} | {len(rs)} | {wall:.1f} min |")
    lines.append('')
    crts = [g for g in groups if g.startswith(f'{level} D=')]
    transformers = [g for g in groups if g.startswith(f'{level} N=')]
    if crts and transformers:
      best_t = min(transformers, key=lambda g: np.mean([repro_lib.final_ppl(r)
                                                        for r in groups[g]]))
      for g in sorted(crts):
        c = compare(groups[g], groups[best_t], repro_lib.final_ppl)
        delta = fmt(c['delta_mean'], c['delta_std'])
        step = crossover_step(groups[g], groups[best_t])
        first = min(e['step'] for r in groups[g] for e in r['evals'])
        cross = ('never below it' if step is None else
                 f'below it from the first evaluation (step {first}) on' if step == first else
                 f'crossover at step {step}')
        verdicts.append(f"{g} vs the best transformer {best_t}: ΔPPL {delta} over {c['n']} "
                        f"seed(s): **{c['verdict']}**; validation curve {cross}")
  if figure:
    _plot_curves(records, scale, figure)
    lines.append(f'![table1 curves](reproduction/{os.path.basename(figure)})')
  return lines, verdicts


def crossover_step(crt: list[dict], baseline: list[dict]) -> int | None:
  """The first evaluation step from which the CRT's mean validation loss (parallel) stays below
  the baseline's; None if it never does (or is below from the start... that is step 1's)."""
  def curve(rs):
    steps = sorted({e['step'] for r in rs for e in r['evals']})
    return {s: np.mean([e['val_loss'] for r in rs for e in r['evals'] if e['step'] == s])
            for s in steps}
  a, b = curve(crt), curve(baseline)
  steps = sorted(set(a) & set(b))
  below = [a[s] < b[s] for s in steps]
  for i, s in enumerate(steps):
    if all(below[i:]):
      return s
  return None


def _plot_curves(records, scale, path):
  matplotlib.use('Agg')
  groups = repro_lib.by_group(records)
  # Levels with no finished run get no panel (the table says "not run yet").
  levels = [level for level, _ in scale.levels
            if any(g.startswith(f'{level} ') for g in groups)] or [scale.levels[0][0]]
  fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 4), squeeze=False)
  for ax, level in zip(axes[0], levels):
    mine = {g: rs for g, rs in groups.items() if g.startswith(f'{level} ')}
    for g, rs in sorted(mine.items()):
      steps = sorted({e['step'] for r in rs for e in r['evals']})
      ppl = [np.mean([math.exp(e['val_loss']) for r in rs for e in r['evals']
                      if e['step'] == s]) for s in steps]
      style = '-' if ' D=' in g else '--'
      ax.plot(steps, ppl, style, marker='o', ms=3, label=g.split(' ', 1)[1])
    crts = [g for g in mine if ' D=' in g]
    ts = [g for g in mine if ' N=' in g]
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


# ------------------------------------------------------------------------------------------------
# k_min, ablations, width: single-size studies of training-time choices.
# ------------------------------------------------------------------------------------------------


def k_min_runs(scale, seeds):
  size = size_name('context_ready', 2, scale.base_width, scale.heads)
  variants = (('K=5 k_min=2', 5, 2), ('K=5 fixed', 5, 0), ('K=2 fixed', 2, 0))
  return [Run('k_min', label, seed, recipe_arg(scale, size=size, k=k, k_min=k_min))
          for label, k, k_min in variants for seed in range(seeds)]


def k5_runs(scale, seeds):
  """The D = 2, K = 5, k_min = 2 runs of the k_min study (trained once, evaluated by several)."""
  return [r for r in k_min_runs(scale, seeds) if r.group == 'K=5 k_min=2']


ABLATIONS = (('add', False), ('token_blind', False), ('concat', False), ('none', False),
             ('tied', False), ('add', True))


# The 'add' row is the k_min study's K = 5, k_min = 2 run: the same config (the recipe's defaults
# are correction=add, cumulative=False), so it is trained once and read by both studies.
ADD_BASELINE = 'K=5 k_min=2'


def ablation_runs(scale, seeds):
  size = size_name('context_ready', 2, scale.base_width, scale.heads)
  runs = k5_runs(scale, seeds)
  for correction, cumulative in ABLATIONS:
    if (correction, cumulative) == ('add', False):
      continue
    label = correction + (' cumulative' if cumulative else '')
    fields = dict(size=size, correction=correction, cumulative=cumulative)
    runs += [Run('ablations', label, seed, recipe_arg(scale, **fields)) for seed in range(seeds)]
  return runs


def _transformer_params(width: int, vocab: int, heads: int) -> int:
  model = models.build(models.model_config(name=size_name('transformer', 2, width, heads),
                                           vocab_size=vocab))
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 2), jnp.int32))
  return models.count_params(shapes)


def width_runs(scale, seeds):
  runs = []
  for width in scale.widths:
    params = _transformer_params(width, scale.vocab, scale.heads)
    steps = max(2, round(scale.tokens_per_param * params / (scale.batch * scale.seq_len)))
    for kind in ('context_ready', 'transformer'):
      size = size_name(kind, 2, width, scale.heads)
      label = f'width {_label(kind, 2, width)}'
      runs += [Run('width', label, seed, recipe_arg(scale, size=size) .replace(
          f'steps={scale.steps}', f'steps={steps}'), info=(('transformer_params', params),))
               for seed in range(seeds)]
  for seq_len in scale.context_lengths:
    for kind in ('context_ready', 'transformer'):
      size = size_name(kind, 2, scale.base_width, scale.heads)
      # Same tokens per run at every context length: batch x T fixed.
      batch = max(1, scale.batch * scale.seq_len // seq_len)
      arg = recipe_arg(scale, size=size).replace(f'batch={scale.batch}', f'batch={batch}').replace(
          f'seq_len={scale.seq_len}', f'seq_len={seq_len}')
      runs += [Run('width', f'context T={seq_len} {_label(kind, 2, scale.base_width)}', seed, arg)
               for seed in range(seeds)]
  return runs


def simple_table(records, baseline: str | None, header: str):
  groups = repro_lib.by_group(records)
  lines = [f'| {header} | val PPL (sequential for CRTs) | val PPL parallel K | seeds | '
           'FLOPs/token | wall time / run |' + (f' Δ vs {baseline} |' if baseline else ''),
           '|---|---|---|---|---|---|' + ('---|' if baseline else '')]
  verdicts = []
  for g, rs in groups.items():
    ppl = fmt(*mean_std(repro_lib.final_ppl(r) for r in rs))
    par = fmt(*mean_std(r['final']['val_ppl'] for r in rs))
    wall = np.mean([r['wall_time_seconds'] or 0 for r in rs]) / 60
    row = f'| {g} | {ppl} | {par} | {len(rs)} | {rs[0]["flops_per_token"]:,} | {wall:.1f} min |'
    if baseline:
      if g == baseline or baseline not in groups:
        row += ' |'
      else:
        c = compare(rs, groups[baseline], repro_lib.final_ppl)
        row += f' {fmt(c["delta_mean"], c["delta_std"])} ({outcome_words(c)}) |'
        verdicts.append((g, c))
    lines.append(row)
  return lines, verdicts


# How a row's value compares with the reference row, by `compare`'s two-sigma rule.
_OUTCOME = {'holds': 'lower', 'does not hold': 'higher', 'inconclusive': 'inconclusive'}


def outcome_words(c: dict, what: str = '') -> str:
  """`compare`'s verdict in words, saying which way the mean points when it is inconclusive and
  that a single seed cannot be judged (so a large one-seed gap never reads as 'no loss')."""
  if c['verdict'] != 'inconclusive':
    return _OUTCOME[c['verdict']]
  side = f"{what + ' ' if what else ''}{'lower' if c['delta_mean'] < 0 else 'higher'}"
  if c['n'] < 2:
    return f'one seed, not judged; {side} on it'
  return f'inconclusive, {side} on average'


def k_min_report(records, scale, figure):
  del scale, figure
  lines, _ = simple_table(records, 'K=5 fixed', 'training K')
  groups = repro_lib.by_group(records)
  verdicts = []
  if {'K=5 k_min=2', 'K=5 fixed', 'K=2 fixed'} <= set(groups):
    same = compare(groups['K=5 k_min=2'], groups['K=5 fixed'], repro_lib.final_ppl)
    floor = compare(groups['K=5 fixed'], groups['K=2 fixed'], repro_lib.final_ppl)
    # "Same quality" is supported only if the test could tell a real difference apart: the
    # K = 2 floor must be measurably worse while k_min = 2 vs fixed K = 5 is within noise.
    if same['verdict'] == 'inconclusive' and floor['verdict'] == 'holds':
      verdict = 'holds (k_min = 2 within noise of fixed K = 5; fixed K = 2 measurably worse)'
    elif same['verdict'] != 'inconclusive':
      verdict = f"does not hold (k_min = 2 vs fixed K = 5: {_OUTCOME[same['verdict']]})"
    else:
      verdict = 'inconclusive (the K = 2 floor is not measurably worse either)'
    verdicts.append(f"k_min = 2 vs fixed K = 5: ΔPPL {fmt(same['delta_mean'], same['delta_std'])}"
                    f"; fixed K = 5 vs K = 2: {fmt(floor['delta_mean'], floor['delta_std'])}: "
                    f'**{verdict}**')
  return lines, verdicts


def ablation_report(records, scale, figure):
  del scale, figure
  lines, comparisons = simple_table(records, ADD_BASELINE, 'correction')
  lines = [f'The `add` correction (the paper\'s) is the row {ADD_BASELINE} (the k_min study\'s run, '
           'same config).', ''] + lines
  outcome = {'does not hold': 'loses', 'holds': 'wins', 'inconclusive': 'no measurable difference'}
  verdicts = [f"{g} vs add: ΔPPL {fmt(c['delta_mean'], c['delta_std'])}: "
              f"**{outcome[c['verdict']] if c['n'] > 1 else outcome_words(c, 'PPL')}**"
              for g, c in comparisons]
  # A variant whose K-step forward is not at its fixed point reads differently in the two modes.
  for g, rs in repro_lib.by_group(records).items():
    seq = np.mean([repro_lib.final_ppl(r) for r in rs])
    par = np.mean([r['final']['val_ppl'] for r in rs])
    if abs(par / seq - 1) > 0.01:
      lines += ['', f'{g}: the parallel K-step forward ({par:.2f}) and the exact scan ({seq:.2f}) '
                'differ by more than 1%: at the trained K this variant is not at its fixed point.']
  return lines, verdicts


def width_report(records, scale, figure):
  del figure
  groups = repro_lib.by_group(records)
  lines = [f'Tokens per run: {scale.tokens_per_param} x the N = 2 transformer\'s parameters '
           '(the paper used Chinchilla\'s 20; CPU budget).', '',
           '| pair | N = 2 PPL | D = 2 PPL (sequential) | relative improvement | verdict |',
           '|---|---|---|---|---|']
  verdicts = []
  pairs = [(f'width D=2 C={w}', f'width N=2 C={w}', f'C = {w}') for w in scale.widths]
  pairs += [(f'context T={t} D=2 C={scale.base_width}', f'context T={t} N=2 C={scale.base_width}',
             f'T = {t}') for t in scale.context_lengths]
  for crt, base, name in pairs:
    if crt not in groups or base not in groups:
      lines.append(f'| {name} | not run yet | | | |')
      continue
    b = mean_std(repro_lib.final_ppl(r) for r in groups[base])
    a = mean_std(repro_lib.final_ppl(r) for r in groups[crt])
    c = compare(groups[crt], groups[base], repro_lib.final_ppl)
    words = outcome_words(c, 'D = 2 PPL')
    lines.append(f'| {name} | {fmt(*b)} | {fmt(*a)} | {100 * (b[0] - a[0]) / b[0]:.1f}% | '
                 f'{words} |')
    verdicts.append(f'{name}: {100 * (b[0] - a[0]) / b[0]:.1f}% ({words})')
  return lines, verdicts


# ------------------------------------------------------------------------------------------------
# grad_iterations (beyond the paper): backpropagate through the last m of K = 5 iterations.
# ------------------------------------------------------------------------------------------------

GRAD_ITERATIONS = (1, 2, 5)


def grad_iterations_runs(scale, seeds):
  """m = K (full backpropagation) is trained here too, although it is the same computation as
  the k_min study's fixed K = 5 run: the study compares throughput, so all three must run under
  the same conditions."""
  size = size_name('context_ready', 2, scale.base_width, scale.heads)
  return [Run('grad_iterations', f'K=5 m={m}', seed,
              recipe_arg(scale, size=size, k=5, k_min=0, grad_iterations=m))
          for m in GRAD_ITERATIONS for seed in range(seeds)]


def grad_iterations_report(records, scale, figure):
  del scale, figure
  groups = repro_lib.by_group(records)
  full = groups.get('K=5 m=5', [])
  lines = ['| backpropagated iterations | val PPL (sequential) | training tokens/s | '
           'tokens/s vs m = K | ΔPPL vs m = K |', '|---|---|---|---|---|']
  verdicts = []
  full_speed = np.mean([r['tokens_per_second'] for r in full]) if full else math.nan
  for m in GRAD_ITERATIONS:
    rs = groups.get(f'K=5 m={m}', [])
    if not rs:
      lines.append(f'| m = {m} | not run yet | | | |')
      continue
    speed = np.mean([r['tokens_per_second'] for r in rs])
    row = (f"| m = {m} | {fmt(*mean_std(repro_lib.final_ppl(r) for r in rs))} | {speed:,.0f} | "
           f'{speed / full_speed:.2f}x |')
    if m != 5 and full:
      c = compare(rs, full, repro_lib.final_ppl)
      row += f" {fmt(c['delta_mean'], c['delta_std'])} ({outcome_words(c)}) |"
      judged = {'does not hold': 'measurably worse', 'holds': 'measurably better',
                'inconclusive': 'no measurable loss'}[c['verdict']] if c['n'] > 1 else (
                    outcome_words(c, 'PPL'))
      verdicts.append(f"m = {m}: {speed / full_speed:.2f}x the throughput of full "
                      f"backpropagation, ΔPPL {fmt(c['delta_mean'], c['delta_std'])} ({judged})")
    else:
      row += ' |'
    lines.append(row)
  return lines, verdicts
