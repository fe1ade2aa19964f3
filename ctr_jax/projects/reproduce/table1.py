"""The table1 study (reference section 6.2): context-ready D = 1, 2, 3 against transformers of
1, 2, 3, 4 and 6 layers at equal inference FLOPs per token, at each cost level of the scale; at
the scale's `compute_matched` levels also against baselines matched in training compute; its
runs, its report and its figures."""

import dataclasses
import os

import numpy as np

from ctr_jax.models import flop_match
from ctr_jax.projects import paths
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce.lib import Run, ci_text, compare, fmt, mean_std
from ctr_jax.projects.reproduce.studies import (
  Scale,
  group_label,
  level_heads,
  outcome_words,
  recipe_arg,
  size_name,
)
from ctr_jax.projects.reproduce.table1_figures import (
  crossover_step,
  plot_curves,
  plot_gaps,
  plot_longer,
)

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
TABLE1_LONGER = 3  # the longer-training rows train this many times the scale's steps


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
                 'group': f"{m['level']} {group_label(m['kind'], m['depth'], m['width'])}"})
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
           f'{level} {group_label("transformer", n, width)} train-matched',
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
    if level in scale.longer:
      # Does the gap close, hold or grow? The D = 1 CRT and the N = TABLE1_BASELINE_DEPTH
      # transformer (the best inference-matched one at ~1M) for TABLE1_LONGER x the steps.
      steps = TABLE1_LONGER * scale.steps
      for m in (crt, base):
        arg = recipe_arg(scale, size=size_name(m['kind'], m['depth'], m['width'], heads),
                         steps=steps)
        rows.append({**{k: m[k] for k in ('level', 'kind', 'depth', 'width', 'heads',
                                          'flops_per_token', 'target_flops_per_token', 'ratio',
                                          'matched')},
                     'matching': 'longer training', 'group': f"{m['group']} {steps} steps",
                     'shorter': m['group'], 'arg': arg, **training_compute(arg)})
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
    info = {k: v for k, v in m.items() if k not in ('arg', 'group', 'steps', 'shorter')}
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
  if m['matching'] == 'longer training':
    return f"{'CRT' if m['kind'] == 'context_ready' else 'transformer'}, {TABLE1_LONGER}x the steps"
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
      planned = sum(1 for m in models if m['matching'] == 'inference'
                    and m['kind'] == 'transformer')
      best = ('the best transformer' if len(transformers) == planned else
              _so_far(len(transformers), planned) + ',')
      for g in sorted(crts):
        c = compare(groups[g], groups[best_t], repro_lib.final_ppl)
        delta = ci_text(c)
        step = crossover_step(groups[g], groups[best_t])
        first = min(e['step'] for r in groups[g] for e in r['evals'])
        cross = ('never below it' if step is None else
                 f'below it from the first evaluation (step {first}) on' if step == first else
                 f'crossover at step {step}')
        verdicts.append(f"{g} vs {best} {best_t}: ΔPPL {delta}: "
                        f"**{c['verdict']}**; validation curve {cross}")
    crt1 = next(m['group'] for m in models if m['kind'] == 'context_ready' and m['depth'] == 1
                and m['matching'] == 'inference')
    for m in models:
      if (m['matching'] in ('inference', 'longer training') or m['group'] not in groups
          or crt1 not in groups):
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
    longer = [m['group'] for m in models if m['matching'] == 'longer training']
    if len(longer) == 2 and all(g in groups for g in longer):
      c = compare(groups[longer[0]], groups[longer[1]], repro_lib.final_ppl)
      verdicts.append(f'{longer[0]} vs {longer[1]} ({TABLE1_LONGER}x the steps): ΔPPL '
                      f"{ci_text(c)}: **{c['verdict']}**")
  gaps = gap_summary(records, scale)
  lines[:0] = ['**In three sentences.** ' + ' '.join(three_sentences(gaps)), '']
  if figure:
    inference = {m['group'] for m in rows if m['matching'] == 'inference'}
    plot_curves(records, scale, inference, figure)
    lines.append(f'![table1 curves](reproduction/{os.path.basename(figure)})')
    gap_figure = figure.replace('.png', '_gap.png')
    plot_gaps(gaps, scale, gap_figure)
    lines += ['', f'![table1 gap](reproduction/{os.path.basename(gap_figure)})']
    longer = [m for m in rows if m['matching'] == 'longer training']
    if any(m['group'] in groups for m in longer):
      # Item 4's figure: the pair at the scale's steps and at TABLE1_LONGER x, on one axis.
      pairs = [tuple(m['shorter'] for m in longer), tuple(m['group'] for m in longer)]
      longer_figure = figure.replace('.png', '_longer.png')
      plot_longer(records, pairs, longer_figure)
      lines += ['', f'![table1 longer training](reproduction/{os.path.basename(longer_figure)})']
  return lines, verdicts


