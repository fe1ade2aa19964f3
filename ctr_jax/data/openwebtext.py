"""OpenWebText from the public archive or its mirrors, read from manual_dir (nothing is downloaded).

`manual_dir` may hold, in order of preference:

1. `openwebtext.tar.xz`, the public archive, whose `openwebtext/urlsf_subset*.xz` members are
   themselves xz-compressed tars of `.txt` documents;
2. subset files: those `urlsf_subset*.xz` files extracted (also `.tar`, as some mirrors ship), or
   the Hugging Face mirror's `subsets/urlsf_subsetNN.tar` (21 plain tars whose members are the
   `urlsf_subset*.xz` files: tars of `.xz` tars), at the top of manual_dir or under `subsets/`;
3. the `.txt` documents already extracted (searched recursively).

Archives are read as streams, never extracted to disk; a document is read whole, so one above
`MAX_DOCUMENT_BYTES` (far beyond any real page) is skipped with a warning rather than exhausting
memory on a damaged or hostile archive. A damaged archive (truncated, not xz, not a tar) stops the
reading with a one-line ValueError naming the file. One example per `.txt` document, named
`<subset>/<file name>` in every layout; a stable hash of the name sends ~0.5% of them to
`validation`.

For parallel preparation (ctr_jax/data/parallel.py) the corpus comes in *units*, one per subset:
`iter_units` lists them in a fixed order (for the two outer archives it reads the outer stream and
hands over each subset's compressed bytes) and `unit_documents` reads one, in any process.
The TFDS builder `ctr_openwebtext` reads the same documents through `iter_documents`.
"""

import bz2
from collections.abc import Iterator
import gzip
import io
import lzma
import os
import re
import tarfile

from absl import logging
from etils import epath

from ctr_jax.data import common

VALIDATION_FRACTION = 0.005
ARCHIVE_NAME = 'openwebtext.tar.xz'
SUBSET_PATTERNS = ('urlsf_subset*.xz', 'urlsf_subset*.tar', 'openwebtext/urlsf_subset*.xz',
                   'openwebtext/urlsf_subset*.tar', 'subsets/urlsf_subset*.tar')
EXPECTED = (f'{ARCHIVE_NAME}, or its extracted urlsf_subset*.xz files, or the Hugging Face '
            "mirror's subsets/urlsf_subsetNN.tar files, or their extracted .txt documents")
SOURCE = 'https://skylion007.github.io/OpenWebTextCorpus/'
# The corpus page's figure for the whole corpus: 8,013,769 documents, 38 GB of text (the
# preparation-time projections in docs/prepare_rate.md are made for it).
CORPUS_TEXT_BYTES = 38 * 10**9
# OpenWebText's largest pages are a few MB; a bigger member is damage, not text.
MAX_DOCUMENT_BYTES = 64 * 2**20
# A Hugging Face mirror tar (`urlsf_subset00.tar`) holds subsets; `urlsf_subset00-1_data.*` is one.
_OUTER_TAR = re.compile(r'^urlsf_subset\d+\.tar$')
_TXT_BATCH = 256  # extracted .txt documents per unit
_DAMAGE = (tarfile.TarError, lzma.LZMAError, EOFError, OSError, ValueError)


def _too_big(name: str, size: int) -> bool:
  if size <= MAX_DOCUMENT_BYTES:
    return False
  logging.warning('openwebtext: skipping %s: %d bytes, above MAX_DOCUMENT_BYTES=%d', name, size,
                  MAX_DOCUMENT_BYTES)
  return True


def _is_subset(name: str) -> bool:
  base = os.path.basename(name)
  return base.startswith('urlsf_subset') and base.endswith(('.xz', '.tar'))


def _subset_name(name: str) -> str:
  return os.path.basename(name).split('.')[0]


def _decode(raw: bytes) -> str:
  # A handful of scraped pages are not valid UTF-8; keep the rest of their text.
  return raw.decode('utf-8', errors='replace').strip()


def _damaged(where: str, error: BaseException) -> ValueError:
  detail = ' '.join(str(error).split()) or type(error).__name__
  return ValueError(f'{where} is damaged ({detail}); no token cache was written: download it '
                    f'again (from {SOURCE} or its mirror)')


# Compressed streams are opened by these readers rather than by tarfile's own ('r|*'): they raise
# EOFError on a truncated stream, where tarfile stops silently as if the archive had ended.
_COMPRESSED = ((b'\xfd7zXZ\x00', lzma.open), (b'BZh', bz2.open), (b'\x1f\x8b', gzip.open))


