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
from ctr_jax.projects import paths
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce.lib import Run, ci_text, compare, fmt, mean_std


@dataclasses.dataclass(frozen=True)
class Level:
  """A table1 cost level: its name, its inference FLOPs per token, and its attention heads (0:
  the scale's). Widths step by 2 x heads, so a small level may need fewer heads for every model
  to land within 3% of the target."""
  name: str
  flops_per_token: int
  heads: int = 0


@dataclasses.dataclass(frozen=True)
class Scale:
  """Sizes and budgets of one scale; every run of a study shares them."""
  vocab: int
  steps: int
  batch: int
  seq_len: int
  heads: int
  levels: tuple          # table1's Levels; every table1 model is within 3% of its level
  base_width: int        # the single-size studies (k_min, ablations, ...)
  widths: tuple          # the width study
  tokens_per_param: float
  context_lengths: tuple  # the context-length pair of the width study
  compute_matched: tuple = ()  # table1 levels that also get the training-compute-matched rows


SCALES = {
    'cpu': Scale(vocab=2048, steps=1200, batch=16, seq_len=128, heads=4,
                 # ~0.25M: the target and 2 heads that put all eight models within 2.9%
                 # (4 heads, a width step of 8, leave some 5% off where V C dominates).
                 levels=(Level('~0.25M', 231_500, heads=2), Level('~1M', 965_000),
                         Level('~4M', 4_114_432)),
                 base_width=144, widths=(64, 128, 256), tokens_per_param=2.0,
                 context_lengths=(64, 256), compute_matched=('~0.25M', '~1M', '~4M')),
    # Seconds per run: what the tests use (the data_dir of the test fixtures has V = 320).
    'tiny': Scale(vocab=320, steps=4, batch=2, seq_len=16, heads=2, levels=(Level('tiny', 43_008),),
                  base_width=32, widths=(16, 32), tokens_per_param=0.002,
                  context_lengths=(8, 16), compute_matched=('tiny',)),
}


def recipe_arg(scale: Scale, **fields) -> str:
  """A configs/repro.py arg: the scale's shared recipe plus `fields`."""
  values = dict(steps=scale.steps, batch=scale.batch, seq_len=scale.seq_len, vocab=scale.vocab)
  values.update(fields)
  return ','.join(f'{k}={v}' for k, v in values.items())


def level_heads(scale: Scale, level: str) -> int:
  """The attention heads of a table1 level's models."""
  return next(lv.heads for lv in scale.levels if lv.name == level) or scale.heads


def size_name(kind: str, depth: int, width: int, heads: int) -> str:
  return f"{'d' if kind == 'context_ready' else 't'}{depth}_c{width}_h{heads}"


def _label(kind: str, depth: int, width: int) -> str:
  return f"{'D' if kind == 'context_ready' else 'N'}={depth} C={width}"


# ------------------------------------------------------------------------------------------------
# table1: context-ready D = 1, 2, 3 against FLOP-matched transformers of 1, 2, 3, 4 and 6 layers;
# at the scale's `compute_matched` levels also against transformers matched in training compute.
# ------------------------------------------------------------------------------------------------

TABLE1_CRT_DEPTHS = (1, 2, 3)
TABLE1_TRANSFORMER_DEPTHS = (1, 2, 3, 4, 6)
# The depth of the training-compute-matched transformers: that of the best inference-matched one
# at ~1M in the runs before them (N = 2 C = 160, 3 seeds; N = 1 was added with them).
TABLE1_BASELINE_DEPTH = 2
TABLE1_GRAD_ITERATIONS = 2  # the compute-efficient CRT: backpropagate through the last m of K


def table1_models(scale: Scale) -> list[dict]:
  """Every inference-matched model of the table1 study with its cost, the level target and
  their ratio."""
  out = []
  for level, target, _ in map(dataclasses.astuple, scale.levels):
    heads = level_heads(scale, level)
    for kind, depths in (('context_ready', TABLE1_CRT_DEPTHS),
                         ('transformer', TABLE1_TRANSFORMER_DEPTHS)):
      for depth in depths:
        c = flop_match.nearest_width(kind, depth, target, scale.vocab, heads)
        flops = flop_match.cost(kind, depth, c, scale.vocab)
        out.append({'level': level, 'kind': kind, 'depth': depth, 'width': c,
                    'flops_per_token': flops, 'target_flops_per_token': target,
                    'ratio': flops / target, 'matched': abs(flops / target - 1) <= 0.03,
                    'heads': heads})
  return out


def run_config(arg: str, seed: int = 0):
  """configs/repro.py's config for a recipe arg: what the run trains (K, k_min, m, steps...)."""
  return paths.load_config_module('configs/repro.py').get_config(f'{arg},seed={seed}')


