"""Reports of the generation experiment (`implicit_generation`): results json, tables, figures
and the generated sections of docs/implicit_updates.md.

Every number a section shows is read from the results json here, so rerunning the command in
it regenerates the section (between its BEGIN/END markers) and nothing in it is typed by hand.
"""

import json
import os
import sys

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from ctr_jax.reporting import doc_sections

# The paper's Gemma 3 1B (instruction-tuned) agreement, arXiv 2511.17864 v3 section 4 as
# recorded in shared/reference/implicit_context_updates.md section 8 (paper numbers, not ours).
PAPER = (('float32', 'direct', '100%'), ('bfloat16', 'direct', '87.5%'),
         ('bfloat16', 'stable', '100% (98% in an earlier rendering)'))


def label(setting: dict) -> str:
  return (f"{setting['dtype']} {setting['method']} {setting['mode']} "
          f"L{setting['first_layer']}+")


def table(results: dict) -> str:
  """Markdown table of every run's summary."""
  lines = ['| model | dtype | method | apply | first layer | agreement | max abs dlogit | '
           'mean abs dlogit | max TVD | mean TVD | max abs dm | min top-2 margin |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for name, family in results['families'].items():
    for run in family['runs']:
      s, m = run['setting'], run['summary']
      dm = f"{m['max_dm']:.3g}" if 'max_dm' in m else '-'
      lines.append(f"| {family.get('label', name)} | {s['dtype']} | {s['method']} | "
                   f"{s['mode']} | {s['first_layer']} | {100 * m['agreement']:.0f}% | "
                   f"{m['max_abs_logit']:.2e} | {m['mean_abs_logit']:.2e} | "
                   f"{m['max_tvd']:.2e} | {m['mean_tvd']:.2e} | {dm} | "
                   f"{m['min_margin']:.3f} |")
  return '\n'.join(lines) + '\n'


def _find(family, **want):
  for run in family['runs']:
    if all(run['setting'][k] == v for k, v in want.items()):
      return run
  return None


def dm_table(family: dict, dtype: str, mode: str) -> str:
  """Per layer, first patched layer 0: where direct's and stable's largest Δm sit."""
  direct = _find(family, dtype=dtype, method='direct', mode=mode, first_layer=0)
  stable = _find(family, dtype=dtype, method='stable', mode=mode, first_layer=0)
  if direct is None or not direct.get('dm_layers'):
    return ''
  head = ('| layer | direct max abs dm | channel | v_C - v there | f there | h there | RMS(h) | '
          'min abs f | most frequent channel (share) |')
  rule = '|---|---|---|---|---|---|---|---|---|'
  if stable is not None:
    head += ' stable max abs dm | channel | m there | mu | -mu/m | why |'
    rule += '---|---|---|---|---|---|'
  lines = [head, rule]
  for i, d in enumerate(direct['dm_layers']):
    line = (f"| {i} | {d['max_dm']:.3g} | {d['channel']} | {d['numerator']:.3g} | "
            f"{d['f']:.2e} | {d['h']:.2e} | {d['rms_h']:.3g} | {d['min_abs_f']:.1e} | "
            f"{d['top_channel']} ({100 * d['top_channel_share']:.0f}%) |")
    if stable is not None:
      s = stable['dm_layers'][i]
      ratio = -s['mu'] / s['scale'] if s['scale'] else float('inf')
      line += (f" {s['max_dm']:.3g} | {s['channel']} | {s['scale']:.3g} | {s['mu']:.3g} | "
               f"{ratio:.3g} | {stable_cause(s)} |")
    lines.append(line)
  return '\n'.join(lines) + '\n'


def stable_cause(d: dict) -> str:
  """Which case made the stable update's largest Δm (signed: numerator / f at its channel).

  '-mu/m': the exact-arithmetic value of the stable remainder, large where |m| is small;
  'm = 0': the zero-scale rule (y = ±1, Δm = g); '-m': g ≈ 0 there, so the target y ≈ 0, f is
  the rounding of that zero and Δm ≈ −m switches the channel off; 'rounding' otherwise.
  """
  dm = d['numerator'] / d['f'] if d['f'] else float('inf')
  if d['scale'] == 0:
    return 'm = 0'
  if abs(dm + d['mu'] / d['scale']) <= 0.01 * abs(dm):
    return '-mu/m'
  if abs(dm + d['scale']) <= 0.01 * abs(d['scale']):
    return '-m'
  return 'rounding'


def _figure_names(prefix: str) -> dict:
  return {k: f'{prefix}_{k}.png' for k in ('metrics', 'summary', 'dm')}


def figures(results: dict, out_dir: str, prefix: str):
  """Per-token metrics of prompt 1 (first family with a Gemma block if any, first patched
  layer 0), the summary of every setting, and max |Δm| per layer."""
  matplotlib.use('Agg')
  names = _figure_names(prefix)
  families = results['families']
  key = next((k for k, f in families.items() if f['block'] == 'gemma'), next(iter(families)))
  family = families[key]
  title = family.get('label', key)

  fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
  for run in (r for r in family['runs'] if r['setting']['first_layer'] == 0):
    steps = np.arange(1, len(run['per_step']['agree'][0]) + 1)
    text = label(run['setting'])
    axes[0].plot(steps, np.asarray(run['per_step']['agree'][0], float), 'o-', label=text,
                 alpha=0.7)
    axes[1].semilogy(steps, np.maximum(run['per_step']['max_abs_logit'][0], 1e-9), label=text)
    axes[2].semilogy(steps, np.maximum(run['per_step']['tvd'][0], 1e-12), label=text)
  for ax, name in zip(axes, ('argmax agreement', 'max |Δlogit|', 'total variation')):
    ax.set_title(name)
    ax.set_xlabel('generated token')
  axes[0].set_ylim(-0.1, 1.1)
  axes[2].legend(fontsize=7)
  fig.suptitle(f'{title}: prompt 1, patched without context vs with context')
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, names['metrics']), dpi=110)
  plt.close(fig)

  labels, agreement, worst, tvd = [], [], [], []
  for key_, fam in families.items():
    for run in fam['runs']:
      labels.append(f"{fam.get('label', key_)} {label(run['setting'])}")
      agreement.append(100 * run['summary']['agreement'])
      worst.append(run['summary']['max_abs_logit'])
      tvd.append(run['summary']['mean_tvd'])
  fig, axes = plt.subplots(3, 1, figsize=(max(8, 0.28 * len(labels)), 9 + 0.03 * len(labels)),
                           sharex=True)
  x = np.arange(len(labels))
  axes[0].bar(x, agreement, color='tab:blue')
  axes[0].set_ylabel('argmax agreement (%)')
  axes[0].set_ylim(min(agreement + [90]) - 2, 100.5)
  axes[1].bar(x, np.maximum(worst, 1e-9), color='tab:red', log=True)
  axes[1].set_ylabel('max |Δlogit|')
  axes[2].bar(x, np.maximum(tvd, 1e-12), color='tab:green', log=True)
  axes[2].set_ylabel('mean total variation')
  axes[2].set_xticks(x)
  axes[2].set_xticklabels(labels, rotation=90, fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, names['summary']), dpi=110)
  plt.close(fig)

  runs = [r for r in family['runs'] if r.get('dm_layers') and r['setting']['first_layer'] == 0]
  if runs:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for run in runs:
      ax.semilogy([d['max_dm'] for d in run['dm_layers']], 'o-', label=label(run['setting']),
                  alpha=0.8)
    ax.set_xlabel('layer')
    ax.set_ylabel('max |Δm| over all tokens')
    ax.set_title(f'{title}: the post-MLP scale patch per layer')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, names['dm']), dpi=110)
    plt.close(fig)


