"""TFDS builder `ctr_wikipedia`: English Wikipedia articles from an XML dump in manual_dir.

Only manual input is supported (`download_and_prepare` with a DownloadConfig whose
`manual_dir` is set); nothing is downloaded. `manual_dir` must hold one dump variant:
`enwiki-<date>-pages-articles.xml.bz2`, the `-multistream` file, or the numbered parts
(`enwiki-<date>-pages-articles1.xml-p1p41242.bz2`, ...). The dump is stream-parsed with
`xml.etree.ElementTree.iterparse`; article pages (namespace 0) that are not redirects are
kept and cleaned by `clean_wikitext`. A stable hash of the title sends ~0.5% of the
articles to `validation`. Each split is a full pass over the dump.

For parallel preparation (ctr_jax/data/parallel.py) the dump comes in *units*: each numbered part
is one (read whole by a worker), and a whole dump is decompressed here, in one process, and cut
at page boundaries into chunks of about `CHUNK_BYTES` of XML that workers parse, clean and
tokenise. A whole dump is therefore read at the speed of one core's bz2 decompression; the parts
scale with cores. A damaged dump (truncated, not bz2, broken XML) stops the reading with a one-line
ValueError naming the file.
"""

import bz2
from collections.abc import Callable, Iterator
import html
import io
import os
import re
import xml.etree.ElementTree as ET

from etils import epath

from ctr_jax.data import common

VALIDATION_FRACTION = 0.005
DUMP_PATTERNS = ('enwiki-*-pages-articles*.xml.bz2', 'enwiki-*-pages-articles*.xml-p*.bz2')
EXPECTED = ('an English Wikipedia dump, enwiki-<date>-pages-articles[-multistream].xml.bz2 '
            'or its parts')
SOURCE = 'https://dumps.wikimedia.org/enwiki/'
CHUNK_BYTES = 16 * 2**20  # XML per unit when a whole dump is cut into chunks
_READ_BYTES = 2**20
_DAMAGE = (OSError, EOFError, ET.ParseError, ValueError)

# ------------------------------------------------------------------------------------
# Wikitext cleaning.
#
# A deliberately small cleaner, not a wikitext parser: it removes what dominates real
# articles (templates, tables, references, comments, file/category links, formatting
# quotes) and keeps prose. Nested constructs ({{...}}, {|...|}, [[...]]) are matched
# with a depth counter rather than regexes, which cannot balance brackets. An opener
# that is never closed is left as literal text so one stray "{{" cannot erase the rest
# of an article.
# ------------------------------------------------------------------------------------

_COMMENT = re.compile(r'<!--.*?(?:-->|$)', re.S)
_REF = re.compile(r'<ref\b[^>]*?/\s*>|<ref\b[^>]*>.*?</ref\s*>', re.S | re.I)
# Tags whose content is never prose.
_DROP_TAGS = re.compile(
    r'<(gallery|math|chem|timeline|imagemap|score|syntaxhighlight|source|graph|mapframe|'
    r'templatedata|references)\b[^>]*?(?:/>|>.*?</\1\s*>)', re.S | re.I)
_TAG = re.compile(r'</?[a-zA-Z][^>]*>')
_EXTERNAL_LINK = re.compile(r'\[(?:https?:|ftp:)?//[^\s\]]+\s*([^\]]*)\]')
_QUOTES = re.compile(r"'{2,5}")
_HEADING = re.compile(r'^(={1,6})\s*(.*?)\s*\1\s*$', re.M)
_LIST_MARKER = re.compile(r'^[*#:;]+\s*', re.M)
_MAGIC_WORD = re.compile(r'__[A-Z]+__')
_EMPTY_PARENS = re.compile(r'\(\s*[,;:]?\s*\)')
_SPACE_BEFORE_PUNCT = re.compile(r' +([,.;:])')
_MULTI_SPACE = re.compile(r'[ \t\u00a0]+')
# Namespaces whose links are not part of the running text.
_DROP_LINK_PREFIXES = frozenset({'file', 'image', 'media', 'category'})
_INTERLANGUAGE = re.compile(r'^[a-z]{2,3}(?:-[a-z]+)*$')
# Trailing sections that are lists of citations and links rather than prose.
_TAIL_SECTIONS = frozenset({'references', 'external links', 'see also', 'further reading',
                            'notes', 'footnotes', 'bibliography', 'sources', 'citations'})


