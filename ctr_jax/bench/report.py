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
  out = [f"### `{r['name']}`: {r['machine_line']}", '',
         f"Command: `{r['command']}` ({r['date']}; medians of {r['repeats']} runs after "
         f"{r['warmup']} warm-up runs).", '',
         f"Measured ceilings: matmul {_fmt(r['peak_flops'] / 1e9)} GFLOP/s "
         f"({r['peak_dtype']}, {r['peak_size']}²); memory bandwidth "
         f"{_fmt(r['bandwidth'] / 1e9)} GB/s (float32 matrix-vector product).", '']
  for note in r.get('notes', []):
    out += [f'Note: {note}', '']
  if r.get('train'):
    out += ['#### Training throughput', '']
    # m: iterations backpropagated (the last m of K; 'all' = full backpropagation).
    rows = [[t['label'], t['k'] or '–', (t.get('m') or 'all') if t['k'] else '–', t['seq_len'],
             t['batch'], t['params'], t['step_ms'], t['tokens_per_second'],
             f"{100 * t['mfu']:.1f}%", f"{t['vs_peer']:.2f}×" if t.get('vs_peer') else '–']
            for t in r['train']]
    out += _table(['model', 'K', 'm', 'T', 'B', 'params', 'step ms', 'tokens/s', 'MFU',
                   'vs peer'], rows)
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
  out += verdicts(r)
  return '\n'.join(out).rstrip() + '\n'


def _met(value, goal) -> str:
  if value is None:
    return 'not measured'
  return (f'**met** ({value:.2f}× against ≥ {goal:g}×)' if value >= goal
          else f'**not met** ({value:.2f}× against ≥ {goal:g}×, {100 * (1 - value / goal):.0f}% '
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
