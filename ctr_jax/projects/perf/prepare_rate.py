"""How fast OpenWebText and Wikipedia are prepared (read + tokenised into token caches), measured
on synthetic corpora in the real layouts, and the projected hours for the real corpora per core
count: docs/prepare_rate.json and docs/prepare_rate.md (issue 40 item 3).

  python -m ctr_jax.projects.perf.prepare_rate                 # full size (~20-60 s a run)
  python -m ctr_jax.projects.perf.prepare_rate --report_only   # projection + page from the json

The corpora are written to a temporary directory: OpenWebText as the public `openwebtext.tar.xz`
(a tar of per-subset `.xz` tars of `.txt` documents) and as the Hugging Face mirror's
`subsets/urlsf_subsetNN.tar` (plain tars of those `.xz` tars); Wikipedia as a whole
`enwiki-*-pages-articles-multistream.xml.bz2` dump (bz2 streams of 100 pages) and as numbered
`pages-articles<k>.xml-p<first>p<last>.bz2` parts. Their text is English-like: a word-bigram chain
over the embedded King James Bible (so word frequencies and compressibility are those of English
prose, without the verbatim repeats that would flatter xz); Wikipedia pages carry the markup the
cleaner removes (templates, infoboxes, references, links, headings, categories, redirects).

One byte-level BPE of `--vocab_size` tokens (32,000, the paper configs' vocabulary; no config
names a Wikipedia vocabulary, so it gets the same) is trained once and shared. Each measurement
is `parallel.tokenize_corpus` on the layout's units, exactly what `pipeline.load` runs after the
tokenizer, for each of `--workers`. `input_mb` is the layout's files on disk (compressed), the
measure the published corpus sizes are given in. The outer read alone (the main process draining
`iter_units`: decompressing `openwebtext.tar.xz`, cutting a whole Wikipedia dump into chunks) is
timed too: it is the share that does not scale with workers.

Projection: hours(cores) = corpus size / (one worker's rate x cores x efficiency), efficiency =
the 2-worker rate / (2 x the 1-worker rate), 1 at one core. OpenWebText is projected from text
MB/s (its size is published as text), Wikipedia from input MB/s (its size is the bz2 dump's).
"""

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

from ctr_jax.data import openwebtext, parallel, wikipedia
from ctr_jax.data import tokenizer as tokenizer_lib
from ctr_jax.projects import paths
from ctr_jax.projects.perf import synthetic_corpora
from ctr_jax.reporting import doc_sections, machine

# Approximate published sizes of the real corpora.
OWT_TEXT_BYTES = openwebtext.CORPUS_TEXT_BYTES  # 38 GB of text (the OpenWebText corpus page)
OWT_DOCUMENTS = 8_013_769  # the same page
OWT_ARCHIVE_BYTES = 12 * 10**9  # openwebtext.tar.xz
WIKI_BZ2_BYTES = 22 * 10**9  # enwiki-*-pages-articles-multistream.xml.bz2 (dumps.wikimedia.org)
SIZES_SOURCE = (
    'Corpus sizes are approximate published figures: OpenWebText is about 38 GB of text in '
    f'~{OWT_DOCUMENTS / 1e6:.1f}M documents, its `openwebtext.tar.xz` about '
    f'{OWT_ARCHIVE_BYTES / 1e9:.0f} GB ({openwebtext.SOURCE}); the English Wikipedia '
    f'`pages-articles-multistream.xml.bz2` dump is about {WIKI_BZ2_BYTES / 1e9:.0f} GB of bz2 '
    f'({wikipedia.SOURCE}, recent dumps).')
CORES = (1, 2, 4, 8, 16, 32, 64)
VOCAB_SIZE = 32_000
LAYOUTS = {'openwebtext': ('archive', 'hf_mirror'), 'wikipedia': ('whole_dump', 'parts')}
MODULES = {'openwebtext': openwebtext, 'wikipedia': wikipedia}
# What each corpus is projected from: its published size is of text (OWT) or of bz2 (Wikipedia).
BASIS = {'openwebtext': ('text', OWT_TEXT_BYTES), 'wikipedia': ('input', WIKI_BZ2_BYTES)}
BEGIN, END = '<!-- prepare_rate: begin (generated) -->', '<!-- prepare_rate: end -->'


# ------------------------------------------------------------------------------------------------
# Measurements.
# ------------------------------------------------------------------------------------------------


def _disk_bytes(directory: str) -> int:
  return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(directory) for f in fs)


