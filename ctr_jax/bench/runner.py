"""Runs the sections a bench config asks for and collects one results dict.

Sections: 'train' (throughput and MFU per model, and the peer), 'decode' (the paper's pairs at
each batch size, and the peer), 'prefill', 'chunked' (chunked prefill against the scan),
'ttft' (time to the first token by each prefill method) and 'scaling', run in the order the
config lists them. See configs/bench/ for the fields.

MFU is against the device's data-sheet peak where `reporting.peaks` has one (a listed GPU or
TPU, in bfloat16), else against the matmul peak measured in the same run (every CPU figure).
With `config.budget` a section skips, with a note, the items that would overrun its seconds.
"""

import datetime
import math
import statistics
import time

import numpy as np

from ctr_jax import models
from ctr_jax.bench import budget as budget_lib
from ctr_jax.bench import devices, peer, suite
from ctr_jax.bench.validation import validate, with_dtype
from ctr_jax.reporting import machine, timing


def _label(fields: dict) -> str:
  if fields.get('name'):
    return fields['name']
  prefix = 'd' if fields.get('kind', 'context_ready') == 'context_ready' else 't'
  return f"{prefix}{fields['depth']}_c{fields['width']}"


def _ratio(a: float, b: float):
  return a / b if b > 0 else None


def run(config, log=print, progress=None) -> dict:
  """Runs the config's sections in its order; `progress(results)` (if given) after every row,
  so a run stopped from outside leaves what it measured (`results['complete']` is False)."""
  validate(config)
  sections = [s for s in config.sections.split(',') if s]
  reps = {'warmup': config.warmup, 'repeats': config.repeats}
  info = machine.describe()
  kind = devices.device_kind()
  results = {'name': config.name, 'command': config.command, 'machine': info,
             'machine_line': machine.summary_line(info), 'device': devices.device_name(),
             'device_kind': kind, 'warmup': config.warmup,
             'repeats': config.repeats, 'date': datetime.date.today().isoformat(),
             'peak_dtype': config.dtype, 'peak_size': config.peak_size, 'notes': [],
             'skipped': [], 'goals': dict(config.goals), 'complete': False,
             'smoke': config.smoke,
             'precision': _precision(config.dtype, info['platform'])}
  log(f'bench {config.name}: {results["machine_line"]}')
  budget = budget_lib.Budget(dict(config.budget.sections), config.budget.total_s)
  setup = budget.section('setup')
  results['peak_flops'] = machine.matmul_peak(config.dtype, config.peak_size, **reps)
  results['bandwidth'] = machine.memory_bandwidth(config.bandwidth_mb, **reps)
  setup.close()
  sheet = devices.peak_flops(kind, config.dtype)
  results['mfu_peak_flops'] = sheet or results['peak_flops']
  results['mfu_peak_source'] = (f'data sheet, {kind}, {config.dtype} dense' if sheet else
                                f'measured matmul, {config.dtype} {config.peak_size}²')
  log(f"  matmul peak {results['peak_flops'] / 1e9:.1f} GFLOP/s, "
      f"bandwidth {results['bandwidth'] / 1e9:.1f} GB/s; MFU against "
      f"{results['mfu_peak_flops'] / 1e12:.4g} TFLOP/s ({results['mfu_peak_source']})")
  peer_missing = peer.available() if config.peer.enabled else 'PyTorch peer disabled'
  if config.peer.enabled and peer_missing:
    results['notes'].append(peer_missing)
  progress = progress or (lambda _: None)
  results['budget'] = budget.report
  context = _Context(config, results, reps, peer_missing, log, progress)
  for name in sections:
    section = budget.section(name)
    _SECTIONS[name](context, section)
    section.close()
    progress(results)
  results['complete'] = True
  return results


def _precision(dtype: str, platform: str) -> dict:
  note = ('model dtype bfloat16 (products and activations) with float32 parameters and AdamW '
          'state: the mixed precision config.precision="auto" is to give on a GPU or TPU'
          if dtype == 'bfloat16' else 'float32 throughout')
  if dtype == 'bfloat16' and platform == 'cpu':
    note += ' (on a CPU "auto" means float32: a CPU run in bfloat16 only smoke-tests that path)'
  return {'compute_dtype': dtype, 'param_dtype': 'float32', 'note': note}


class _Context:
  """What every section reads: the config, the results so far, the repetitions, the peer."""

  def __init__(self, config, results, reps, peer_missing, log, progress):
    self.config, self.results, self.reps = config, results, reps
    self.peer_missing, self.log, self.progress = peer_missing, log, progress