def _tar_stream(fileobj) -> tarfile.TarFile:
  """A streaming tar reader over a seekable file object holding a tar, compressed or not."""
  head = fileobj.read(6)
  fileobj.seek(0)
  for magic, opener in _COMPRESSED:
    if head.startswith(magic):
      return tarfile.open(fileobj=opener(fileobj, 'rb'), mode='r|')
  return tarfile.open(fileobj=fileobj, mode='r|')


def _tar_documents(fileobj, subset: str, where: str) -> Iterator[tuple[str, str]]:
  """Yields `(name, text)` for each `.txt` in one (possibly compressed) tar; nested subset
  archives (the Hugging Face mirror's tars of `.xz` tars) are read in turn."""
  with _tar_stream(fileobj) as tar:
    for member in tar:
      if not member.isfile():
        continue
      if member.name.endswith('.txt'):
        if _too_big(f'{subset}/{member.name}', member.size):
          continue
        f = tar.extractfile(member)
        if f is not None:
          yield f'{subset}/{os.path.basename(member.name)}', _decode(f.read())
      elif _is_subset(member.name):
        inner = _subset_name(member.name)
        data = io.BytesIO(tar.extractfile(member).read())
        yield from _tar_documents(data, inner, f'{where}:{member.name}')


def _checked(documents: Iterator[tuple[str, str]], where: str) -> Iterator[tuple[str, str]]:
  try:
    yield from documents
  except _DAMAGE as e:
    raise _damaged(where, e) from None


def _is_lfs_pointer(path: str) -> bool:
  if os.path.getsize(path) > 1024:
    return False
  with open(path, 'rb') as f:
    return f.read(64).startswith(b'version https://git-lfs')


def _first_member(path: str) -> str | None:
  """The first file member's name of a tar (any compression); ValueError if unreadable."""
  try:
    with open(path, 'rb') as f, _tar_stream(f) as tar:
      for member in tar:
        if member.isfile():
          return member.name
  except _DAMAGE as e:
    raise _damaged(path, e) from None
  return None


def _plain_tar_complete(path: str) -> bool:
  """A plain tar ends with two zero blocks; a truncated download (cut between members, which
  tarfile would read as a clean end) does not."""
  size = os.path.getsize(path)
  if size < 1024 or size % 512:
    return False
  with open(path, 'rb') as f:
    f.seek(size - 1024)
    return not f.read(1024).strip(b'\0')


def _check_subset_file(path: str, manual_dir: str) -> None:
  """Refuses, in one line and before any work, a file that cannot hold OpenWebText documents."""
  where = f'config.data.manual_dir={manual_dir!r}: {os.path.relpath(path, manual_dir)}'
  if _is_lfs_pointer(path):
    raise ValueError(f'{where} is a Git LFS pointer, not the archive: run `git lfs pull` in the '
                     'clone of the mirror (or download the files themselves)')
  with open(path, 'rb') as f:
    plain = not any(f.read(6).startswith(magic) for magic, _ in _COMPRESSED)
  if plain and not _plain_tar_complete(path):
    raise _damaged(path, EOFError('it does not end with the two zero blocks of a complete tar: '
                                  'truncated'))
  first = _first_member(path)
  if first is not None and not (first.endswith('.txt') or _is_subset(first)):
    raise ValueError(f'{where} holds {first!r}, not .txt documents or urlsf_subset*.xz '
                     f'archives; expected {EXPECTED}, from {SOURCE}')


def find_inputs(manual_dir: str | os.PathLike) -> tuple[str, list[str]]:
  """Returns `(kind, paths)`, kind in {'archive', 'subsets', 'txt'}; raises a one-line ValueError.

  Subset files are checked (readable, holding documents or subsets, not Git LFS pointers): the
  outer tars and the first loose subset, which costs a few reads.
  """
  manual_dir = os.fspath(manual_dir)
  if os.path.isdir(manual_dir):
    archive = os.path.join(manual_dir, ARCHIVE_NAME)
    if os.path.isfile(archive):
      if _is_lfs_pointer(archive):
        raise ValueError(f'config.data.manual_dir={manual_dir!r}: {ARCHIVE_NAME} is a Git LFS '
                         'pointer, not the archive: run `git lfs pull` or download the file')
      return 'archive', [archive]
    subsets = common.sorted_files(manual_dir, SUBSET_PATTERNS)
    if subsets:
      outer = [p for p in subsets if _OUTER_TAR.match(os.path.basename(p))]
      for path in outer or subsets[:1]:
        _check_subset_file(path, manual_dir)
      return 'subsets', subsets
    texts = []
    for root, dirs, files in os.walk(manual_dir):
      dirs.sort()
      texts.extend(os.path.join(root, f) for f in sorted(files) if f.endswith('.txt'))
    if texts:
      return 'txt', texts
  raise common.manual_dir_error(manual_dir, EXPECTED, SOURCE)