def _agreement_range(family, **want) -> str:
  values = sorted({100 * r['summary']['agreement'] for r in family['runs']
                   if all(r['setting'][k] == v for k, v in want.items())})
  if not values:
    return 'not run'
  return f'{values[0]:.0f}%' if len(values) == 1 else f'{values[0]:.0f}–{values[-1]:.0f}%'


def _span(values, fmt) -> str:
  lo, hi = min(values), max(values)
  return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else (
      f'{format(lo, fmt)}–{format(hi, fmt)}')


def highlights(family: dict) -> list[str]:
  """Bullet points over the settings of one model, per dtype and method."""
  out = []
  for dtype in ('float32', 'bfloat16'):
    for method in ('direct', 'stable'):
      full = [r for r in family['runs']
              if r['setting']['dtype'] == dtype and r['setting']['method'] == method]
      runs = [r['summary'] for r in full]
      if not runs:
        continue
      misses = [m for r in full for a, m in zip(np.ravel(r['per_step']['agree']),
                                                np.ravel(r['per_step']['margin'])) if not a]
      text = (f'{dtype} {method} ({len(runs)} settings): agreement '
              f"{_span([100 * r['agreement'] for r in runs], '.0f')}%, max |Δlogit| "
              f"{_span([r['max_abs_logit'] for r in runs], '.2g')}, mean TVD "
              f"{_span([r['mean_tvd'] for r in runs], '.2g')}")
      if all('max_dm' in r for r in runs):
        text += f", max |Δm| {_span([r['max_dm'] for r in runs], '.3g')}"
      margin = min(r['min_margin'] for r in runs)
      text += f'; the baseline\'s smallest top-2 margin {margin:.3g}'
      if misses and max(misses) == 0:
        text += f'; {len(misses)} disagreements in all, every one at an exact tie (margin 0)'
      elif misses:
        text += (f'; {len(misses)} disagreements in all, each at a baseline top-2 margin '
                 f'≤ {max(misses):.3g} ({sum(m == 0 for m in misses)} at exact ties)')
      out.append(text + '.')
  return out


