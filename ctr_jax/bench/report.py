"""Results -> a markdown section (tables) printed and written into docs/benchmarks.md.

Each config owns one section between `<!-- bench:NAME -->` markers; rerunning a config replaces
its section and leaves the hand-written text and other sections alone. The raw numbers go to a
JSON file next to the markdown file.
"""

import json
import os

from ctr_jax.reporting import doc_sections


def _fmt(x, digits=3):
  if x is None:
    return '–'
  if isinstance(x, int):
    return f'{x:,}'
  if abs(x) >= 100:
    return f'{x:,.0f}'
  return f'{x:.{digits}g}'


def _table(header, rows) -> list[str]:
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(_fmt(c) if not isinstance(c, str) else c for c in row) + ' |'
            for row in rows]
  return lines + ['']


def markdown(results: dict) -> str:
  r = results
  out = [f"### `{r['name']}`: {r['machine_line']}", '']
  if r.get('smoke'):
    out += ['**Smoke run**: toy sizes of a config meant for an accelerator; the numbers say only '
            'that every section runs.', '']
  if r.get('complete') is False:
    out += ['**Partial**: the run stopped before its end (the rows below are those it '
            'finished).', '']
  out += [f"Command: `{r['command']}` ({r['date']}; medians of {r['repeats']} runs after "
          f"{r['warmup']} warm-up runs).", '',
          f"Measured ceilings: matmul {_fmt(r['peak_flops'] / 1e9)} GFLOP/s "
          f"({r['peak_dtype']}, {r['peak_size']}²); memory bandwidth "
          f"{_fmt(r['bandwidth'] / 1e9)} GB/s (float32 matrix-vector product).", '']
  if r.get('mfu_peak_source', '').startswith('data sheet'):
    out += [f"Device: {r['device']}. MFU is against {_fmt(r['mfu_peak_flops'] / 1e12)} TFLOP/s "
            f"({r['mfu_peak_source']}); precision: {r['precision']['note']}.", '']
  elif r.get('precision'):
    out += [f"Device: {r['device']}. MFU is against the measured matmul peak; precision: "
            f"{r['precision']['note']}.", '']
  for note in r.get('notes', []):
    out += [f'Note: {note}', '']
  if r.get('train'):
    out += ['#### Training throughput', '']
    # m: iterations backpropagated (the last m of K; 'all' = full backpropagation).
    rows = [[t['label'] + (' (remat)' if t.get('remat') else ''), t['k'] or '–', (t.get('m') or 'all') if t['k'] else '–', t['seq_len'],
             t['batch'], t['params'], t['step_ms'], t['tokens_per_second'],
             f"{100 * t['mfu']:.1f}%", f"{t['vs_peer']:.2f}×" if t.get('vs_peer') else '–']
            for t in r['train']]
    out += _table(['model', 'K', 'm', 'T', 'B', 'params', 'step ms', 'tokens/s', 'MFU',
                   'vs peer'], rows)
    compiled = [t for t in r['train'] if t.get('compile_s') is not None]
    if compiled:
      out += ['Compilation of each step: ' + ', '.join(
          f"{t['label']} {t['compile_s']:.0f} s" + (f" ({t['temp_gib']:.1f} GiB of temporaries)"
                                                   if t.get('temp_gib') else '')
          for t in compiled) + '.', '']
    peer_row = next((t for t in r['train'] if t.get('rounds')), None)
    if peer_row:
      out += [f"vs peer: the peer's step time ÷ ours, median over {peer_row['rounds']} rounds "
              'that run one step of each in turn (paired, so slow drifts of the machine fall on '
              'both); the peer row is timed in those rounds.', '']
  if r.get('decode'):
    out += ['#### Decode (ms per generated position, greedy, KV cache)', '']
    rows = [[d['label'], d['batch'], d['params'], d['ms_per_token'], d['roofline_ms'],
             f"{d['ms_per_token'] / d['roofline_ms']:.2f}×" if d['roofline_ms'] else '–',
             d.get('paper_ms') or '–',
             f"{d['vs_peer']:.2f}×" if d.get('vs_peer') else '–'] for d in r['decode']]
    out += _table(['model', 'B', 'params', 'ms/token', 'roofline ms', 'vs roofline',
                   'paper A100 bf16 B=1', 'peer ÷ ours'], rows)
    if r.get('decode_pairs'):
      rows = [[p['crt'], p['transformer'], p['batch'],
               f"{p['speedup']:.2f}×" if p['speedup'] else '–',
               f"{p['paper_speedup']:.2f}×" if p.get('paper_speedup') else '–']
              for p in r['decode_pairs']]
      out += _table(['context-ready', 'transformer', 'B', 'speedup (transformer ms ÷ CRT ms)',
                     'paper'], rows)
  if r.get('generate'):
    g = r['generate']
    out += ['#### `decode.generate` as users call it (whole calls vs marginal per token)', '',
            f"{g[0]['label']}, {g[0]['prompt_len']}-token prompt, {g[0]['new_tokens']} new tokens, "
            'greedy; whole calls include the prefill and every per-call cost, the marginal '
            'figure is (t(n) - t(1)) / (n - 1) of the same call. Each round runs every call once '
            f"(ours and the peer's, n and 1 tokens), {g[0].get('rounds', r['repeats'])} rounds; "
            "'peer ÷ ours (whole)' is the median of the rounds' ratios.", '']
    ratio = lambda x: f'{x:.2f}×' if x else '–'
    rows = [[x['batch'], x['whole_call_ms'], x['marginal_ms_per_token'], x['overhead_ms'],
             x['peer']['whole_call_ms'] if 'peer' in x else '–',
             x['peer']['marginal_ms_per_token'] if 'peer' in x else '–',
             ratio(x.get('vs_peer_whole')), ratio(x.get('vs_peer_marginal'))] for x in g]
    out += _table(['B', 'ours: whole call ms', 'ours: marginal ms/token', 'ours: overhead ms',
                   'peer: whole call ms', 'peer: marginal ms/token', 'peer ÷ ours (whole)',
                   'peer ÷ ours (marginal)'], rows)
  if r.get('prefill'):
    p = r['prefill']
    out += ['#### Prefill: sequential scan vs parallel fixed point', '',
            f"{p['label']}, prompt {p['prompt_len']} tokens, tolerance {p['tolerance']:g}.", '']
    out += _table(['sequential ms', 'parallel ms', 'block passes', 'speedup', 'max |Δlogit|'],
                  [[p['sequential_ms'], p['parallel_ms'], p['iterations'], p['speedup'],
                    f"{p['max_abs_logit_diff']:.2e}"]])
  if r.get('chunked'):
    out += ['#### Chunked prefill vs the sequential scan', '',
            'Passes: the cap per chunk (= chunk: the exact bound); with a tolerance the chunk '
            'stops once max |c_new - c| <= it, and "used" is the mean / largest count per '
            'chunk.', '']
    for entry in r['chunked']:
      out += [f"{entry['label']}, {entry['weights']} weights ({entry['params']:,} params), "
              f"prompt {entry['prompt_len']} tokens: scan {_fmt(entry['scan_ms'])} ms.", '']
      rows = [[row['chunk'], f"{row['passes']}" + (' (exact)' if row['exact_bound'] else ''),
               f"{row['tolerance']:g}" if row['tolerance'] else '–', row['ms'],
               f"{row['speedup']:.2f}×", f"{row['passes_mean']:.3g} / {row['passes_max']}",
               f"{row['max_abs_logit_diff']:.2e}"] for row in entry['rows']]
      out += _table(['chunk', 'passes', 'tolerance', 'ms', 'vs scan', 'used', 'max |Δlogit|'],
                    rows)
  if r.get('ttft'):
    out += _ttft_lines(r['ttft'])
  if r.get('scaling'):
    s = r['scaling']
    out += ['#### Scaling', '']
    if 'train' in s:
      t = s['train']
      out += [f"Training step of {s['train_label']} (B = {s['batch']}):", '']
      out += _table(['K (T = %d)' % t['t_fixed'], *map(str, t['by_k'])],
                    [['step ms', *t['by_k'].values()]])
      out += _table(['T (K = %d)' % t['k_fixed'], *map(str, t['by_t'])],
                    [['step ms', *t['by_t'].values()]])
      out += [f"Measured exponents: step time ∝ K^{t['k_exponent']:.2f}, "
              f"∝ T^{t['t_exponent']:.2f}.", '']
    if 'decode' in s:
      d = s['decode']
      out += [f"Batch-1 decode of {s['decode_label']} against the context length:", '']
      out += _table(['context', *map(str, d['by_context'])],
                    [['ms/token', *d['by_context'].values()]])
      out += [f"Measured exponent: decode ms/token ∝ context^{d['exponent']:.2f}.", '']
  if r.get('skipped'):
    out += ['#### Skipped', '', *[f'- {note}' for note in r['skipped']], '']
  budget = {k: v for k, v in (r.get('budget') or {}).items() if v.get('budget_s')}
  if budget:
    out += _table(['section', 'budget s', 'used s', 'items skipped'],
                  [[name, b['budget_s'], b['used_s'], b['skipped']] for name, b in budget.items()])
  out += verdicts(r)
  return '\n'.join(out).rstrip() + '\n'