def _load() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def measure(corpus: str, layout: str, manual_dir: str, tok: tokenizer_lib.Tokenizer,
            workers: int, scratch: str, progress: bool = True) -> dict:
  """One preparation of a corpus (what `pipeline.load` runs after the tokenizer): a table row."""
  module = MODULES[corpus]
  out = tempfile.mkdtemp(dir=scratch, prefix=f'{corpus}_{layout}_{workers}-')
  load_start = _load()
  start = time.perf_counter()
  stats = parallel.tokenize_corpus(
      module.iter_units(manual_dir), module.unit_documents, module.unit_size,
      module.VALIDATION_FRACTION, tok, os.path.join(out, 'train.npy'),
      os.path.join(out, 'validation.npy'), workers=workers, label=f'{corpus} ({layout})',
      progress=progress, report_every_s=15.0)
  seconds = time.perf_counter() - start
  shutil.rmtree(out, ignore_errors=True)
  text_mb, input_mb = stats['text_bytes'] / 1e6, _disk_bytes(manual_dir) / 1e6
  return {'corpus': corpus, 'layout': layout, 'workers': workers, 'text_mb': text_mb,
          'input_mb': input_mb, 'seconds': seconds, 'text_mb_per_s': text_mb / seconds,
          'input_mb_per_s': input_mb / seconds, 'documents': stats['documents'],
          'tokens': stats['train_tokens'] + stats['validation_tokens'], 'units': stats['units'],
          'load_average_start': load_start, 'load_average_end': _load()}


def outer_read(corpus: str, layout: str, manual_dir: str) -> dict:
  """The main process's share: draining `iter_units` (the outer archive read, nothing parsed)."""
  module = MODULES[corpus]
  start = time.perf_counter()
  units = sum(1 for _ in module.iter_units(manual_dir))
  return {'corpus': corpus, 'layout': layout, 'units': units,
          'seconds': time.perf_counter() - start}


def project(rows: list[dict], outer: list[dict], cores=CORES) -> list[dict]:
  """Projected hours for the real corpora per core count, from the measured rows."""
  projections = []
  for corpus, layouts in LAYOUTS.items():
    basis, corpus_bytes = BASIS[corpus]
    for layout in layouts:
      by_workers = {r['workers']: r for r in rows if r['corpus'] == corpus and r['layout'] == layout}
      if 1 not in by_workers:
        continue
      one = by_workers[1][f'{basis}_mb_per_s']
      efficiency = (by_workers[2][f'{basis}_mb_per_s'] / (2 * one)) if 2 in by_workers else 1.0
      hours = {str(c): corpus_bytes / 1e6 / (one * c * (efficiency if c > 1 else 1.0)) / 3600
               for c in cores}
      linear = {str(c): corpus_bytes / 1e6 / (one * c) / 3600 for c in cores}
      read = next((o for o in outer if o['corpus'] == corpus and o['layout'] == layout), None)
      floor = None
      if read is not None and read['seconds'] > 0:
        # The outer read's rate, in the basis's MB, bounds any number of workers.
        ceiling = by_workers[1][f'{basis}_mb'] / read['seconds']
        floor = corpus_bytes / 1e6 / ceiling / 3600
      projections.append({'corpus': corpus, 'layout': layout, 'basis': basis,
                          'corpus_bytes': corpus_bytes, 'one_worker_mb_per_s': one,
                          'two_worker_efficiency': efficiency, 'hours': hours,
                          'hours_if_linear': linear,
                          'outer_read_floor_hours': floor})
  return projections


def train_tokenizer(directory: str, manual_dir: str, vocab_size: int,
                    max_train_bytes: int) -> tokenizer_lib.Tokenizer:
  """The shared BPE, trained once on the synthetic OpenWebText's training documents."""
  texts = (text for unit in openwebtext.iter_units(manual_dir)
           for _, text in openwebtext.unit_documents(unit))
  return tokenizer_lib.get_tokenizer('prepare_rate', vocab_size, directory, texts=texts,
                                     max_train_bytes=max_train_bytes)


