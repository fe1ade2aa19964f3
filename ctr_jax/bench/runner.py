"""Runs the sections a bench config asks for and collects one results dict.

Sections: 'train' (throughput and MFU per model, and the peer), 'decode' (the paper's pairs at
each batch size, and the peer), 'prefill', 'chunked' (chunked prefill against the scan) and
'scaling'. See configs/bench/ for the fields.
"""

import datetime
import statistics

from ctr_jax.bench import peer, suite
from ctr_jax.reporting import machine, timing

SECTIONS = ('train', 'decode', 'generate', 'prefill', 'chunked', 'scaling')
DTYPES = ('float32', 'bfloat16')


def validate(config) -> None:
  """Raises ValueError naming the first bad field."""
  sections = [s for s in config.sections.split(',') if s]
  bad = sorted(set(sections) - set(SECTIONS))
  if bad or not sections:
    raise ValueError(f'bench.sections: got {config.sections!r}, allowed a comma-separated '
                     f'subset of {list(SECTIONS)}')
  if config.dtype not in DTYPES:
    raise ValueError(f'bench.dtype: got {config.dtype!r}, allowed {list(DTYPES)}')
  for field in ('warmup', 'repeats'):
    if config[field] < 1:
      raise ValueError(f'bench.{field}: got {config[field]}, must be >= 1')
  if 'decode' in sections and any(b < 1 for b in config.decode.batches):
    raise ValueError(f'bench.decode.batches: got {list(config.decode.batches)}, each must be >= 1')
  for i, entry in enumerate(config.train):
    suite.model_config(_with_dtype(entry['model'], config.dtype))  # raises on a bad model field
    k, m = entry.get('k', 0), entry.get('m', 0)
    if m and not (entry['model'].get('kind') == 'context_ready' and 0 < m <= k):
      raise ValueError(f'bench.train[{i}].m: got {m}, allowed 0 (all iterations) or 1..k={k} '
                       'for a context-ready model')
  if 'chunked' in sections:
    _validate_chunked(config.chunked)


def _validate_chunked(ch) -> None:
  for field in ('sizes', 'chunks', 'passes'):
    if not list(ch[field]):
      raise ValueError(f'bench.chunked.{field}: got an empty list, allowed a non-empty one')
  for field in ('chunks', 'passes'):
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in ch[field]):
      raise ValueError(f'bench.chunked.{field}: got {list(ch[field])}, allowed ints >= 1')
  if ch.tolerance_passes < 1:
    raise ValueError(f'bench.chunked.tolerance_passes: got {ch.tolerance_passes}, must be >= 1')
  if ch.prompt_len < 1:
    raise ValueError(f'bench.chunked.prompt_len: got {ch.prompt_len}, must be >= 1')
  if not ch.tolerance >= 0:
    raise ValueError(f'bench.chunked.tolerance: got {ch.tolerance}, allowed >= 0 (0: no '
                     'tolerance rows)')
  for name in ch.sizes:
    suite.model_config({'name': name, 'vocab_size': ch.vocab_size})  # raises on a bad size name


def _with_dtype(fields: dict, dtype: str) -> dict:
  return {'dtype': dtype, **dict(fields)}


def _label(fields: dict) -> str:
  if fields.get('name'):
    return fields['name']
  prefix = 'd' if fields.get('kind', 'context_ready') == 'context_ready' else 't'
  return f"{prefix}{fields['depth']}_c{fields['width']}"


def _ratio(a: float, b: float):
  return a / b if b > 0 else None