_METHODS = {'scan': 'exact scan', 'chunked': 'chunked fixed point', 'parallel': 'parallel'}


def _ttft_lines(rows) -> list[str]:
  scan_ms = {(t['model'], t['prompt_len']): t['ms'] for t in rows if t['method'] == 'scan'}
  out = ['#### Time to the first token (batch 1, random weights)', '',
         'The prefill of a random prompt and the greedy pick from its last logits, fetched to the '
         'host. Sequential passes: block passes run one after the other (the scan: one per '
         'position; chunked: the passes of every chunk; parallel: over the whole prompt). '
         'Chunked: at most the cap per chunk, fewer once max |c_new - c| <= the tolerance. '
         "Δ: against the scan's last logits.", '']
  table = []
  for t in rows:
    method = _METHODS[t['method']]
    if t['method'] == 'chunked':
      method += (f" (chunk {t['chunk']}, ≤ {t['max_passes']} passes, tol {t['tolerance']:g}; "
                 f"used {t['passes_mean']:.3g} / {t['passes_max']})")
    elif t['method'] == 'parallel' and t['kind'] == 'context_ready':
      method += f" fixed point (tol {t['tolerance']:g})"
    scan = scan_ms.get((t['model'], t['prompt_len']))
    vs = f"{scan / t['ms']:.2f}×" if scan and t['method'] != 'scan' and t['ms'] else '–'
    diff = t.get('max_abs_last_logit_diff')
    same = {True: 'yes', False: 'no', None: '–'}[t.get('same_first_token')]
    table.append([t['model'], t['prompt_len'], method, t['ms'], t['sequential_passes'], vs,
                  f'{diff:.2e}' if diff is not None else '–', same])
  return out + _table(['model', 'prompt', 'prefill', 'ms', 'sequential passes', 'vs scan',
                       'max |Δ last logit|', 'same token'], table)