def _admit(ctx, section, label: str, kind: str, prior: float) -> bool:
  """Whether the item fits in the section's budget; where not, its note is logged and kept."""
  note = section.admit(label, kind, prior)
  if note:
    ctx.log(f'  {note}')
    ctx.results['skipped'].append(note)
  return not note


def _timed(fn):
  """(fn(), wall seconds)."""
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def _train_section(ctx, section) -> None:
  config, results, reps, log = ctx.config, ctx.results, ctx.reps, ctx.log
  est = config.estimates
  results['train'], matched_runner = [], None
  for entry in config.train:
    fields = with_dtype(entry['model'], config.dtype)
    label = entry.get('label') or _label(fields)
    k, m = entry.get('k', 0), entry.get('m', 0)
    shape = dict(seq_len=entry['seq_len'], batch=entry['batch'], k_unroll=k, grad_iterations=m)
    flops_step = (suite.training_flops_per_token(suite.model_config(fields), entry['seq_len'],
                                                 k or 1, m) * entry['batch'] * entry['seq_len'])
    prior = est.train_compile_s + (reps['warmup'] + reps['repeats']) * flops_step / (
        results['mfu_peak_flops'] * est.mfu)
    if not _admit(ctx, section, f'train {label}', 'train', prior):
      continue
    row, seconds = _timed(lambda: _train_row(ctx, fields, shape, entry.get('remat', False)))
    if row is None:
      continue
    runner = row.pop('runner')
    if label == config.peer.matched_label and matched_runner is None:
      matched_runner = runner  # compiled once: the paired rounds below time this step
    del runner
    section.done('train', prior, seconds)
    row.update(label=label, model=_label(fields), k=k, m=m, seq_len=entry['seq_len'],
               batch=entry['batch'], wall_s=seconds)
    row['mfu'] = row['flops_per_token'] * row['tokens_per_second'] / results['mfu_peak_flops']
    row['mfu_vs_measured_peak'] = (row['flops_per_token'] * row['tokens_per_second']
                                   / results['peak_flops'])
    results['train'].append(row)
    ctx.progress(results)
    log(f"  train {row['label']} K={row['k']} m={row['m'] or 'all'}: "
        f"{row['tokens_per_second']:.0f} tokens/s, MFU {100 * row['mfu']:.1f}% "
        f"({seconds:.0f} s, compilation {row['compile_s']:.0f} s)")
  if not ctx.peer_missing:
    results['train'].append(_paired_training(config, results, matched_runner, reps, log))


def _train_row(ctx, fields, shape, remat):
  """One training row; compiled with remat where XLA's estimate exceeds the device's memory or
  the run fails for memory, skipped with a note where that fails too. The row holds the step's
  `runner` (for the paired peer rounds)."""
  label, notes = _label(fields), ctx.results['notes']
  limit = suite.device_memory_limit()
  while True:
    try:
      runner = None  # the failed attempt's state is freed before the next one allocates its own
      runner = suite.train_step_runner(fields, remat=remat, **shape)
      needed = runner[0].memory.get('needed_bytes')
      if limit and needed and needed > limit and not remat:
        notes.append(f'train {label}: XLA estimates {needed / 2**30:.1f} GiB per step without '
                     f'rematerialisation, over the device\'s {limit / 2**30:.1f} GiB; timed with '
                     'remat=True (each fixed-point iteration recomputed in the backward pass)')
        del runner
        remat = True
        continue
      row = suite.train_throughput(fields, runner=runner, **shape, **ctx.reps)
      break
    except Exception as e:  # pylint: disable=broad-except
      if not suite.is_out_of_memory(e):
        raise
      if remat:
        notes.append(f'train {label}: skipped, out of device memory even with remat=True '
                     f'({" ".join(str(e).split())[:200]})')
        ctx.results['skipped'].append(f'train {label}: out of memory')
        return None
      notes.append(f'train {label}: out of memory without rematerialisation; timed with '
                   'remat=True')
      remat = True
  run = runner[0]
  row.update(remat=bool(remat), compile_s=run.compile_seconds, runner=run,
             temp_gib=run.memory['temp_bytes'] / 2**30 if run.memory else None)
  return row