def run(config, log=print) -> dict:
  validate(config)
  sections = config.sections.split(',')
  reps = {'warmup': config.warmup, 'repeats': config.repeats}
  info = machine.describe()
  results = {'name': config.name, 'command': config.command, 'machine': info,
             'machine_line': machine.summary_line(info), 'warmup': config.warmup,
             'repeats': config.repeats, 'date': datetime.date.today().isoformat(),
             'peak_dtype': config.dtype, 'peak_size': config.peak_size, 'notes': [],
             'goals': dict(config.goals)}
  log(f'bench {config.name}: {results["machine_line"]}')
  results['peak_flops'] = machine.matmul_peak(config.dtype, config.peak_size, **reps)
  results['bandwidth'] = machine.memory_bandwidth(config.bandwidth_mb, **reps)
  log(f"  matmul peak {results['peak_flops'] / 1e9:.1f} GFLOP/s, "
      f"bandwidth {results['bandwidth'] / 1e9:.1f} GB/s")
  peer_missing = peer.available() if config.peer.enabled else 'PyTorch peer disabled'
  if config.peer.enabled and peer_missing:
    results['notes'].append(peer_missing)

  if 'train' in sections:
    results['train'], matched_runner = [], None
    for entry in config.train:
      fields = _with_dtype(entry['model'], config.dtype)
      label = entry.get('label') or _label(fields)
      runner = suite.train_step_runner(fields, seq_len=entry['seq_len'], batch=entry['batch'],
                                       k_unroll=entry.get('k', 0),
                                       grad_iterations=entry.get('m', 0))
      row = suite.train_throughput(fields, seq_len=entry['seq_len'], batch=entry['batch'],
                                   k_unroll=entry.get('k', 0),
                                   grad_iterations=entry.get('m', 0), runner=runner, **reps)
      if label == config.peer.matched_label and matched_runner is None:
        matched_runner = runner[0]  # compiled once: the paired rounds below time this step
      del runner
      row.update(label=label, k=entry.get('k', 0),
                 m=entry.get('m', 0),
                 seq_len=entry['seq_len'], batch=entry['batch'])
      row['mfu'] = row['flops_per_token'] * row['tokens_per_second'] / results['peak_flops']
      results['train'].append(row)
      log(f"  train {row['label']} K={row['k']} m={row['m'] or 'all'}: {row['tokens_per_second']:.0f} tokens/s, "
          f"MFU {100 * row['mfu']:.1f}%")
    if not peer_missing:
      results['train'].append(_paired_training(config, results, matched_runner, reps, log))

  if 'decode' in sections:
    d = config.decode
    results['decode'], results['decode_pairs'] = [], []
    by_key = {}
    for pair in d.pairs:
      for name in pair:
        for batch in d.batches:
          fields = _with_dtype({'name': name, 'vocab_size': d.vocab_size,
                                'max_len': d.prompt_len + d.new_tokens + 1}, config.dtype)
          row = suite.decode_latency(fields, batch=batch, prompt_len=d.prompt_len,
                                     new_tokens=d.new_tokens, **reps)
          row.update(label=name, batch=batch,
                     roofline_ms=1e3 * row['bytes_per_step'] / results['bandwidth'],
                     paper_ms=dict(d.paper_ms).get(name) if batch == 1 else None)
          by_key[(name, batch)] = row
          results['decode'].append(row)
          log(f"  decode {name} B={batch}: {row['ms_per_token']:.2f} ms/token "
              f"(roofline {row['roofline_ms']:.2f})")
      crt, transformer = pair
      for batch in d.batches:
        paper = dict(d.paper_ms)
        results['decode_pairs'].append({
            'crt': crt, 'transformer': transformer, 'batch': batch,
            'speedup': _ratio(by_key[(transformer, batch)]['ms_per_token'],
                              by_key[(crt, batch)]['ms_per_token']),
            'paper_speedup': paper[transformer] / paper[crt]
                             if batch == 1 and crt in paper and transformer in paper else None})
    if d.matched_model:
      for batch in d.batches:
        fields = _with_dtype(d.matched_model, config.dtype)
        row = suite.decode_latency(fields, batch=batch, prompt_len=d.prompt_len,
                                   new_tokens=d.new_tokens, **reps)
        row.update(label=_label(fields) + ' (peer shape)', batch=batch,
                   roofline_ms=1e3 * row['bytes_per_step'] / results['bandwidth'])
        if not peer_missing:
          p = config.peer
          theirs = peer.decode_latency(width=p.width, depth=p.depth, heads=p.heads,
                                       vocab=p.vocab, batch=batch, prompt_len=d.prompt_len,
                                       new_tokens=d.new_tokens, dtype=config.dtype, **reps)
          row['vs_peer'] = _ratio(theirs['ms_per_token'], row['ms_per_token'])
          results['decode'].append(row)
          results['decode'].append({'label': 'HF GPT-2 generate (peer shape)', 'batch': batch,
                                    'params': None, 'ms_per_token': theirs['ms_per_token'],
                                    'roofline_ms': row['roofline_ms']})
        else:
          results['decode'].append(row)
        log(f"  decode {row['label']} B={batch}: {row['ms_per_token']:.2f} ms/token"
            + (f", peer ÷ ours {row['vs_peer']:.2f}" if 'vs_peer' in row else ''))

  if 'generate' in sections:
    results['generate'] = [_generate_row(config, batch, peer_missing, reps, log)
                           for batch in config.generate.batches]

  if 'prefill' in sections:
    p = config.prefill
    fields = _with_dtype(p.model, config.dtype)
    row = suite.prefill_comparison(fields, prompt_len=p.prompt_len, tolerance=p.tolerance, **reps)
    row.update(label=_label(fields), prompt_len=p.prompt_len, tolerance=p.tolerance)
    results['prefill'] = row
    log(f"  prefill: sequential {row['sequential_ms']:.0f} ms, parallel {row['parallel_ms']:.0f}"
        f" ms in {row['iterations']} passes, max |dlogit| {row['max_abs_logit_diff']:.2e}")

  if 'chunked' in sections:
    results['chunked'] = _chunked_section(config, reps, log)

  if 'scaling' in sections:
    s = config.scaling
    results['scaling'] = {'batch': s.batch}
    train_fields = _with_dtype(s.train_model, config.dtype)
    results['scaling']['train_label'] = _label(train_fields)
    results['scaling']['train'] = suite.train_scaling(
        train_fields, batch=s.batch, seq_lens=list(s.seq_lens), k_values=list(s.k_values), **reps)
    decode_fields = _with_dtype(s.decode_model, config.dtype)
    results['scaling']['decode_label'] = _label(decode_fields)
    results['scaling']['decode'] = suite.decode_scaling(
        decode_fields, contexts=list(s.contexts), new_tokens=s.new_tokens, **reps)
    log(f"  scaling: K^{results['scaling']['train']['k_exponent']:.2f}, "
        f"T^{results['scaling']['train']['t_exponent']:.2f}, "
        f"decode context^{results['scaling']['decode']['exponent']:.2f}")
  return results