def _ci(stat: dict, fmt: str = '.1f', scale: float = 100.0, sign: str = '') -> str:
  return (f"{format(scale * stat['mean'], sign + fmt)} [{format(scale * stat['lo'], sign + fmt)}, "
          f"{format(scale * stat['hi'], sign + fmt)}]")


def _run_label(key: str) -> str:
  dtype, method, _, _, loop = key.split('/')
  return f'{dtype} {method}, {loop} loop'


def _misses(run: dict) -> tuple[int, int]:
  """(disagreements, of them at an exact baseline tie) over all tokens of a run."""
  agree = np.ravel(run['per_step']['agree'])
  margin = np.ravel(run['per_step']['margin'])
  return int(np.sum(~agree.astype(bool))), int(np.sum(~agree.astype(bool) & (margin == 0)))


def _excludes_zero(stat: dict) -> bool:
  return stat['lo'] > 0 or stat['hi'] < 0


def verdict(intervals: dict) -> str:
  """One sentence from the intervals: bfloat16 stable vs direct in the closed loop, then each
  method's open loop against its closed loop; a difference is called one only where its 95%
  interval excludes 0."""
  runs, diffs = intervals['runs'], intervals['differences']
  key = lambda method, loop: f'bfloat16/{method}/action/0/{loop}'
  parts = []
  stable = diffs.get(f"{key('stable', 'closed')} - {key('direct', 'closed')}")
  if stable:
    d = stable['agreement']
    parts.append(
        f"in bfloat16 the closed loop (Algorithm 1) agrees with the full-context model on "
        f"{_ci(runs[key('direct', 'closed')]['agreement'])}% of greedy tokens with the direct "
        f"update and {_ci(runs[key('stable', 'closed')]['agreement'])}% with the stable one, a "
        f"paired difference of {_ci(d, sign='+')} points "
        f"({'its interval excludes 0' if _excludes_zero(d) else 'its interval includes 0'})")
  for method in ('direct', 'stable'):
    d = diffs.get(f"{key(method, 'open')} - {key(method, 'closed')}")
    if d:
      parts.append(f"the open loop's {method} update agrees on "
                   f"{_ci(runs[key(method, 'open')]['agreement'])}% "
                   f"({_ci(d['agreement'], sign='+')} points against the closed loop)")
  if not parts:
    return ''
  text = '; '.join(parts)
  return f'Verdict: {text[0].upper() + text[1:]} (%, [95% interval]).'