def run(owt_text_mb: float, wiki_text_mb: float, workers=(1, 2), vocab_size: int = VOCAB_SIZE,
        tokenizer_train_mb: float = 20.0, work_dir: str | None = None, command: str = '',
        progress: bool = True, wiki_parts: int = 8) -> dict:
  """Writes the corpora, trains the tokenizer, measures every corpus, layout and worker count."""
  load_start = _load()
  root = tempfile.mkdtemp(dir=work_dir, prefix='prepare_rate-')
  try:
    bigram = synthetic_corpora.Bigram()
    started = time.perf_counter()
    owt = synthetic_corpora.write_openwebtext(os.path.join(root, 'openwebtext'), owt_text_mb,
                                              bigram)
    wiki = synthetic_corpora.write_wikipedia(os.path.join(root, 'wikipedia'), wiki_text_mb,
                                             bigram, parts=wiki_parts)
    written_s = time.perf_counter() - started
    tok = train_tokenizer(os.path.join(root, 'tok'), owt['layouts']['archive'], vocab_size,
                          int(tokenizer_train_mb * 1e6))
    corpora = {'openwebtext': owt, 'wikipedia': wiki}
    rows, outer = [], []
    for corpus, layouts in LAYOUTS.items():
      for layout in layouts:
        manual_dir = corpora[corpus]['layouts'][layout]
        outer.append(outer_read(corpus, layout, manual_dir))
        for w in workers:
          rows.append(measure(corpus, layout, manual_dir, tok, w, root, progress))
          if progress:
            r = rows[-1]
            print(f"prepare_rate: {corpus} {layout} {w} worker(s): {r['text_mb_per_s']:.2f} MB/s "
                  f"of text, {r['input_mb_per_s']:.2f} MB/s of input ({r['seconds']:.1f} s)",
                  flush=True)
    synthetic = {c: {k: v for k, v in d.items() if k != 'layouts'} | {
        'input_mb': {layout: _disk_bytes(path) / 1e6 for layout, path in d['layouts'].items()}}
        for c, d in corpora.items()}
  finally:
    shutil.rmtree(root, ignore_errors=True)
  for o in outer:
    text = next(r for r in rows if r['corpus'] == o['corpus'] and r['layout'] == o['layout'])
    o['text_mb_per_s'] = text['text_mb'] / max(o['seconds'], 1e-9)
    o['input_mb_per_s'] = text['input_mb'] / max(o['seconds'], 1e-9)
  info = machine.describe()
  return {
      'command': command,
      'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'),
      'machine': info, 'machine_summary': machine.summary_line(info),
      'cores_usable': len(os.sched_getaffinity(0)),
      'shared_machine': ('The machine was shared: another long experiment (pinned to one of the '
                         'two cores) and other jobs ran during the measurement; see the load '
                         'averages (1, 5, 15 min), recorded at the start and end of the run and '
                         'of each row.'),
      'load_average_start': load_start, 'load_average_end': _load(),
      'vocab_size': vocab_size, 'tokenizer_train_mb': tokenizer_train_mb,
      'corpora_written_seconds': written_s, 'synthetic': synthetic,
      'corpus_sizes': {'openwebtext_text_bytes': OWT_TEXT_BYTES,
                       'openwebtext_documents': OWT_DOCUMENTS,
                       'openwebtext_archive_bytes': OWT_ARCHIVE_BYTES,
                       'wikipedia_bz2_bytes': WIKI_BZ2_BYTES, 'source': SIZES_SOURCE},
      'rows': rows, 'outer_read': outer, 'projection': project(rows, outer),
  }


# ------------------------------------------------------------------------------------------------
# The page.
# ------------------------------------------------------------------------------------------------


def _hours(h: float) -> str:
  if h < 0.1:
    return f'{h:.3f}'
  return f'{h:,.1f}' if h < 100 else f'{h:,.0f}'


def _ratios(result: dict) -> str:
  """How the synthetic corpora's text per input byte compares with the real ones'."""
  text = {r['corpus']: r['text_mb'] for r in result['rows']}
  syn = result['synthetic']
  owt = text['openwebtext'] / syn['openwebtext']['input_mb']['archive']
  wiki = text['wikipedia'] / syn['wikipedia']['input_mb']['whole_dump']
  return (f'Text per input byte: the synthetic `openwebtext.tar.xz` holds {owt:.1f} bytes of text '
          f'per byte (the real one {OWT_TEXT_BYTES / OWT_ARCHIVE_BYTES:.1f}), so its text MB/s is '
          'the figure to project from. The synthetic Wikipedia dump holds '
          f'{wiki:.1f} bytes of cleaned article text per byte of bz2; the real dump carries far '
          'more markup, redirects and non-article pages per byte of article text, so where, as '
          'here, tokenising the text is most of the cost, its input MB/s is likely higher and the '
          'Wikipedia hours above are on the long side.')