def _decode_section(ctx, section) -> None:
  config, results, reps, log = ctx.config, ctx.results, ctx.reps, ctx.log
  d, est = config.decode, config.estimates
  results['decode'], results['decode_pairs'] = [], []
  by_key = {}
  for pair in d.pairs:
    for name in pair:
      for batch in d.batches:
        if (name, batch) in by_key:
          continue
        fields = with_dtype({'name': name, 'vocab_size': d.vocab_size,
                              'max_len': d.prompt_len + d.new_tokens + 1}, config.dtype)
        steps = 2 * (reps['warmup'] + reps['repeats']) * (d.new_tokens + 2)
        prior = est.decode_compile_s + steps * est.decode_step_ms / 1e3
        if not _admit(ctx, section, f'decode {name} B={batch}', 'decode', prior):
          by_key[(name, batch)] = None
          continue
        row, seconds = _timed(lambda: suite.decode_latency(
            fields, batch=batch, prompt_len=d.prompt_len, new_tokens=d.new_tokens, **reps))
        section.done('decode', prior, seconds)
        row.update(label=name, model=name, batch=batch, wall_s=seconds,
                   roofline_ms=1e3 * row['bytes_per_step'] / results['bandwidth'],
                   paper_ms=dict(d.paper_ms).get(name) if batch == 1 else None)
        by_key[(name, batch)] = row
        results['decode'].append(row)
        ctx.progress(results)
        log(f"  decode {name} B={batch}: {row['ms_per_token']:.2f} ms/token "
            f"(roofline {row['roofline_ms']:.2f})")
    crt, transformer = pair
    for batch in d.batches:
      paper = dict(d.paper_ms)
      ours = [by_key.get((name, batch)) for name in pair]
      results['decode_pairs'].append({
          'crt': crt, 'transformer': transformer, 'batch': batch,
          'speedup': (_ratio(ours[1]['ms_per_token'], ours[0]['ms_per_token'])
                      if all(ours) else None),
          'paper_speedup': paper[transformer] / paper[crt]
                           if batch == 1 and crt in paper and transformer in paper else None})
  if d.matched_model:
    for batch in d.batches:
      fields = with_dtype(d.matched_model, config.dtype)
      row = suite.decode_latency(fields, batch=batch, prompt_len=d.prompt_len,
                                 new_tokens=d.new_tokens, **reps)
      row.update(label=_label(fields) + ' (peer shape)', model=_label(fields), batch=batch,
                 roofline_ms=1e3 * row['bytes_per_step'] / results['bandwidth'])
      if not ctx.peer_missing:
        p = config.peer
        theirs = peer.decode_latency(width=p.width, depth=p.depth, heads=p.heads,
                                     vocab=p.vocab, batch=batch, prompt_len=d.prompt_len,
                                     new_tokens=d.new_tokens, dtype=config.dtype, **reps)
        row['vs_peer'] = _ratio(theirs['ms_per_token'], row['ms_per_token'])
        results['decode'].append(row)
        results['decode'].append({'label': 'HF GPT-2 generate (peer shape)', 'model': 'peer',
                                  'batch': batch, 'params': None,
                                  'ms_per_token': theirs['ms_per_token'],
                                  'roofline_ms': row['roofline_ms']})
      else:
        results['decode'].append(row)
      log(f"  decode {row['label']} B={batch}: {row['ms_per_token']:.2f} ms/token"
          + (f", peer ÷ ours {row['vs_peer']:.2f}" if 'vs_peer' in row else ''))


def _generate_section(ctx, section) -> None:
  ctx.results['generate'] = [_generate_row(ctx.config, batch, ctx.peer_missing, ctx.reps, ctx.log)
                             for batch in ctx.config.generate.batches]


def _prefill_section(ctx, section) -> None:
  p = ctx.config.prefill
  fields = with_dtype(p.model, ctx.config.dtype)
  row = suite.prefill_comparison(fields, prompt_len=p.prompt_len, tolerance=p.tolerance,
                                 **ctx.reps)
  row.update(label=_label(fields), model=_label(fields), prompt_len=p.prompt_len,
             tolerance=p.tolerance)
  ctx.results['prefill'] = row
  ctx.log(f"  prefill: sequential {row['sequential_ms']:.0f} ms, parallel "
          f"{row['parallel_ms']:.0f} ms in {row['iterations']} passes, max |dlogit| "
          f"{row['max_abs_logit_diff']:.2e}")


def _chunked_section(ctx, section) -> None:
  ctx.results['chunked'] = _chunked_rows(ctx.config, ctx.reps, ctx.log)