def intervals_section(results: dict, figure_prefix: str, figures_dir: str) -> str:
  """The markdown of an intervals run (config args prompts, tokens): per-setting means over
  prompts with 95% cluster-bootstrap intervals, the paired differences, the paper's numbers."""
  names = _figure_names(figure_prefix)
  rel = os.path.relpath(figures_dir, 'docs') if figures_dir else ''
  out = []
  for key, family in results['families'].items():
    title = family.get('label', key)
    iv = family['intervals']
    first = family['runs'][0]['per_step']['agree']
    prompts, tokens = len(first), len(first[0])
    text = verdict(iv)
    if text:
      out.append(text + '\n')
    out.append(f'#### {title}, {prompts} prompts × {tokens} greedy tokens: agreement with '
               '95% intervals\n')
    out.append(f"Each setting: first patched layer 0, apply action, logits from a separate "
               f"pass of the query alone with the computed patch applied. Intervals: 95% "
               f"percentile bootstrap over prompts ({iv['resamples']} resamples of the "
               f"{prompts} prompts with replacement, seed {iv['seed']}); a difference "
               "resamples the prompts' paired differences.\n")
    out.append('| dtype | method | loop | paper (Gemma 3 1B it) | agreement % [95% CI] | '
               'prompts at 100% | disagreements (at exact ties) | mean max abs dlogit '
               '[95% CI] | max abs dlogit |')
    out.append('|---|---|---|---|---|---|---|---|---|')
    paper = {(d, m): p for d, m, p in PAPER}
    for run in family['runs']:
      s = run['setting']
      k = '/'.join(str(s[f]) for f in ('dtype', 'method', 'mode', 'first_layer', 'loop'))
      st = iv['runs'][k]
      full = sum(a == 1.0 for a in st['per_prompt_agreement'])
      miss, ties = _misses(run)
      ref = paper.get((s['dtype'], s['method']), '-') if s['loop'] == 'closed' else '-'
      out.append(f"| {s['dtype']} | {s['method']} | {s['loop']} | {ref} | "
                 f"{_ci(st['agreement'])} | {full}/{st['agreement']['n']} | {miss} ({ties}) | "
                 f"{_ci(st['mean_abs_logit'], '.3g', 1.0)} | "
                 f"{run['summary']['max_abs_logit']:.3g} |")
    out.append('')
    out.append('Paired differences over prompts (b - a, per-prompt values; agreement in '
               'percentage points):\n')
    out.append('| b | a | agreement difference [95% CI] | mean max abs dlogit difference '
               '[95% CI] |')
    out.append('|---|---|---|---|')
    for d in iv['differences'].values():
      out.append(f"| {_run_label(d['b'])} | {_run_label(d['a'])} | "
                 f"{_ci(d['agreement'], sign='+')} | "
                 f"{_ci(d['mean_abs_logit'], '.3g', 1.0, sign='+')} |")
    out.append('')
  if rel:
    figs = ', '.join(f'`docs/{rel}/{names[k]}`' for k in ('metrics', 'summary'))
    out.append(f'Figures: {figs}.\n')
  out.extend(_continuations(results, 'bfloat16', prompt_chars=60, text_chars=80))
  out.append(_command_and_machine(results))
  return '\n'.join(out)


def doc_section(results: dict, figure_prefix: str, figures_dir: str) -> str:
  """The markdown of one run: command, comparison with the paper, tables, figures."""
  if 'intervals_run' in results:
    return intervals_section(results, figure_prefix, figures_dir)
  names = _figure_names(figure_prefix)
  rel = os.path.relpath(figures_dir, 'docs') if figures_dir else ''
  out = []
  for key, family in results['families'].items():
    title = family.get('label', key)
    out.append(f'#### {title}: agreement beside the paper\'s Gemma 3 1B\n')
    out.append('| dtype | method | paper (Gemma 3 1B it) | ours, apply materialise, first layer 0 '
               '| ours, every apply and first layer |')
    out.append('|---|---|---|---|---|')
    for dtype, method, paper in PAPER:
      if family['block'] != 'gemma' and method == 'stable':
        continue
      first = _agreement_range(family, dtype=dtype, method=method, mode='materialise',
                               first_layer=0)
      out.append(f'| {dtype} | {method} | {paper} | {first} | '
                 f'{_agreement_range(family, dtype=dtype, method=method)} |')
    out.append('')
  for key, family in results['families'].items():
    loss = family.get('final_train_loss')
    trained = f' (final training loss {loss:.2f})' if loss is not None else ''
    out.append(f"{family.get('label', key)}{trained}:\n")
    out.extend(f'* {line}' for line in highlights(family))
    out.append('')
  first = next(iter(results['families'].values()))['runs'][0]['per_step']['agree']
  out.append(f'All settings ({len(first)} prompts × {len(first[0])} tokens each; "min top-2 '
             'margin" is the baseline\'s, one baseline per dtype shared by every setting):\n')
  out.append(table(results))
  for key, family in results['families'].items():
    for dtype in ('float32', 'bfloat16'):
      text = dm_table(family, dtype, 'action')
      if text:
        tokens = np.size(family['runs'][0]['per_step']['agree'])
        out.append(f"Where the scale patch Δm is largest, {family.get('label', key)}, {dtype}, "
                   f'apply action, first layer 0 (per layer, the max over all {tokens} tokens; '
                   'the numerator, f = N(h), h and the scale m at that token and channel; min '
                   'abs f over all tokens and channels; μ is the stable update\'s multiplier, '
                   'and −μ/m is what its Δm equals in exact arithmetic):\n')
        out.append(text)
  if rel:
    figs = ', '.join(f'`docs/{rel}/{names[k]}`' for k in ('metrics', 'summary', 'dm'))
    out.append(f'Figures: {figs}.\n')
    out.append(f'![per-token metrics]({rel}/{names["metrics"]})\n')
  out.extend(_continuations(results, 'float32'))
  out.append(_command_and_machine(results))
  return '\n'.join(out)


