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
import bz2
import datetime
import io
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import time
from xml.sax import saxutils

import numpy as np

from ctr_jax.data import kjv, openwebtext, parallel, wikipedia
from ctr_jax.data import tokenizer as tokenizer_lib
from ctr_jax.projects import paths
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
DOCS_PER_SUBSET = 390  # ~8.0M documents in ~20,600 subset archives
PAGES_PER_STREAM = 100  # a multistream dump's bz2 streams
DUMP_DATE = '20240101'
_NS = 'http://www.mediawiki.org/xml/export-0.11/'
BEGIN, END = '<!-- prepare_rate: begin (generated) -->', '<!-- prepare_rate: end -->'


# ------------------------------------------------------------------------------------------------
# English-like text: a word-bigram chain over the KJV.
# ------------------------------------------------------------------------------------------------


class Bigram:
  """Samples word sequences whose consecutive pairs occur in the KJV."""

  def __init__(self):
    words = ' '.join(text for _, _, text in kjv.read_chapters()).split()
    self.vocab, ids = np.unique(np.array(words, dtype=object), return_inverse=True)
    self.ids = ids.astype(np.int64)
    order = np.argsort(self.ids[:-1], kind='stable')
    self.successors = self.ids[1:][order]  # the word after each occurrence, grouped by word
    self.counts = np.bincount(self.ids[:-1], minlength=len(self.vocab))
    self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])

  def chains(self, rng: np.random.Generator, count: int, length: int) -> np.ndarray:
    """[count, length] word ids, each row a chain from a random position of the corpus."""
    out = np.empty((count, length), np.int64)
    out[:, 0] = self.ids[rng.integers(0, len(self.ids), count)]
    for t in range(1, length):
      current = out[:, t - 1]
      counts = self.counts[current]
      pick = (rng.random(count) * np.maximum(counts, 1)).astype(np.int64)
      nxt = self.successors[np.minimum(self.starts[current] + pick, len(self.successors) - 1)]
      jump = self.ids[rng.integers(0, len(self.ids), count)]
      out[:, t] = np.where(counts > 0, nxt, jump)
    return out

  def word_lists(self, rng: np.random.Generator, text_bytes: int, mean_words: int,
                 batch: int = 512) -> list[np.ndarray]:
    """Documents (object arrays of words) of ~`mean_words` words, until ~`text_bytes` of text."""
    docs, total = [], 0
    while total < text_bytes:
      lengths = rng.integers(mean_words // 4, mean_words * 7 // 4 + 1, batch)
      rows = self.chains(rng, batch, int(lengths.max()))
      for row, n in zip(rows, lengths):
        words = self.vocab[row[:n]]
        docs.append(words)
        total += sum(map(len, words)) + len(words)
        if total >= text_bytes:
          break
    return docs


def _prose(words: np.ndarray, paragraph_words: int = 90) -> str:
  return '\n\n'.join(' '.join(words[i:i + paragraph_words])
                     for i in range(0, len(words), paragraph_words))


def _tar(members: dict, mode: str = 'w') -> bytes:
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode=mode) as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      info.mtime = 1_556_000_000
      tar.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


# ------------------------------------------------------------------------------------------------
# The corpora in their real layouts.
# ------------------------------------------------------------------------------------------------


