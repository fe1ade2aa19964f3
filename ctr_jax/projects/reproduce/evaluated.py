"""The studies of ctr_jax.projects.reproduce that evaluate trained models after training:
seq_vs_parallel (reference 6.5, C.4), k_eval (6.5) and conversion (5, 6.8). Each adds an
`evaluate` step whose result is cached in the run's workdir; the rest is as in repro_studies.
"""

import os

import matplotlib
import matplotlib.pyplot as plt

from ctr_jax import models
from ctr_jax.models import convert
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce import trained as repro_trained
from ctr_jax.projects.reproduce.lib import Run, ci_text, compare, fmt, mean_std
from ctr_jax.projects.reproduce.studies import (
  SCALES,
  Scale,
  k5_runs,
  outcome_words,
  recipe_arg,
  simple_table,
  size_name,
)
from ctr_jax.tasks import language_modelling

EVAL_BATCHES = {'cpu': 8, 'tiny': 1}
K_EVAL = (1, 2, 3, 5, 8, 10, 20)


def _scale_name(scale: Scale) -> str:
  return next(k for k, v in SCALES.items() if v is scale)


def seq_vs_parallel_runs(scale, seeds):
  size = size_name('context_ready', 1, scale.base_width, scale.heads)
  d1 = [Run('seq_vs_parallel', 'D=1 K=10', seed, recipe_arg(scale, size=size, k=10, k_min=0))
        for seed in range(seeds)]
  return d1 + k5_runs(scale, seeds)


def seq_vs_parallel_eval(record, run, root, scale):
  model, params, config = repro_trained.load_trained(run.workdir(root))
  batches = repro_trained.validation_batches(config, EVAL_BATCHES[_scale_name(scale)])
  k = model.spec.k_unroll
  out = {'trained_k': repro_trained.parallel_vs_sequential(model, params, batches, k)}
  # K >= T + 1 is exact by causality: the same comparison must then agree to rounding.
  out['k_t_plus_1'] = repro_trained.parallel_vs_sequential(model, params, batches,
                                                       config['data']['seq_len'] + 1)
  del record
  return out


def seq_vs_parallel_report(records, scale, figure):
  del scale, figure
  lines = ['| model | seed | PPL parallel (trained K) | PPL sequential | abs ΔPPL | max abs Δlogit '
           '| argmax agreement | max abs Δlogit at K = T+1 |', '|---|---|---|---|---|---|---|---|']
  worst = 0.0
  for r in records:
    a, b = r['post']['trained_k'], r['post']['k_t_plus_1']
    worst = max(worst, a['abs_delta_ppl'])
    lines.append(f"| {r['group']} | {r['seed']} | {a['ppl_parallel']:.3f} | "
                 f"{a['ppl_sequential']:.3f} | {a['abs_delta_ppl']:.4f} | "
                 f"{a['max_abs_logit_diff']:.2e} | {100 * a['argmax_agreement']:.2f}% | "
                 f"{b['max_abs_logit_diff']:.2e} |")
  verdicts = []
  d1 = [r for r in records if r['group'] == 'D=1 K=10']
  if d1:
    gap = max(r['post']['trained_k']['abs_delta_ppl'] for r in d1)
    verdicts.append(f"claim 4 (sequential within 0.01 PPL of parallel K = 10): largest abs ΔPPL "
                    f"{gap:.4f} over {len(d1)} seed(s): **{'holds' if gap <= 0.01 else 'does not hold'}**")
  if records:
    exact = max(r['post']['k_t_plus_1']['max_abs_logit_diff'] for r in records)
    verdicts.append(f'K = T + 1 reproduces the scan on trained weights: max abs Δlogit {exact:.1e}')
  return lines, verdicts


def k_eval_runs(scale, seeds):
  return k5_runs(scale, seeds)


def k_eval_eval(record, run, root, scale):
  model, params, config = repro_trained.load_trained(run.workdir(root))
  batches = repro_trained.validation_batches(config, EVAL_BATCHES[_scale_name(scale)])
  out = {f'K={k}': language_modelling.evaluate_lm(model, params, batches, k_unroll=k)['ppl']
         for k in K_EVAL}
  out['sequential'] = language_modelling.evaluate_lm(model, params, batches, sequential=True)['ppl']
  del record
  return out