def _met(value, goal) -> str:
  if value is None:
    return 'not measured'
  return (f'**met** ({value:.2f}× against ≥ {goal:.3g}×)' if value >= goal
          else f'**not met** ({value:.2f}× against ≥ {goal:.3g}×, {100 * (1 - value / goal):.0f}% '
               'short)')


def verdicts(r: dict) -> list[str]:
  """One line per goal of the config's `goals` that this run measured."""
  goals = r.get('goals') or {}
  lines = []
  if 'train_vs_peer' in goals and r.get('train'):
    value = next((t['vs_peer'] for t in r['train'] if t.get('vs_peer')), None)
    lines.append(f"- Training at the peer's shape: {_met(value, goals['train_vs_peer'])}.")
  if 'generate_vs_peer' in goals and r.get('generate'):
    for x in r['generate']:
      if 'peer' not in x:
        lines.append(f"- `generate`, B = {x['batch']}: not measured (no peer).")
        continue
      marginal = x.get('vs_peer_marginal')
      # A ratio of None means our marginal time was zero: too small to resolve, not absent.
      marginal = f'{marginal:.2f}×' if marginal is not None else 'unresolved'
      lines.append(f"- `generate`, whole calls, B = {x['batch']}: "
                   f"{_met(x.get('vs_peer_whole'), goals['generate_vs_peer'])}; marginal per "
                   f"token {marginal}.")
  if 'mfu' in goals and 'train' in r:
    row = next((t for t in r['train'] if t.get('model') == goals.get('mfu_model')), None)
    value = row['mfu'] if row else None
    lines.append(f"- Training MFU of {goals.get('mfu_model')} ≥ {100 * goals['mfu']:.0f}%: "
                 + ('not measured' if value is None else
                    f"**met** ({100 * value:.1f}%)" if value >= goals['mfu'] else
                    f"**not met** ({100 * value:.1f}%)") + '.')
  if 'decode_vs_paper' in goals and 'decode_pairs' in r:
    for pair in r['decode_pairs']:
      if pair['crt'] not in goals['decode_vs_paper'] or pair['batch'] != 1:
        continue
      paper = pair.get('paper_speedup')
      where = f"{pair['crt']} vs {pair['transformer']} decode, B = 1"
      if paper is None:
        value = pair.get('speedup')
        lines.append(f"- {where}: " + ('not measured' if value is None else f'{value:.2f}×')
                     + ' (no paper figure).')
      else:
        lines.append(f"- {where}, against the paper's A100 figure: "
                     f"{_met(pair.get('speedup'), paper)}.")
  if 'chunked_vs_scan' in goals and r.get('chunked'):
    limit = goals.get('chunked_max_logit_diff', 1e-3)
    for entry in r['chunked']:
      if entry['label'] != goals.get('chunked_size') and entry['weights'] != 'trained':
        continue
      # "Exact to the tolerance": the rows whose logits are within `limit` of the scan's. A
      # chunk as long as the prompt is the one-chunk parallel prefill, not a chunked one.
      prompt_len = entry.get('prompt_len', float('inf'))
      exact = [row for row in entry['rows'] if row['max_abs_logit_diff'] <= limit
               and row['chunk'] < prompt_len]
      best = max(exact, key=lambda row: row['speedup']) if exact else None
      where = (f" (chunk {best['chunk']}, {best['passes']} passes"
               + (f", tolerance {best['tolerance']:g}" if best['tolerance'] else '')
               + f", max |Δlogit| {best['max_abs_logit_diff']:.1e})" if best else
               f' (no row within max |Δlogit| {limit:g})')
      lines.append(f"- Chunked prefill, {entry['label']} ({entry['weights']} weights), fastest "
                   f"row within max |Δlogit| {limit:g} of the scan, chunks shorter than the "
                   "prompt: "
                   f"{_met(best['speedup'] if best else None, goals['chunked_vs_scan'])}{where}.")
  return ['#### Goals', '', *lines, ''] if lines else []


def write_section(path: str, name: str, section: str) -> None:
  """Replaces (or appends) the `name` section of the markdown file at `path`."""
  doc_sections.replace_between(path, f'<!-- bench:{name} -->', f'<!-- /bench:{name} -->',
                               section, new_file='# Benchmarks')


def write_json(path: str, results: dict) -> None:
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(results, f, indent=1, default=float)
  os.replace(tmp, path)