def write_openwebtext(root: str, text_mb: float, bigram: Bigram, seed: int = 0) -> dict:
  """`root/archive/openwebtext.tar.xz` and `root/hf_mirror/subsets/urlsf_subsetNN.tar`; returns
  {layout: manual_dir} and the corpus's documents and text bytes."""
  rng = np.random.default_rng(seed)
  docs = bigram.word_lists(rng, int(text_mb * 1e6), mean_words=850)  # ~4.7 KB, as OWT's
  subsets, text_bytes = {}, 0
  for s, start in enumerate(range(0, len(docs), DOCS_PER_SUBSET)):
    members = {}
    for k, words in enumerate(docs[start:start + DOCS_PER_SUBSET]):
      data = _prose(words).encode()
      text_bytes += len(data)
      members[f'{start + k:07d}-{s:04d}{k:04d}.txt'] = data
    subsets[f'openwebtext/urlsf_subset00-{s + 1}_data.xz'] = _tar(members, 'w:xz')
  archive = os.path.join(root, 'archive')
  os.makedirs(archive)
  with open(os.path.join(archive, openwebtext.ARCHIVE_NAME), 'wb') as f:
    f.write(_tar(subsets, 'w:xz'))
  mirror = os.path.join(root, 'hf_mirror')
  os.makedirs(os.path.join(mirror, 'subsets'))
  names = sorted(subsets, key=lambda n: int(n.split('-')[1].split('_')[0]))
  per_tar = max(1, math.ceil(len(names) / 4))  # the mirror has 21 tars of ~1,000 subsets
  for t, start in enumerate(range(0, len(names), per_tar)):
    with open(os.path.join(mirror, 'subsets', f'urlsf_subset{t:02d}.tar'), 'wb') as f:
      f.write(_tar({n: subsets[n] for n in names[start:start + per_tar]}))
  return {'layouts': {'archive': archive, 'hf_mirror': mirror}, 'documents': len(docs),
          'subsets': len(subsets), 'text_bytes': text_bytes}


def _wikitext(title: str, words: np.ndarray, rng: np.random.Generator, index: int) -> str:
  """An article: infobox, bold title, linked and referenced prose in sections, a tail of
  references and categories (the cleaner keeps only the prose)."""
  words = words.copy()
  n = len(words)
  links = rng.random(n) < 0.08
  words[links] = '[[' + words[links] + ']]'
  piped = np.flatnonzero(rng.random(n) < 0.02)
  words[piped] = '[[' + words[piped] + ' (disambiguation)|' + words[piped] + ']]'
  italic = np.flatnonzero(rng.random(n) < 0.01)
  words[italic] = "''" + words[italic] + "''"
  refs = np.flatnonzero(rng.random(n) < 0.04)
  words[refs] = words[refs] + (f'<ref name="r{index}">{{{{cite web |url=https://example.org/'
                               f'{index}/page.html |title=' + words[refs] + ' |last=Smith '
                               '|first=John |website=Example News |date=3 May 2019 '
                               '|access-date=1 January 2024}}</ref>')
  sections = []
  for s, start in enumerate(range(0, n, 300)):
    body = _prose(words[start:start + 300])
    table = ''.join(f'|-\n| {words[(start + r) % n]} || {index * r % 997} || {r * 13 % 101}%\n'
                    for r in range(8))
    table = f'{{| class="wikitable sortable"\n! Name !! Count !! Share\n{table}|}}\n'
    sections.append(body if s == 0 else f'== {" ".join(words[start:start + 2])} ==\n{table}{body}')
  fields = ''.join(f'| {name} = {words[k % n]} {index * (k + 3) % 9973}\n' for k, name in
                   enumerate(('name', 'native_name', 'settlement_type', 'image_skyline',
                              'image_caption', 'subdivision_type', 'subdivision_name',
                              'established_title', 'established_date', 'area_total_km2',
                              'population_total', 'population_as_of', 'timezone', 'website')))
  infobox = (f'{{{{Short description|{title}}}}}\n{{{{Use dmy dates|date=January 2024}}}}\n'
             f'{{{{Infobox settlement\n{fields}}}}}\n')
  tail = (f'\n\n== See also ==\n* [[{words[0]}]]\n\n== References ==\n{{{{Reflist}}}}\n\n'
          f'{{{{Authority control}}}}\n[[Category:{title.split()[0]}]]\n[[Category:Places]]')
  return f"{infobox}'''{title}''' " + '\n\n'.join(sections) + tail