def _paired_training(config, results, ours, reps, log) -> dict:
  """The peer's training step, timed in the same rounds as `ours`, our step of the same shape
  (the train entry labelled `peer.matched_label`, None if there is none), whose row gets the
  paired ratio `vs_peer`."""
  p = config.peer
  matched = next((t for t in results['train'] if t['label'] == p.matched_label), None)
  theirs = peer.train_step_fn(width=p.width, depth=p.depth, heads=p.heads, vocab=p.vocab,
                              seq_len=p.seq_len, batch=p.batch, dtype=config.dtype)
  fns = {'peer': theirs}
  if ours is not None:
    fns['ours'] = ours
  times = timing.interleaved_seconds(fns, warmup=reps['warmup'],
                                     repeats=max(reps['repeats'], p.rounds))
  seconds = statistics.median(times['peer'])
  row = {'label': peer.label(config.dtype),
         'k': 0, 'm': 0, 'seq_len': p.seq_len, 'batch': p.batch, 'params': None,
         'step_ms': 1e3 * seconds, 'tokens_per_second': p.batch * p.seq_len / seconds,
         'rounds': len(times['peer'])}
  row['mfu'] = (matched['flops_per_token'] * row['tokens_per_second'] / results['peak_flops']
                if matched else 0.0)
  if matched and 'ours' in times:
    matched['vs_peer'] = timing.median_ratio(times['peer'], times['ours'])
    matched['paired_step_ms'] = 1e3 * statistics.median(times['ours'])
    log(f"  train peer: {row['tokens_per_second']:.0f} tokens/s; ours ÷ peer time, paired over "
        f"{row['rounds']} rounds: {matched['vs_peer']:.2f}x")
  return row