def gap_summary(records, scale) -> dict:
  """The D = 1 CRT's PPL gap (CRT minus baseline, paired by seed, with its 95% interval) at
  each level, against the best inference-matched transformer ('inference'), the transformer
  matched in training FLOPs per token ('training FLOPs/token') and in total training FLOPs
  ('total training FLOPs'), and after TABLE1_LONGER x the steps ('longer training')."""
  groups = repro_lib.by_group(records)
  rows = table1_rows(scale)
  out = {}
  for level in (lv.name for lv in scale.levels):
    mine = [m for m in rows if m['level'] == level]
    crt = next(m for m in mine if m['kind'] == 'context_ready' and m['depth'] == 1
               and m['matching'] == 'inference')
    if crt['group'] not in groups:
      continue
    ts = [m['group'] for m in mine if m['kind'] == 'transformer'
          and m['matching'] == 'inference' and m['group'] in groups]
    baselines = {}
    if ts:
      baselines['inference'] = min(ts, key=lambda g: np.mean([repro_lib.final_ppl(r)
                                                             for r in groups[g]]))
    planned = sum(1 for m in mine if m['kind'] == 'transformer' and m['matching'] == 'inference')
    for m in mine:
      if m['kind'] == 'transformer' and m['matching'] in ('training FLOPs/token',
                                                          'total training FLOPs'):
        baselines[m['matching']] = m['group']
    found = {}
    for matching, baseline in baselines.items():
      if baseline in groups:
        found[matching] = {'baseline': baseline, 'crt': crt['group'],
                           **compare(groups[crt['group']], groups[baseline], repro_lib.final_ppl)}
    if 'inference' in found and len(ts) < planned:
      found['inference']['run_so_far'] = (len(ts), planned)
    longer = [m for m in mine if m['matching'] == 'longer training']
    if len(longer) == 2 and all(m['group'] in groups for m in longer):
      crt_long, base_long = (groups[m['group']] for m in longer)
      found['longer training'] = {'baseline': longer[1]['group'], 'crt': longer[0]['group'],
                                  **compare(crt_long, base_long, repro_lib.final_ppl)}
      if all(m['shorter'] in groups for m in longer):
        # The same pair's gap after TABLE1_LONGER x the steps against after the scale's
        # steps, paired by seed: a difference of paired differences.
        crt_short, base_short = (groups[m['shorter']] for m in longer)
        found['longer training']['change'] = compare(
            _paired_gaps(crt_long, base_long), _paired_gaps(crt_short, base_short),
            lambda r: r['gap'])
        found['longer training']['shorter'] = compare(crt_short, base_short,
                                                      repro_lib.final_ppl)
    out[level] = {'flops_per_token': crt['target_flops_per_token'], **found}
  return out


def _paired_gaps(a: list[dict], b: list[dict]) -> list[dict]:
  """Per seed run by both: a's final PPL minus b's, as {'seed', 'gap'}."""
  vb = {r['seed']: repro_lib.final_ppl(r) for r in b}
  return [{'seed': r['seed'], 'gap': repro_lib.final_ppl(r) - vb[r['seed']]}
          for r in a if r['seed'] in vb]


def _longer_words(level: str, g: dict) -> str:
  """The pair's gap after more steps, and how it moved from the scale's steps (paired by seed)."""
  words = (f"{level}: {_gap_words(g)} ({g['delta_mean'] / g['reference']:+.1%} of the "
           f"baseline's)")
  if 'change' not in g:
    return words
  short, change = g['shorter'], g['change']
  if change['verdict'] == 'inconclusive':
    how = 'no measurable change'
  else:  # 'holds': the gap went down; toward zero when it was positive
    toward_zero = (change['verdict'] == 'holds') == (short['delta_mean'] > 0)
    how = 'it narrows' if toward_zero else 'it widens'
  return (f"{words}, against {short['delta_mean']:+.2f} ({short['delta_mean'] / short['reference']:+.1%}) "
          f"before: a change of {ci_text(change)}, {how}")


def _so_far(run: int, planned: int) -> str:
  """The baseline of a level whose inference-matched transformers have not all run yet."""
  return (f'the only one of the {planned} transformers run so far' if run == 1 else
          f'the best of the {run} of {planned} transformers run so far')


def _gap_words(c: dict) -> str:
  partial = f" ({_so_far(*c['run_so_far'])})" if 'run_so_far' in c else ''
  return (f"{c['crt']} vs {c['baseline']}{partial}: ΔPPL {ci_text(c)}, "
          f"{'lower' if c['verdict'] == 'holds' else 'higher' if c['verdict'] == 'does not hold' else 'inconclusive'}")


def three_sentences(gaps: dict) -> list[str]:
  """The verdict page's opening: at equal inference cost; at equal training compute; and how
  the gap moves with cost and with training length; each from the records, 'not run yet' where
  a comparison has no runs."""
  def at(matching):
    return [f'{level}: {_gap_words(g[matching])}' for level, g in gaps.items() if matching in g]

  inference = at('inference')
  training = at('training FLOPs/token') + at('total training FLOPs')
  first = ('At equal inference cost per token the D = 1 CRT is compared with the best '
           'transformer of its level (' + ('; '.join(inference) if inference else 'not run yet')
           + ').')
  second = ('At equal training compute it is compared with a wider transformer (training FLOPs '
            'per token matched) and with the transformer trained longer (total training FLOPs '
            'matched) (' + ('; '.join(training) if training else 'not run yet') + ').')
  # PPL differs between levels, so the gap also as a fraction of the baseline's PPL.
  moves = [f"{level} {g['inference']['delta_mean']:+.2f} PPL "
           f"({g['inference']['delta_mean'] / g['inference']['reference']:+.1%} of the baseline's"
           + (", {} of {} transformers run".format(*g['inference']['run_so_far'])
              if 'run_so_far' in g['inference'] else '') + ')'
           for level, g in gaps.items() if 'inference' in g]
  longer = [_longer_words(level, g['longer training']) for level, g in gaps.items()
            if 'longer training' in g]
  third = ('Across cost levels the inference-matched gap is ' + (
      ', '.join(moves) if len(moves) > 1 else f'measured at one level only: {moves[0]}'
      if moves else 'not measured yet') + f'; after {TABLE1_LONGER}x the steps it is '
      + ('; '.join(longer) if longer else 'not run yet') + '.')
  return [first, second, third]