def training_compute(arg: str) -> dict:
  """Training FLOPs per token of the run `arg` trains (`flop_match.training_flops_per_token`,
  at its K, k_min, grad_iterations and T) and in total (x steps x batch x T), with its K."""
  c = run_config(arg)
  crt = c.model.kind == 'context_ready'
  per_token = flop_match.training_flops_per_token(
      c.model, c.data.seq_len, k_min=c.train.k_min if crt else 0,
      grad_iterations=c.train.grad_iterations if crt else 0)
  tokens = c.total_steps * c.batch_size * c.data.seq_len
  return {'training_flops_per_token': per_token, 'training_flops': per_token * tokens,
          'steps': c.total_steps, 'k_unroll': c.model.k_unroll if crt else 0,
          'k_min': c.train.k_min if crt else 0,
          'grad_iterations': c.train.grad_iterations if crt else 0}


def table1_rows(scale: Scale) -> list[dict]:
  """Every table1 row: the inference-matched models (`matching` 'inference') and, at the
  scale's `compute_matched` levels, against the level's D = 1 CRT:
    'training FLOPs/token': an N = TABLE1_BASELINE_DEPTH transformer widened so its training
      FLOPs per token are nearest the CRT's (same tokens);
    'total training FLOPs': the inference-matched N = TABLE1_BASELINE_DEPTH transformer trained
      for the CRT's total training FLOPs (steps x the ratio of training FLOPs per token; the
      recipe scales warmup, schedule, evaluations and checkpoints with the steps);
    'truncated gradients': the CRT itself backpropagating through the last
      TABLE1_GRAD_ITERATIONS iterations only (K and k_min as the other CRTs).
  Each row has its group, configs/repro.py arg, inference cost and its ratio to the level,
  training FLOPs per token and in total, and both as ratios to the level's D = 1 CRT."""
  rows = []
  for m in table1_models(scale):
    size = size_name(m['kind'], m['depth'], m['width'], m['heads'])
    rows.append({**m, 'matching': 'inference', 'arg': recipe_arg(scale, size=size),
                 'group': f"{m['level']} {_label(m['kind'], m['depth'], m['width'])}"})
  for level in (lv.name for lv in scale.levels):
    heads = level_heads(scale, level)
    mine = [r for r in rows if r['level'] == level]
    crt = next(r for r in mine if r['kind'] == 'context_ready' and r['depth'] == 1)
    base = next(r for r in mine if r['kind'] == 'transformer'
                and r['depth'] == TABLE1_BASELINE_DEPTH)
    for r in mine:
      r.update(training_compute(r['arg']))
    if level in scale.compute_matched:
      target = crt['training_flops_per_token']
      n = TABLE1_BASELINE_DEPTH
      width = flop_match.nearest_training_width(n, target, scale.vocab, scale.seq_len, heads)
      steps = round(scale.steps * target / base['training_flops_per_token'])
      crt_size = size_name('context_ready', 1, crt['width'], heads)
      for matching, depth, c, kind, group, arg in (
          ('training FLOPs/token', n, width, 'transformer',
           f'{level} {_label("transformer", n, width)} train-matched',
           recipe_arg(scale, size=size_name('transformer', n, width, heads))),
          ('total training FLOPs', n, base['width'], 'transformer',
           f"{base['group']} {steps} steps",
           recipe_arg(scale, size=size_name('transformer', n, base['width'], heads),
                      steps=steps)),
          ('truncated gradients', 1, crt['width'], 'context_ready',
           f"{crt['group']} m={TABLE1_GRAD_ITERATIONS}",
           recipe_arg(scale, size=crt_size, grad_iterations=TABLE1_GRAD_ITERATIONS))):
        flops = flop_match.cost(kind, depth, c, scale.vocab)
        row = {'level': level, 'kind': kind, 'depth': depth, 'width': c, 'heads': heads,
               'matching': matching, 'group': group, 'arg': arg, 'flops_per_token': flops,
               'target_flops_per_token': crt['target_flops_per_token'],
               'ratio': flops / crt['target_flops_per_token'], **training_compute(arg)}
        if matching == 'training FLOPs/token':
          row['matched'] = abs(row['training_flops_per_token'] / target - 1) <= 0.03
        elif matching == 'total training FLOPs':
          row['matched'] = abs(row['training_flops'] / crt['training_flops'] - 1) <= 0.03
        else:
          row['matched'] = crt['matched']
        rows.append(row)
    for r in rows:
      if r['level'] == level:
        r['training_flop_ratio'] = r['training_flops_per_token'] / crt['training_flops_per_token']
        r['training_flops_total_ratio'] = r['training_flops'] / crt['training_flops']
  return rows