def render(result: dict) -> str:
  """docs/prepare_rate.md's generated section, from the json."""
  proj = {(p['corpus'], p['layout']): p for p in result['projection']}
  lines = []
  owt = proj.get(('openwebtext', 'archive'))
  if owt:
    hours = owt['hours']
    parts = proj.get(('wikipedia', 'parts'))
    wiki = (f"; Wikipedia (bz2 parts) {_hours(parts['hours']['1'])} h on 1 core and "
            f"{_hours(parts['hours']['8'])} h on 8" if parts else '')
    lines.append(
        f"**Verdict:** one worker prepares OpenWebText at {owt['one_worker_mb_per_s']:.2f} MB/s "
        f"of text here (`openwebtext.tar.xz`), so the whole corpus (~38 GB of text) is projected "
        f"to take ~{_hours(hours['1'])} h on 1 core, ~{_hours(hours['8'])} h on 8 and "
        f"~{_hours(hours['64'])} h on 64{wiki} (measured on 1 and 2 cores of a shared machine, "
        f"2-worker efficiency {owt['two_worker_efficiency']:.2f}; beyond 2 cores a projection)"
        + ('. Here 2 workers were slower than 1: the second core was busy with another job, so '
           'the efficiency measures that contention, not scaling; the efficiency-1 table below is '
           'the idle-machine bound.' if owt['two_worker_efficiency'] < 0.5 else '.'))
  lines += ['', f"Measured {result['date']} on {result['machine_summary']}; "
            f"{result['cores_usable']} usable cores. {result['shared_machine']} Load average at "
            f"the start {result['load_average_start']}, at the end {result['load_average_end']}.",
            '', f"Command: `{result['command']}`; the rows and projections below are generated "
            'from [prepare_rate.json](prepare_rate.json) (`--report_only` recomputes the '
            'projection from its rows and rewrites this page'
            + (f": last `{result['projection_command']}`" if 'projection_command' in result
               else '') + ').', '']
  syn = result['synthetic']
  lines += [
      '## Measured', '',
      f"Synthetic corpora in the real layouts (English-like text: a word-bigram chain over the "
      f"KJV), BPE of V = {result['vocab_size']:,}: OpenWebText {syn['openwebtext']['documents']:,} "
      f"documents in {syn['openwebtext']['subsets']} subsets, Wikipedia "
      f"{syn['wikipedia']['documents']:,} articles ({syn['wikipedia']['pages']:,} pages with "
      f"redirects and other namespaces, {syn['wikipedia']['parts']} parts). `input MB` is the "
      'layout\'s files on disk (compressed); `text MB` the documents\' text (for Wikipedia after '
      'cleaning). Each row is one `parallel.tokenize_corpus` pass, what `pipeline.load` runs '
      'after the tokenizer.', '',
      '| corpus | layout | workers | text MB | input MB | seconds | text MB/s | input MB/s | '
      'load avg (start -> end) |',
      '|---|---|---:|---:|---:|---:|---:|---:|---|']
  for r in result['rows']:
    lines.append(f"| {r['corpus']} | {r['layout']} | {r['workers']} | {r['text_mb']:.1f} | "
                 f"{r['input_mb']:.1f} | {r['seconds']:.1f} | {r['text_mb_per_s']:.2f} | "
                 f"{r['input_mb_per_s']:.2f} | {r['load_average_start'][0]} -> "
                 f"{r['load_average_end'][0]} |")
  lines += ['', 'The main process\'s share, timed alone (draining `iter_units`: reading the outer '
            'archive and handing out units, nothing parsed or tokenised):', '',
            '| corpus | layout | units | seconds | as text MB/s | as input MB/s |',
            '|---|---|---:|---:|---:|---:|']
  for o in result['outer_read']:
    lines.append(f"| {o['corpus']} | {o['layout']} | {o['units']} | {o['seconds']:.2f} | "
                 f"{o['text_mb_per_s']:,.1f} | {o['input_mb_per_s']:,.1f} |")
  cores = list(next(iter(result['projection']))['hours']) if result['projection'] else []
  lines += [
      '', '## Projected hours for the real corpora', '', result['corpus_sizes']['source'], '',
      'hours = corpus size / (one worker\'s rate x cores x the measured 2-worker efficiency), '
      'the efficiency being the 2-worker rate / (2 x the 1-worker rate) (1 at one core). '
      'OpenWebText is projected from text MB/s (38 GB of text), Wikipedia from input MB/s (22 GB '
      'of bz2). Only 1 and 2 cores were measured: beyond 2 cores this is a projection, which '
      'assumes the efficiency measured on 2 cores holds at any count. It cannot hold without '
      'bound: the main process reads the outer archive (`openwebtext.tar.xz`, a whole Wikipedia '
      'dump) alone, so no number of workers beats its rate; the last column is that floor '
      '(corpus size / the outer read\'s rate above), and a projection below it is marked *.', '',
      '| corpus | layout | basis | 1-worker MB/s | 2-worker efficiency | '
      + ' | '.join(f'h at {c} core{"s" if int(c) > 1 else ""}' for c in cores) + ' | outer-read floor (h) |',
      '|---|---|---|---:|---:|' + '---:|' * len(cores) + '---:|']
  for p in result['projection']:
    floor = p['outer_read_floor_hours']
    cells = [_hours(h) + ('*' if floor and h < floor else '') for h in p['hours'].values()]
    lines.append(f"| {p['corpus']} | {p['layout']} | {p['basis']} | "
                 f"{p['one_worker_mb_per_s']:.2f} | {p['two_worker_efficiency']:.2f} | "
                 + ' | '.join(cells) + f" | {_hours(floor) if floor else '-'} |")
  lines += ['', 'The same if every core added one worker\'s rate (efficiency 1: an idle machine\'s '
            'best case, still bounded by the floor):', '',
            '| corpus | layout | ' + ' | '.join(f'h at {c}' for c in cores) + ' |',
            '|---|---|' + '---:|' * len(cores)]
  for p in result['projection']:
    floor = p['outer_read_floor_hours']
    cells = [_hours(h) + ('*' if floor and h < floor else '') for h in p['hours_if_linear'].values()]
    lines.append(f"| {p['corpus']} | {p['layout']} | " + ' | '.join(cells) + ' |')
  lines += ['', 'The synthetic files were in the page cache when read (a real disk reading the '
            '~12-22 GB at 100+ MB/s is not the bottleneck at these rates); the 2-worker rows ran '
            'three processes (the main one and two workers) on two cores beside the other jobs, '
            'so their efficiency, and every projection beyond one core, is pessimistic for an '
            'idle machine.', '', _ratios(result)]
  return '\n'.join(lines)