def _page(page_id: int, title: str, text: str, ns: int = 0, redirect: str = '') -> str:
  redirect_tag = f'    <redirect title="{saxutils.escape(redirect)}" />\n' if redirect else ''
  body = saxutils.escape(text)
  return (f'  <page>\n    <title>{saxutils.escape(title)}</title>\n    <ns>{ns}</ns>\n'
          f'    <id>{page_id}</id>\n{redirect_tag}    <revision>\n      <id>{page_id * 7}</id>\n'
          f'      <timestamp>2024-01-01T00:00:00Z</timestamp>\n      <contributor>\n'
          f'        <username>Editor</username>\n        <id>1</id>\n      </contributor>\n'
          f'      <model>wikitext</model>\n      <format>text/x-wiki</format>\n'
          f'      <text bytes="{len(text.encode())}" xml:space="preserve">{body}</text>\n'
          f'      <sha1>0</sha1>\n    </revision>\n  </page>\n')


def _dump_head() -> str:
  return (f'<mediawiki xmlns="{_NS}" version="0.11" xml:lang="en">\n  <siteinfo>\n'
          '    <sitename>Wikipedia</sitename>\n    <dbname>enwiki</dbname>\n  </siteinfo>\n')


def write_wikipedia(root: str, text_mb: float, bigram: Bigram, parts: int = 8,
                    seed: int = 1) -> dict:
  """`root/whole_dump/enwiki-*-pages-articles-multistream.xml.bz2` and the same pages as
  `root/parts/enwiki-*-pages-articles<k>.xml-p<first>p<last>.bz2`."""
  rng = np.random.default_rng(seed)
  docs = bigram.word_lists(rng, int(text_mb * 1e6), mean_words=600)
  pages, page_id = [], 0
  for index, words in enumerate(docs):
    title = f'{words[0].strip(".,;:").capitalize()} {words[1].strip(".,;:")} {index}'
    page_id += 1
    pages.append((page_id, _page(page_id, title, _wikitext(title, words, rng, index))))
    if index % 3 == 0:  # about a third of namespace-0 pages are redirects
      page_id += 1
      pages.append((page_id, _page(page_id, f'{title} (redirect)', f'#REDIRECT [[{title}]]',
                                   redirect=title)))
    if index % 20 == 0:  # talk / project pages are skipped
      page_id += 1
      pages.append((page_id, _page(page_id, f'Wikipedia:{title}', _prose(words[:80]), ns=4)))
  whole = os.path.join(root, 'whole_dump')
  os.makedirs(whole)
  with open(os.path.join(whole, f'enwiki-{DUMP_DATE}-pages-articles-multistream.xml.bz2'),
            'wb') as f:
    f.write(bz2.compress(_dump_head().encode()))
    for start in range(0, len(pages), PAGES_PER_STREAM):
      f.write(bz2.compress(''.join(p for _, p in pages[start:start + PAGES_PER_STREAM]).encode()))
    f.write(bz2.compress(b'</mediawiki>\n'))
  part_dir = os.path.join(root, 'parts')
  os.makedirs(part_dir)
  per_part = math.ceil(len(pages) / parts)
  for k, start in enumerate(range(0, len(pages), per_part), start=1):
    chunk = pages[start:start + per_part]
    name = f'enwiki-{DUMP_DATE}-pages-articles{k}.xml-p{chunk[0][0]}p{chunk[-1][0]}.bz2'
    with open(os.path.join(part_dir, name), 'wb') as f:
      f.write(bz2.compress((_dump_head() + ''.join(p for _, p in chunk)
                            + '</mediawiki>\n').encode()))
  return {'layouts': {'whole_dump': whole, 'parts': part_dir}, 'documents': len(docs),
          'pages': len(pages), 'parts': math.ceil(len(pages) / per_part)}


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
    bigram = Bigram()
    started = time.perf_counter()
    owt = write_openwebtext(os.path.join(root, 'openwebtext'), owt_text_mb, bigram)
    wiki = write_wikipedia(os.path.join(root, 'wikipedia'), wiki_text_mb, bigram,
                           parts=wiki_parts)
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