def _replace_balanced(text: str, opener: str, closer: str,
                      replace: Callable[[str], str]) -> str:
  """Replaces each outermost `opener ... closer` span by `replace(inner text)`."""
  token = re.compile(re.escape(opener) + '|' + re.escape(closer))
  out = []
  depth = 0
  last = 0  # End of the text already copied to `out`.
  start = 0  # Start of the current outermost span.
  for m in token.finditer(text):
    if m.group() == opener:
      if depth == 0:
        start = m.start()
      depth += 1
    elif depth > 0:
      depth -= 1
      if depth == 0:
        out.append(text[last:start])
        out.append(replace(text[start + len(opener):m.start()]))
        last = m.end()
    # A closer at depth 0 is stray and stays as text.
  out.append(text[last:])
  return ''.join(out)


def _link_text(inner: str) -> str:
  target, _, label = inner.partition('|')
  target = target.strip()
  prefix, colon, _ = target.partition(':')
  if colon and not target.startswith(':'):
    prefix = prefix.strip().lower()
    if prefix in _DROP_LINK_PREFIXES or (_INTERLANGUAGE.match(prefix) and not label):
      return ''
  if '|' in label:
    # [[target|a|b]] only occurs in odd markup; the last part is what readers see.
    label = label.rsplit('|', 1)[1]
  return (label or target.lstrip(':')).strip()


def _drop_tail_sections(text: str) -> str:
  for m in _HEADING.finditer(text):
    if m.group(2).strip().lower() in _TAIL_SECTIONS:
      return text[:m.start()]
  return text


def clean_wikitext(text: str) -> str:
  """Converts article wikitext to plain text (see the notes above for what is kept)."""
  text = _COMMENT.sub('', text)
  text = _REF.sub('', text)
  text = _DROP_TAGS.sub('', text)
  text = _replace_balanced(text, '{{', '}}', lambda _: '')
  text = _replace_balanced(text, '{|', '|}', lambda _: '')
  text = _drop_tail_sections(text)
  text = _replace_balanced(text, '[[', ']]', _link_text)
  text = _EXTERNAL_LINK.sub(r'\1', text)
  text = _TAG.sub('', text)
  text = _QUOTES.sub('', text)
  text = _HEADING.sub(r'\2', text)
  text = _LIST_MARKER.sub('', text)
  text = _MAGIC_WORD.sub('', text)
  text = html.unescape(text)
  text = _EMPTY_PARENS.sub('', text)
  text = _MULTI_SPACE.sub(' ', text)
  text = _SPACE_BEFORE_PUNCT.sub(r'\1', text)
  lines = (line.strip() for line in text.split('\n'))
  # Blank lines separate paragraphs; runs of them come from removed blocks.
  return re.sub(r'\n{3,}', '\n\n', '\n'.join(lines)).strip()


# ------------------------------------------------------------------------------------
# Dump reading.
# ------------------------------------------------------------------------------------


def find_inputs(manual_dir: str | os.PathLike) -> list[str]:
  """Returns the dump files in `manual_dir`, or raises a one-line ValueError."""
  manual_dir = os.fspath(manual_dir)
  files = []
  if os.path.isdir(manual_dir):
    files = [f for f in common.sorted_files(manual_dir, DUMP_PATTERNS)
             if 'index' not in os.path.basename(f)]
  if not files:
    raise common.manual_dir_error(manual_dir, EXPECTED, SOURCE)
  whole = [f for f in files if os.path.basename(f).endswith('.xml.bz2')]
  if whole and len(files) > 1:
    # A whole dump next to parts (or a second whole dump) would duplicate articles.
    names = ', '.join(os.path.basename(f) for f in files)
    raise ValueError(f'config.data.manual_dir={manual_dir!r} holds more than one Wikipedia '
                     f'dump variant ({names}); keep either one whole dump or its parts.')
  return sorted(files, key=_part_order)


def _part_order(path: str):
  # Parts are numbered pages-articles1, 2, ..., 10, ...; sort numerically.
  m = re.search(r'pages-articles(?:-multistream)?(\d+)', os.path.basename(path))
  return (int(m.group(1)) if m else 0, path)


def _local(tag: str) -> str:
  return tag.rsplit('}', 1)[-1]


def iter_pages(path: str) -> Iterator[tuple[str, str, str, bool, str]]:
  """Yields `(page_id, title, namespace, is_redirect, wikitext)` for each page in a dump."""
  # bz2.open reads multistream files (concatenated bz2 streams) transparently.
  with bz2.open(path, 'rb') as f:
    yield from _parse_pages(f)


def _parse_pages(f) -> Iterator[tuple[str, str, str, bool, str]]:
  context = ET.iterparse(f, events=('start', 'end'))
  _, root = next(context)
  for event, elem in context:
    if event != 'end' or _local(elem.tag) != 'page':
      continue
    fields = {'id': '', 'title': '', 'ns': '', 'text': ''}
    redirect = False
    for child in elem.iter():
      name = _local(child.tag)
      if name == 'redirect':
        redirect = True
      elif name in fields and not fields[name]:
        # The first <id> is the page's; later ones belong to the revision/contributor.
        fields[name] = child.text or ''
    yield fields['id'], fields['title'], fields['ns'], redirect, fields['text']
    # Free parsed pages, or memory grows with the whole dump.
    elem.clear()
    root.clear()


