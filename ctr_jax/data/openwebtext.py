"""TFDS builder `ctr_openwebtext`: OpenWebText from the public archive, read from manual_dir.

Only manual input is supported (`download_and_prepare` with a DownloadConfig whose
`manual_dir` is set); nothing is downloaded. `manual_dir` may hold, in order of
preference:

1. `openwebtext.tar.xz`, the public archive, whose `openwebtext/urlsf_subset*.xz`
   members are themselves xz-compressed tars of `.txt` documents;
2. those `urlsf_subset*` files already extracted (also `.tar`, as some mirrors ship);
3. the `.txt` documents already extracted (searched recursively).

Archives are read as streams, never extracted to disk; a document is read whole, so one
above `MAX_DOCUMENT_BYTES` (far beyond any real page) is skipped with a warning rather than
exhausting memory on a damaged or hostile archive. One example per `.txt` document; a stable hash of the document's name sends ~0.5% of them to `validation`.
Each split is a full pass over the input, so preparing reads the archive twice.
"""

from collections.abc import Iterator
import os
import tarfile

from absl import logging
from etils import epath

from ctr_jax.data import common

VALIDATION_FRACTION = 0.005
ARCHIVE_NAME = 'openwebtext.tar.xz'
SUBSET_PATTERNS = ('urlsf_subset*.xz', 'urlsf_subset*.tar', 'openwebtext/urlsf_subset*.xz',
                   'openwebtext/urlsf_subset*.tar')
EXPECTED = (f'{ARCHIVE_NAME}, or its extracted urlsf_subset*.xz files, or their extracted '
            '.txt documents')
SOURCE = 'https://skylion007.github.io/OpenWebTextCorpus/'
# OpenWebText's largest pages are a few MB; a bigger member is damage, not text.
MAX_DOCUMENT_BYTES = 64 * 2**20


def _too_big(name: str, size: int) -> bool:
  if size <= MAX_DOCUMENT_BYTES:
    return False
  logging.warning('openwebtext: skipping %s: %d bytes, above MAX_DOCUMENT_BYTES=%d', name, size,
                  MAX_DOCUMENT_BYTES)
  return True


def _is_subset(name: str) -> bool:
  base = os.path.basename(name)
  return base.startswith('urlsf_subset') and base.endswith(('.xz', '.tar'))


def _decode(raw: bytes) -> str:
  # A handful of scraped pages are not valid UTF-8; keep the rest of their text.
  return raw.decode('utf-8', errors='replace').strip()


def _subset_documents(fileobj, subset: str) -> Iterator[tuple[str, str]]:
  """Yields `(name, text)` for each `.txt` in one (possibly compressed) subset tar."""
  with tarfile.open(fileobj=fileobj, mode='r|*') as inner:
    for member in inner:
      if member.isfile() and member.name.endswith('.txt'):
        if _too_big(f'{subset}/{member.name}', member.size):
          continue
        f = inner.extractfile(member)
        if f is not None:
          yield f'{subset}/{os.path.basename(member.name)}', _decode(f.read())


def find_inputs(manual_dir: str | os.PathLike) -> tuple[str, list[str]]:
  """Returns `(kind, paths)`, kind in {'archive', 'subsets', 'txt'}; raises ValueError."""
  manual_dir = os.fspath(manual_dir)
  if os.path.isdir(manual_dir):
    archive = os.path.join(manual_dir, ARCHIVE_NAME)
    if os.path.isfile(archive):
      return 'archive', [archive]
    subsets = common.sorted_files(manual_dir, SUBSET_PATTERNS)
    if subsets:
      return 'subsets', subsets
    texts = []
    for root, dirs, files in os.walk(manual_dir):
      dirs.sort()
      texts.extend(os.path.join(root, f) for f in sorted(files) if f.endswith('.txt'))
    if texts:
      return 'txt', texts
  raise common.manual_dir_error(manual_dir, EXPECTED, SOURCE)


def iter_documents(manual_dir: str | os.PathLike) -> Iterator[tuple[str, str]]:
  """Yields `(name, text)` for every document under `manual_dir`, in a fixed order."""
  kind, paths = find_inputs(manual_dir)
  if kind == 'archive':
    # Streaming mode ('r|') because seeking in an xz stream means decompressing again.
    with tarfile.open(paths[0], mode='r|xz') as outer:
      for member in outer:
        if member.isfile() and _is_subset(member.name):
          subset = os.path.basename(member.name).split('.')[0]
          yield from _subset_documents(outer.extractfile(member), subset)
  elif kind == 'subsets':
    for path in paths:
      with open(path, 'rb') as f:
        yield from _subset_documents(f, os.path.basename(path).split('.')[0])
  else:
    for path in paths:
      name = os.path.relpath(path, manual_dir).replace(os.sep, '/')
      if _too_big(path, os.path.getsize(path)):
        continue
      with open(path, 'rb') as f:
        yield name, _decode(f.read())


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