def _generate_row(config, batch, peer_missing, reps, log) -> dict:
  """`decode.generate` whole calls (and 1-token calls, for the marginal ms per token), in the
  same rounds as the peer's `generate` when it is installed."""
  g = config.generate
  fields = _with_dtype(g.model, config.dtype)
  n = g.new_tokens
  ours, params = suite.generate_runner(fields, batch=batch, prompt_len=g.prompt_len)
  fns = {'ours': lambda: ours(n), 'ours_1': lambda: ours(1)}
  if not peer_missing:
    p = config.peer
    theirs = peer.generate_runner(width=p.width, depth=p.depth, heads=p.heads, vocab=p.vocab,
                                  batch=batch, prompt_len=g.prompt_len,
                                  max_len=g.prompt_len + n + 1, dtype=config.dtype)
    fns.update(peer=lambda: theirs(n), peer_1=lambda: theirs(1))
  times = timing.interleaved_seconds(fns, warmup=reps['warmup'],
                                     repeats=max(reps['repeats'], config.peer.rounds))

  def summary(side):
    whole, one = statistics.median(times[side]), statistics.median(times[side + '_1'])
    marginal = max(whole - one, 0.0) / max(n - 1, 1)
    return {'whole_call_ms': 1e3 * whole, 'marginal_ms_per_token': 1e3 * marginal,
            'overhead_ms': 1e3 * (whole - n * marginal)}

  row = {**summary('ours'), 'params': params, 'label': _label(fields), 'batch': batch,
         'prompt_len': g.prompt_len, 'new_tokens': n, 'rounds': len(times['ours'])}
  if 'peer' in times:
    row['peer'] = summary('peer')
    row['vs_peer_whole'] = timing.median_ratio(times['peer'], times['ours'])
    row['vs_peer_marginal'] = _ratio(row['peer']['marginal_ms_per_token'],
                                     row['marginal_ms_per_token'])
  log(f"  generate B={batch}: whole call {row['whole_call_ms']:.1f} ms, "
      f"{row['marginal_ms_per_token']:.2f} ms/token marginal"
      + (f", peer ÷ ours {row['vs_peer_whole']:.2f} (whole)" if 'peer' in row else ''))
  return row


def _chunked_section(config, reps, log) -> list[dict]:
  """Chunked prefill vs the scan for each size (random weights), then the trained checkpoint."""
  ch = config.chunked
  grid = {'chunks': list(ch.chunks), 'passes': list(ch.passes), 'tolerance': ch.tolerance,
          'tolerance_passes': ch.tolerance_passes}
  entries = []
  for name in ch.sizes:
    fields = _with_dtype({'name': name, 'vocab_size': ch.vocab_size,
                          'max_len': ch.prompt_len + 1}, config.dtype)
    entries.append((name, 'random', fields, None, ch.prompt_len))
  if ch.checkpoint:
    fields, params = suite.load_checkpoint(ch.checkpoint)
    fields = _with_dtype(fields, config.dtype)
    # A learned position table has no rows past max_len; RoPE models are cut there too, the
    # lengths the contraction was trained at.
    entries.append((f'{_label(fields)} ({ch.checkpoint})', 'trained', fields, params,
                    min(ch.prompt_len, fields['max_len'])))
  out = []
  for label, weights, fields, params, prompt_len in entries:
    row = suite.chunked_prefill_comparison(fields, prompt_len=prompt_len, params=params, **grid,
                                           **reps)
    row.update(label=label, weights=weights, prompt_len=prompt_len)
    out.append(row)
    best = max(row['rows'], key=lambda r: r['speedup'])
    log(f"  chunked prefill {label}: scan {row['scan_ms']:.0f} ms; best chunk {best['chunk']}, "
        f"{best['passes']} passes: {best['ms']:.0f} ms ({best['speedup']:.2f}x), "
        f"max |dlogit| {best['max_abs_logit_diff']:.2e}")
  return out