def _articles(pages) -> Iterator[tuple[str, str]]:
  for _, title, namespace, redirect, text in pages:
    if namespace.strip() != '0' or redirect:
      continue
    if text.lstrip()[:9].upper() == '#REDIRECT':  # Some dumps lack the <redirect> tag.
      continue
    yield title, text


def _damaged(path: str, error: BaseException) -> ValueError:
  detail = ' '.join(str(error).split()) or type(error).__name__
  return ValueError(f'{path} is damaged ({detail}); no token cache was written: download it '
                    f'again from {SOURCE}')


def iter_articles(manual_dir: str | os.PathLike) -> Iterator[tuple[str, str]]:
  """Yields `(title, wikitext)` for non-redirect namespace-0 pages of the dump."""
  for unit in iter_units(manual_dir):
    yield from unit_articles(unit)


# ------------------------------------------------------------------------------------
# Units: a part file each, or chunks of whole pages cut from a whole dump.
# ------------------------------------------------------------------------------------


def _is_part(path: str) -> bool:
  return not os.path.basename(path).endswith('.xml.bz2')


def iter_units(manual_dir: str | os.PathLike) -> Iterator[tuple]:
  """The dump as picklable units in a fixed order: `('file', path)` for a part, and
  `('xml', path, index, data)` for chunks of whole `<page>` elements of a whole dump."""
  for path in find_inputs(manual_dir):
    if _is_part(path):
      yield ('file', path)
      continue
    try:
      with bz2.open(path, 'rb') as f:
        index, blocks, size = 0, [], 0
        while True:
          block = f.read(min(_READ_BYTES, CHUNK_BYTES))
          blocks.append(block)
          size += len(block)
          if size >= CHUNK_BYTES or not block:
            buffer = b''.join(blocks)
            cut = buffer.rfind(b'</page>')
            if cut >= 0:  # else one page is longer than a chunk: read on
              cut += len(b'</page>')
              yield ('xml', path, index, buffer[:cut])
              index, buffer = index + 1, buffer[cut:]
            blocks, size = [buffer], len(buffer)
          if not block:
            break
    except _DAMAGE as e:
      raise _damaged(path, e) from None


def _pages_of_chunk(data: bytes) -> Iterator[tuple[str, str, str, bool, str]]:
  start = data.find(b'<page>')
  if start < 0:
    return
  # A root around the whole pages (the dump's own root and header are in the first chunk only).
  yield from _parse_pages(io.BytesIO(b'<chunk>' + data[start:] + b'</chunk>'))


def unit_articles(unit: tuple) -> Iterator[tuple[str, str]]:
  """Yields `(title, wikitext)` for the articles of one unit of `iter_units`."""
  where = unit[1]
  try:
    if unit[0] == 'file':
      yield from _articles(iter_pages(unit[1]))
    else:
      yield from _articles(_pages_of_chunk(unit[3]))
  except _DAMAGE as e:
    raise _damaged(where, e) from None


def unit_documents(unit: tuple) -> Iterator[tuple[str, str]]:
  """Yields `(title, plain text)` for one unit's articles, cleaned; empty ones are dropped."""
  for title, wikitext in unit_articles(unit):
    text = clean_wikitext(wikitext)
    if text:
      yield title, text


def unit_size(unit: tuple) -> int:
  """Bytes of input a unit stands for (compressed for a part, XML for a chunk)."""
  return os.path.getsize(unit[1]) if unit[0] == 'file' else len(unit[3])


class CtrWikipedia(common.ManualTextBuilder):
  """English Wikipedia articles from a manually downloaded XML dump."""

  name = 'ctr_wikipedia'
  code_path = epath.Path(__file__)
  DESCRIPTION = 'English Wikipedia articles, wikitext markup stripped.'
  EXPECTED, SOURCE, VALIDATION_FRACTION = EXPECTED, SOURCE, VALIDATION_FRACTION
  MANUAL_DOWNLOAD_INSTRUCTIONS = f'Put {EXPECTED} into manual_dir; get it from {SOURCE}.'
  find_inputs = staticmethod(find_inputs)

  def documents(self, path, validation: bool):
    for title, wikitext in iter_articles(path):
      # Only the hash is needed to route a page; clean just the ones this split keeps.
      if common.is_validation(title, VALIDATION_FRACTION) != validation:
        continue
      text = clean_wikitext(wikitext)
      if text:
        yield title, text