def _ttft_section(ctx, section) -> None:
  """Time to the first token: each model, each prompt length, each prefill method of its kind.
  Model by model in the order listed (the paper's first pair first), each at every prompt
  length, so a budget cuts the models listed last."""
  config, results, log = ctx.config, ctx.results, ctx.log
  t, est = config.ttft, config.estimates
  reps = {'warmup': t.warmup, 'repeats': t.repeats}
  runs = t.warmup + t.repeats
  results['ttft'] = []
  step_ms = {r['model']: r['ms_per_token'] for r in results.get('decode', [])
             if r.get('batch') == 1 and r.get('model')}
  for name in t.models:
    for prompt_len in t.prompt_lens:
      fields = with_dtype({'name': name, 'vocab_size': t.vocab_size,
                            'max_len': prompt_len + 1}, config.dtype)
      cfg = suite.model_config(fields)
      step_s = step_ms.get(name, est.decode_step_ms) / 1e3
      # A pass over n positions: at least a decode step, at most its FLOPs at the prior MFU.
      pass_s = lambda n: max(step_s, 2 * n * models.flops_per_token(cfg)
                             / (results['mfu_peak_flops'] * est.mfu))
      chunk = min(t.chunk, prompt_len)
      priors = {'scan': prompt_len * step_s,
                'chunked': math.ceil(prompt_len / chunk) * t.passes * pass_s(chunk),
                'parallel': (1 if cfg.kind == 'transformer' else t.passes) * pass_s(prompt_len)}
      probe, reference = None, None
      for method in t.methods[cfg.kind]:
        label = f'ttft {name} T0={prompt_len} {method}'
        prior = est.ttft_compile_s + runs * priors[method]
        if not _admit(ctx, section, label, method, prior):
          continue
        start = time.perf_counter()
        probe = probe or suite.FirstToken(fields, prompt_len=prompt_len)
        row = probe.measure(method, chunk=chunk, passes=t.passes, tolerance=t.tolerance, **reps)
        seconds = time.perf_counter() - start
        section.done(method, prior, seconds)
        last = row.pop('last_logits')
        if method == 'scan':
          reference = (row['first_token'], last)
        if reference is not None and method != 'scan':
          row['max_abs_last_logit_diff'] = float(np.max(np.abs(
              np.asarray(last, np.float32) - np.asarray(reference[1], np.float32))))
          row['same_first_token'] = row['first_token'] == reference[0]
        row.update(model=name, kind=cfg.kind, prompt_len=prompt_len, method=method,
                   chunk=chunk if method == 'chunked' else None,
                   tolerance=t.tolerance if method != 'scan' and cfg.kind == 'context_ready'
                   else None, max_passes=t.passes if method == 'chunked' else None,
                   wall_s=seconds)
        results['ttft'].append(row)
        ctx.progress(results)
        log(f"  ttft {name} T0={prompt_len} {method}: {row['ms']:.1f} ms "
            f"({row['sequential_passes']} sequential passes, {seconds:.0f} s)")


def _scaling_section(ctx, section) -> None:
  s, dtype, reps = ctx.config.scaling, ctx.config.dtype, ctx.reps
  results = ctx.results
  results['scaling'] = {'batch': s.batch}
  train_fields = with_dtype(s.train_model, dtype)
  results['scaling']['train_label'] = _label(train_fields)
  results['scaling']['train'] = suite.train_scaling(
      train_fields, batch=s.batch, seq_lens=list(s.seq_lens), k_values=list(s.k_values), **reps)
  decode_fields = with_dtype(s.decode_model, dtype)
  results['scaling']['decode_label'] = _label(decode_fields)
  results['scaling']['decode'] = suite.decode_scaling(
      decode_fields, contexts=list(s.contexts), new_tokens=s.new_tokens, **reps)
  ctx.log(f"  scaling: K^{results['scaling']['train']['k_exponent']:.2f}, "
          f"T^{results['scaling']['train']['t_exponent']:.2f}, "
          f"decode context^{results['scaling']['decode']['exponent']:.2f}")


_SECTIONS = {'train': _train_section, 'decode': _decode_section, 'generate': _generate_section,
             'prefill': _prefill_section, 'chunked': _chunked_section, 'ttft': _ttft_section,
             'scaling': _scaling_section}


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
  row['mfu'] = (matched['flops_per_token'] * row['tokens_per_second']
                / results['mfu_peak_flops'] if matched else 0.0)
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
  fields = with_dtype(g.model, config.dtype)
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


def _chunked_rows(config, reps, log) -> list[dict]:
  """Chunked prefill vs the scan for each size (random weights), then the trained checkpoint."""
  ch = config.chunked
  grid = {'chunks': list(ch.chunks), 'passes': list(ch.passes), 'tolerance': ch.tolerance,
          'tolerance_passes': ch.tolerance_passes}
  entries = []
  for name in ch.sizes:
    fields = with_dtype({'name': name, 'vocab_size': ch.vocab_size,
                          'max_len': ch.prompt_len + 1}, config.dtype)
    entries.append((name, 'random', fields, None, ch.prompt_len))
  if ch.checkpoint:
    fields, params = suite.load_checkpoint(ch.checkpoint)
    fields = with_dtype(fields, config.dtype)
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