def table1_runs(scale, seeds):
  runs = []
  for m in table1_rows(scale):
    if not m['matched']:
      continue  # reported as unmatched in the table; never trained
    # The run's info: the inference-matched rows' fields as before, plus the training compute.
    info = {k: v for k, v in m.items() if k not in ('arg', 'group', 'steps')}
    for seed in range(seeds):
      runs.append(Run('table1', m['group'], seed, m['arg'], info=tuple(sorted(info.items()))))
  return runs


def _flops(x: float) -> str:
  return f'{x:.2e}'.replace('e+', 'e')


def _kind_text(m: dict, records: list[dict]) -> str:
  if m['matching'] == 'inference':
    return 'CRT' if m['kind'] == 'context_ready' else 'transformer'
  if m['matching'] == 'training FLOPs/token':
    return 'transformer, training FLOPs/token matched'
  if m['matching'] == 'total training FLOPs':
    epochs = [r['steps'] * r['config']['batch_size'] / r['train_windows'] for r in records
              if r.get('train_windows')]
    return (f"transformer, total training FLOPs matched ({m['steps']:,} steps"
            + (f', {np.mean(epochs):.1f} epochs' if epochs else '') + ')')
  return f"CRT, m = {m['grad_iterations']} of K"


def table1_report(records, scale, figure):
  rows = table1_rows(scale)
  ref = next(m for m in rows if m['kind'] == 'context_ready' and m['depth'] == 1
             and m['matching'] == 'inference')
  draws = (f"K ~ U{{{ref['k_min']}..{ref['k_unroll']}}}" if ref['k_min']
           else f"fixed K = {ref['k_unroll']}")
  lines = ['FLOPs/token is the paper\'s per-token inference cost (D·12C² + 8C² + VC against '
           'N·12C² + VC, at this V); the inference-matched models see the same tokens. Training '
           f'compute is not matched among them: the CRTs train with {draws} (configs/repro.py '
           'defaults), so each training token passes their unit and correction that many times. '
           'Training FLOPs/token are counted as docs/benchmarks.md counts model FLOPs '
           '(`flop_match.training_flops_per_token`: 3 x forward, forward = 2 x the matmul weights '
           '+ 4TC per layer for attention, the CRT\'s unit and correction once per iteration, '
           'the mean over the K drawn; with m < K backpropagated iterations, K forward and 2m '
           'backward passes); "x D=1" is the ratio to the level\'s D = 1 CRT, the total is per '
           'token x tokens trained. Rows after the inference-matched ones (where run) match the '
           'D = 1 CRT\'s training compute instead: a wider transformer (training FLOPs/token), '
           'the inference-matched transformer trained for more steps (total training FLOPs), '
           'and the CRT with truncated gradients.', '']
  windows = [r for r in records if r.get('train_windows')]
  if windows:
    r = windows[0]
    lines[-1:] = [f"One epoch of the training split is {r['train_windows']:,} sequences of T + 1 "
                  f"tokens: {r['steps']:,} steps of batch {r['config']['batch_size']} are "
                  f"{r['steps'] * r['config']['batch_size'] / r['train_windows']:.2f} epochs "
                  f"({r['group']}'s record).", '']
  verdicts = []
  groups = repro_lib.by_group(records)
  for level in (lv.name for lv in scale.levels):
    models = [m for m in rows if m['level'] == level]
    lines += [f'### Cost level {level} FLOPs/token', '',
              '| model | kind | FLOPs/token | ratio to level | training FLOPs/token (x D=1) | '
              'training FLOPs, total (x D=1) | params | val PPL (sequential for CRTs) | val PPL '
              'parallel K | seeds | wall time / run |',
              '|---|---|---|---|---|---|---|---|---|---|---|']
    for m in models:
      group = m['group']
      rs = groups.get(group, [])
      kind = _kind_text(m, rs)
      train = (f"{m['training_flops_per_token']:,.0f} ({m['training_flop_ratio']:.2f}x) | "
               f"{_flops(m['training_flops'])} ({m['training_flops_total_ratio']:.2f}x)")
      if not m['matched']:
        lines.append(f"| {group} | {kind} | {m['flops_per_token']:,} | {m['ratio']:.3f} | "
                     f'{train} | - | not matched within 3%: not trained | | | |')
        continue
      if not rs:
        lines.append(f"| {group} | {kind} | {m['flops_per_token']:,} | {m['ratio']:.3f} | "
                     f'{train} | | not run yet | | 0 | |')
        continue
      ppl = fmt(*mean_std(repro_lib.final_ppl(r) for r in rs))
      par = fmt(*mean_std(r['final']['val_ppl'] for r in rs))
      wall = np.mean([r['wall_time_seconds'] or 0 for r in rs]) / 60
      lines.append(f"| {group} | {kind} | {m['flops_per_token']:,} | {m['ratio']:.3f} | {train} | "
                   f"{rs[0]['num_params']:,} | {ppl} | {par} | {len(rs)} | {wall:.1f} min |")
    lines.append('')
    inference = {m['group'] for m in models if m['matching'] == 'inference'}
    crts = [g for g in groups if g in inference and g.startswith(f'{level} D=')]
    transformers = [g for g in groups if g in inference and g.startswith(f'{level} N=')]
    if crts and transformers:
      best_t = min(transformers, key=lambda g: np.mean([repro_lib.final_ppl(r)
                                                        for r in groups[g]]))
      for g in sorted(crts):
        c = compare(groups[g], groups[best_t], repro_lib.final_ppl)
        delta = ci_text(c)
        step = crossover_step(groups[g], groups[best_t])
        first = min(e['step'] for r in groups[g] for e in r['evals'])
        cross = ('never below it' if step is None else
                 f'below it from the first evaluation (step {first}) on' if step == first else
                 f'crossover at step {step}')
        verdicts.append(f"{g} vs the best transformer {best_t}: ΔPPL {delta} over {c['n']} "
                        f"seed(s): **{c['verdict']}**; validation curve {cross}")
    crt1 = next(m['group'] for m in models if m['kind'] == 'context_ready' and m['depth'] == 1
                and m['matching'] == 'inference')
    for m in models:
      if m['matching'] == 'inference' or m['group'] not in groups or crt1 not in groups:
        continue
      if m['kind'] == 'context_ready':
        c = compare(groups[m['group']], groups[crt1], repro_lib.final_ppl)
        verdicts.append(f"{m['group']} ({m['training_flop_ratio']:.2f}x the training FLOPs) vs "
                        f"{crt1}: ΔPPL {ci_text(c)} ({outcome_words(c, 'truncated')}; within "
                        f"±{100 * repro_lib.EQUIVALENCE_MARGIN:g}%: **{c['equivalence']}**)")
        continue
      c = compare(groups[crt1], groups[m['group']], repro_lib.final_ppl)
      verdicts.append(f"{crt1} vs {m['group']} (matched in {m['matching']}): ΔPPL "
                      f"{ci_text(c)}: **{c['verdict']}**")
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
  inference = {m['group'] for m in table1_rows(scale) if m['matching'] == 'inference'}
  # Levels with no finished run get no panel (the table says "not run yet").
  levels = [lv.name for lv in scale.levels
            if any(g.startswith(f'{lv.name} ') for g in groups)] or [scale.levels[0].name]
  fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 4), squeeze=False)
  for ax, level in zip(axes[0], levels):
    mine = {g: rs for g, rs in groups.items() if g.startswith(f'{level} ')}
    for g, rs in sorted(mine.items()):
      steps = sorted({e['step'] for r in rs for e in r['evals']})
      ppl = [np.mean([math.exp(e['val_loss']) for r in rs for e in r['evals']
                      if e['step'] == s]) for s in steps]
      style = ('-' if ' D=' in g else '--') if g in inference else ':'
      ax.plot(steps, ppl, style, marker='o' if g in inference else 's', ms=3,
              label=g.split(' ', 1)[1])
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
    # A context-ready run without an exact scan (the cumulative ablation) has no sequential PPL.
    no_scan = any(r.get('config', {}).get('model', {}).get('kind') == 'context_ready'
                  and 'val_ppl_sequential' not in r['final'] for r in rs)
    ppl = '– (no exact scan)' if no_scan else fmt(*mean_std(repro_lib.final_ppl(r) for r in rs))
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


# How a row's value compares with the reference row, by `compare`'s 95% interval.
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
    # "The same quality" is an equivalence claim: it holds only when the 95% interval of the
    # paired difference lies within the margin stated in advance (repro_lib.EQUIVALENCE_MARGIN).
    margin = f'±{100 * repro_lib.EQUIVALENCE_MARGIN:g}% of fixed K = 5\'s PPL'
    verdict = {'matches': f'holds (the interval lies within {margin})',
               'differs': f'does not hold (the interval lies outside {margin})',
               'inconclusive': f'inconclusive (the interval crosses {margin})'}[same['equivalence']]
    if same['n'] < 2:
      verdict = 'inconclusive (one seed: no interval yet)'
    verdicts.append(f"k_min = 2 vs fixed K = 5: ΔPPL {ci_text(same)}; fixed K = 5 vs K = 2: "
                    f"{ci_text(floor)} ({outcome_words(floor)}): **{verdict}**")
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