def write_page(result: dict, path: str) -> str:
  return doc_sections.replace_between(
      path, BEGIN, END, render(result),
      new_file='# Preparing OpenWebText and Wikipedia: measured rates and projected hours\n\n'
      'Generated by `python -m ctr_jax.projects.perf.prepare_rate` (issue 40 item 3): see its '
      'docstring for how the synthetic corpora are made.')


def main(argv: list[str] | None = None) -> dict:
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--owt_text_mb', type=float, default=60.0,
                      help='MB of synthetic OpenWebText text')
  parser.add_argument('--wiki_text_mb', type=float, default=40.0,
                      help='MB of synthetic Wikipedia article text (before markup)')
  parser.add_argument('--workers', type=int, nargs='+', default=[1, 2])
  parser.add_argument('--vocab_size', type=int, default=VOCAB_SIZE)
  parser.add_argument('--tokenizer_train_mb', type=float, default=20.0)
  parser.add_argument('--wiki_parts', type=int, default=8)
  parser.add_argument('--work_dir', default=None, help='for the corpora (default: $TMPDIR)')
  parser.add_argument('--out', default=os.path.join(paths.REPO_ROOT, 'docs', 'prepare_rate.json'))
  parser.add_argument('--md', default=os.path.join(paths.REPO_ROOT, 'docs', 'prepare_rate.md'))
  parser.add_argument('--report_only', action='store_true', help='the page from the json')
  args = parser.parse_args(argv)
  if args.report_only:  # the projection again from the json's measured rows (arithmetic only)
    with open(args.out) as f:
      result = json.load(f)
    result['projection'] = project(result['rows'], result['outer_read'])
    result['projection_command'] = ' '.join(
        ['python -m ctr_jax.projects.perf.prepare_rate', *argv])
  else:
    result = run(args.owt_text_mb, args.wiki_text_mb, tuple(args.workers), args.vocab_size,
                 args.tokenizer_train_mb, args.work_dir,
                 command=' '.join(['python -m ctr_jax.projects.perf.prepare_rate', *argv]),
                 wiki_parts=args.wiki_parts)
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=2)
    f.write('\n')
  write_page(result, args.md)
  print(f'written to {args.out} and {args.md}')
  return result


if __name__ == '__main__':
  main()
