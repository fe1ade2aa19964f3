"""Synthetic OpenWebText and Wikipedia corpora in their real on-disk layouts, with English-like
text (a word-bigram chain over the embedded KJV), for measuring how fast they are prepared
(ctr_jax.projects.perf.prepare_rate).
"""

import bz2
import io
import math
import os
import tarfile
from xml.sax import saxutils

import numpy as np

from ctr_jax.data import kjv, openwebtext

DOCS_PER_SUBSET = 390  # ~8.0M documents in ~20,600 subset archives
PAGES_PER_STREAM = 100  # a multistream dump's bz2 streams
DUMP_DATE = '20240101'
_NS = 'http://www.mediawiki.org/xml/export-0.11/'


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