def _continuations(results: dict, dtype: str, prompt_chars: int = 110,
                   text_chars: int = 110) -> list[str]:
  """Each family's baseline continuation of every prompt in `dtype`, one bullet a prompt."""
  out = []
  for key, family in results['families'].items():
    texts = family.get('generated', {}).get(dtype, [])
    if texts:
      out.append(f"Baseline continuations, {family.get('label', key)}, {dtype}:\n")
      out.extend(f'* `{_one_line(p, prompt_chars)}` → `{_one_line(t, text_chars)}`'
                 for p, t in zip(results['prompts'], texts))
      out.append('')
  return out


def _command_and_machine(results: dict) -> str:
  # `rerun`: today's form of a command recorded before the code moved (`command` is as run).
  command = results.get('rerun', results['command'])
  if not command.startswith('python'):  # the json holds sys.argv as run: `python` + argv
    command = f'python {command}'
  return (f"Command (run from the repository root; argv recorded in the results json):\n\n"
          f"```bash\n{command}\n```\n\nMachine: {results['machine']}; "
          f"wall time {results.get('wall_s', float('nan')) / 60:.1f} min.\n")


def _one_line(text: str, limit: int = 110) -> str:
  text = text.replace('\n', '⏎').replace('`', "'")
  return text if len(text) <= limit else text[:limit] + '…'


def marker(section: str, end: bool = False) -> str:
  return f"<!-- {'END' if end else 'BEGIN'} generated: implicit_generation/{section} -->"


def replace_section(doc_path: str, section: str, text: str):
  """Writes `text` between the section's markers in `doc_path` (appended if absent)."""
  body = ('<!-- written by ctr_jax.projects.implicit_generation from its results json; do not edit by '
          f'hand -->\n\n{text.rstrip()}\n')
  doc_sections.replace_between(doc_path, marker(section), marker(section, end=True), body)


def write_report(results: dict, workdir: str, figures_dir: str = '', *,
                 figure_prefix: str = 'implicit_generation', results_json: str = '',
                 doc: str = '', section: str = ''):
  """results.json and table.md in `workdir` (and a copy of the json at `results_json`), the
  figures in `figures_dir` (or workdir), and the doc section if `doc` and `section` are set."""
  paths = [os.path.join(workdir, 'results.json')] + ([results_json] if results_json else [])
  for path in paths:
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    with open(path, 'w') as f:
      json.dump(results, f)
  with open(os.path.join(workdir, 'table.md'), 'w') as f:
    f.write(table(results))
  out_dir = figures_dir or workdir
  os.makedirs(out_dir, exist_ok=True)
  figures(results, out_dir, figure_prefix)
  if doc and section:
    replace_section(doc, section, doc_section(results, figure_prefix, figures_dir))


def regenerate(results_json: str, doc: str = '', figures_dir: str = 'docs/figures'):
  """Rewrites a doc section and figures from a committed results json (no rerun); the
  section and figure names follow the json's file name as the config sets them."""
  with open(results_json) as f:
    results = json.load(f)
  section = os.path.splitext(os.path.basename(results_json))[0]
  doc = doc or ('docs/implicit_updates.md' if section == 'small_models' else
                'docs/implicit_updates_pretrained.md')
  prefix = 'implicit_generation' + ('' if section == 'small_models' else f'_{section}')
  figures(results, figures_dir, prefix)
  replace_section(doc, section, doc_section(results, prefix, figures_dir))


if __name__ == '__main__':
  for path in sys.argv[1:]:
    regenerate(path)