def k_eval_report(records, scale, figure):
  del scale
  keys = [f'K={k}' for k in K_EVAL] + ['sequential']
  lines = ['| evaluated at | ' + ' | '.join(keys) + ' |', '|---|' + '---|' * len(keys),
           f"| PPL ({'mean ± std over' if len(records) > 1 else 'one run,'} {len(records)} "
           f"seed{'s' if len(records) > 1 else ''}) | " + ' | '.join(
               fmt(*mean_std(r['post'][k] for r in records)) for k in keys) + ' |']
  verdicts = []
  if len(records) > 1:
    # Claim 18: more iterations at evaluation do no harm (K = 10 matches K = 5 within the
    # margin, or is lower) and too few do (K = 1 is higher); 95% intervals over seeds.
    runs = {k: [{'seed': r['seed'], 'ppl': r['post'][k]} for r in records]
            for k in ('K=1', 'K=5', 'K=10')}
    d10 = compare(runs['K=10'], runs['K=5'], lambda r: r['ppl'])
    d1 = compare(runs['K=1'], runs['K=5'], lambda r: r['ppl'])
    harmless = d10['equivalence'] == 'matches' or d10['verdict'] == 'holds'
    harmful = d10['equivalence'] == 'differs' and d10['verdict'] == 'does not hold'
    worse = d1['verdict'] == 'does not hold'
    verdict = ('holds' if harmless and worse else
               'does not hold' if harmful or d1['verdict'] == 'holds' else 'inconclusive')
    verdicts.append(f'claim 18: K = 10 vs K = 5 ΔPPL {ci_text(d10)} (within '
                    f'±{100 * repro_lib.EQUIVALENCE_MARGIN:g}%: {d10["equivalence"]}), '
                    f'K = 1 vs K = 5 ΔPPL {ci_text(d1)} ({"higher" if worse else "not measurably higher"}): '
                    f'**{verdict}**')
  if figure and records:
    matplotlib.use('Agg')
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in records:
      ax.plot(K_EVAL, [r['post'][f'K={k}'] for k in K_EVAL], 'o-', label=f"seed {r['seed']}")
      ax.axhline(r['post']['sequential'], ls=':', color='gray')
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('K at evaluation (trained with K ~ U{2..5})')
    ax.set_ylabel('validation PPL (dotted: exact scan)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(figure, dpi=100)
    plt.close(fig)
    lines += ['', f'![k_eval](reproduction/{os.path.basename(figure)})']
  return lines, verdicts


def _half(scale):
  return max(1, scale.steps // 2)


def _conversion_source(scale, seed):
  size = size_name('transformer', 2, scale.base_width, scale.heads)
  return Run('conversion', f'transformer {_half(scale)} steps', seed,
             recipe_arg(scale, size=size).replace(f'steps={scale.steps}', f'steps={_half(scale)}'))


def conversion_runs(scale, seeds):
  runs = []
  rest = scale.steps - _half(scale)
  for seed in range(seeds):
    source = _conversion_source(scale, seed)
    crt = size_name('context_ready', 2, scale.base_width, scale.heads)
    t2 = size_name('transformer', 2, scale.base_width, scale.heads)
    shorter = lambda arg: arg.replace(f'steps={scale.steps}', f'steps={rest}')
    runs += [source,
             Run('conversion', f'converted + {rest} steps', seed, shorter(recipe_arg(scale, size=crt)),
                 init_from=source),
             Run('conversion', f'transformer continued {rest} steps', seed,
                 shorter(recipe_arg(scale, size=t2)), init_from=source)]
  return runs + k5_runs(scale, seeds)


def conversion_eval(record, run, root, scale):
  """Step 0 of the conversion: the converted model's PPL against its source transformer's."""
  if not run.group.startswith('transformer ') or 'continued' in run.group:
    return {}
  model, params, config = repro_trained.load_trained(run.workdir(root))
  batches = repro_trained.validation_batches(config, EVAL_BATCHES[_scale_name(scale)])
  fields = {**repro_lib.model_fields(config['model']), 'kind': 'context_ready'}
  crt_cfg = models.model_config(**fields)
  crt = models.build(crt_cfg)
  converted = convert.transformer_to_context_ready({'params': params}, crt_cfg)['params']
  out = {'source_ppl': language_modelling.evaluate_lm(model, params, batches)['ppl']}
  out['converted_ppl_parallel'] = language_modelling.evaluate_lm(crt, converted, batches)['ppl']
  out['converted_ppl_sequential'] = language_modelling.evaluate_lm(crt, converted, batches,
                                                                    sequential=True)['ppl']
  del record
  return out


def conversion_report(records, scale, figure):
  del figure
  groups = repro_lib.by_group(records)
  rest = scale.steps - _half(scale)
  lines, _ = simple_table(records, None, 'run')
  verdicts = []
  sources = groups.get(f'transformer {_half(scale)} steps', [])
  if sources:
    step0 = ['', '| seed | transformer PPL | converted PPL, step 0 (parallel K) | converted, step 0 '
             '(sequential) | max relative difference |', '|---|---|---|---|---|']
    worst = 0.0
    for r in sources:
      p = r['post']
      diff = max(abs(p['converted_ppl_parallel'] / p['source_ppl'] - 1),
                 abs(p['converted_ppl_sequential'] / p['source_ppl'] - 1))
      worst = max(worst, diff)
      step0.append(f"| {r['seed']} | {p['source_ppl']:.4f} | {p['converted_ppl_parallel']:.4f} | "
                   f"{p['converted_ppl_sequential']:.4f} | {diff:.1e} |")
    lines += step0
    verdicts.append(f'claim 15 (step-0 PPL of the converted model equals the transformer\'s): '
                    f"largest relative difference {worst:.1e}: **{'holds' if worst < 1e-5 else 'does not hold'}**")
  converted = groups.get(f'converted + {rest} steps', [])
  for other in ('K=5 k_min=2', f'transformer continued {rest} steps'):
    if converted and other in groups:
      c = compare(converted, groups[other], repro_lib.final_ppl)
      verdicts.append(f"converted vs {other}: ΔPPL {ci_text(c)} ({outcome_words(c, 'converted')}; "
                      f"within ±{100 * repro_lib.EQUIVALENCE_MARGIN:g}%: {c['equivalence']})")
  return lines, verdicts