# ------------------------------------------------------------------------------------------------
# Units: one subset each, read in any process.
# ------------------------------------------------------------------------------------------------


def iter_units(manual_dir: str | os.PathLike) -> Iterator[tuple]:
  """The corpus as picklable units in a fixed order (see `unit_documents`).

  A unit is `('bytes', subset, where, data)` (a subset's compressed tar, read here from an outer
  archive), `('file', subset, path)` (a subset file) or `('txt', root, paths)` (up to 256
  extracted documents).
  """
  manual_dir = os.fspath(manual_dir)
  kind, paths = find_inputs(manual_dir)
  if kind == 'txt':
    for start in range(0, len(paths), _TXT_BATCH):
      yield ('txt', manual_dir, paths[start:start + _TXT_BATCH])
    return
  for path in paths:
    if kind == 'subsets' and not _OUTER_TAR.match(os.path.basename(path)):
      yield ('file', _subset_name(path), path)
      continue
    # An outer archive: its subsets are handed over as bytes (streaming mode: seeking in an xz
    # stream means decompressing again).
    loose = []
    try:
      with open(path, 'rb') as f, _tar_stream(f) as outer:
        for member in outer:
          if not member.isfile():
            continue
          if _is_subset(member.name):
            data = outer.extractfile(member).read()
            yield ('bytes', _subset_name(member.name), f'{path}:{member.name}', data)
          elif member.name.endswith('.txt') and not _too_big(member.name, member.size):
            loose.append((f'{_subset_name(path)}/{os.path.basename(member.name)}',
                          _decode(outer.extractfile(member).read())))
    except _DAMAGE as e:
      raise _damaged(path, e) from None
    if loose:
      yield ('documents', _subset_name(path), path, loose)


def unit_documents(unit: tuple) -> Iterator[tuple[str, str]]:
  """Yields `(name, text)` for every document of one unit of `iter_units`."""
  kind = unit[0]
  if kind == 'bytes':
    _, subset, where, data = unit
    yield from _checked(_tar_documents(io.BytesIO(data), subset, where), where)
  elif kind == 'file':
    _, subset, path = unit
    with open(path, 'rb') as f:
      yield from _checked(_tar_documents(f, subset, path), path)
  elif kind == 'documents':
    yield from unit[3]
  else:
    _, root, paths = unit
    for path in paths:
      name = os.path.relpath(path, root).replace(os.sep, '/')
      if _too_big(path, os.path.getsize(path)):
        continue
      with open(path, 'rb') as f:
        yield name, _decode(f.read())


def unit_size(unit: tuple) -> int:
  """Bytes of input a unit stands for (compressed where it is compressed), for progress lines."""
  if unit[0] == 'bytes':
    return len(unit[3])
  if unit[0] == 'file':
    return os.path.getsize(unit[2])
  if unit[0] == 'documents':
    return sum(len(t) for _, t in unit[3])
  return sum(os.path.getsize(p) for p in unit[2])


def iter_documents(manual_dir: str | os.PathLike) -> Iterator[tuple[str, str]]:
  """Yields `(name, text)` for every document under `manual_dir`, in a fixed order."""
  for unit in iter_units(manual_dir):
    yield from unit_documents(unit)


class CtrOpenWebText(common.ManualTextBuilder):
  """OpenWebText (Gokaslan & Cohen, 2019) from a manually downloaded archive."""

  name = 'ctr_openwebtext'
  code_path = epath.Path(__file__)
  DESCRIPTION = 'OpenWebText: web pages linked from Reddit posts with score >= 3.'
  EXPECTED, SOURCE, VALIDATION_FRACTION = EXPECTED, SOURCE, VALIDATION_FRACTION
  MANUAL_DOWNLOAD_INSTRUCTIONS = f'Put {EXPECTED} into manual_dir; get them from {SOURCE}.'
  find_inputs = staticmethod(find_inputs)

  def documents(self, path, validation: bool):
    for name, text in iter_documents(path):
      if text and common.is_validation(name, VALIDATION_FRACTION) == validation:
        yield name, text
