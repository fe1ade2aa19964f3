"""Helpers shared by the dataset builders, the tokenizer and the pipeline."""

from collections.abc import Iterator, Sequence
import contextlib
import glob
import hashlib
import os
import tempfile

import tensorflow_datasets as tfds


def is_validation(key: str, fraction: float) -> bool:
  """Whether the document `key` belongs to the validation split.

  A stable hash (not Python's salted `hash`) keeps the split identical across runs,
  machines and Python versions.
  """
  digest = hashlib.sha256(key.encode('utf-8')).digest()
  bucket = int.from_bytes(digest[:8], 'little') / 2.0**64
  return bucket < fraction


def manual_dir_error(path: object, expected: str, source: str) -> ValueError:
  """A one-line error for a missing or unusable manual download directory."""
  where = ('config.data.manual_dir is not set' if path is None else
           f'config.data.manual_dir={str(path)!r} holds no usable input')
  return ValueError(f'{where}: expected {expected}; download from {source} and point '
                    'config.data.manual_dir at the directory holding them.')


def manual_dir(dl_manager: tfds.download.DownloadManager, expected: str, source: str):
  """Returns the manual directory of `dl_manager`, or raises a one-line ValueError."""
  try:
    return dl_manager.manual_dir
  except AssertionError as e:
    # TFDS raises a multi-line AssertionError for a missing or empty directory.
    path = getattr(dl_manager, '_manual_dir', None)
    raise manual_dir_error(path, expected, source) from e


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = 'wb') -> Iterator:
  """Opens a temporary file beside `path` and moves it onto `path` on success.

  Readers (possibly other processes) therefore never see a half-written cache file.
  """
  path = os.fspath(path)
  directory = os.path.dirname(path) or '.'
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.' + os.path.basename(path) + '.',
                             suffix='.tmp')
  try:
    with os.fdopen(fd, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    # mkstemp creates the file private (0600); caches in a shared data_dir should not be.
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def sorted_files(directory: str | os.PathLike, patterns: Sequence[str]) -> list[str]:
  """Files in `directory` matching any glob in `patterns`, sorted for determinism."""
  found = set()
  for pattern in patterns:
    found.update(p for p in glob.glob(os.path.join(os.fspath(directory), pattern))
                 if os.path.isfile(p))
  return sorted(found)


class ManualTextBuilder(tfds.core.GeneratorBasedBuilder):
  """A text corpus read from `manual_dir`, split into train/validation by a hash of each key.

  Subclasses set `name`, `DESCRIPTION`, `EXPECTED` (what manual_dir must hold), `SOURCE` (where
  to get it), `VALIDATION_FRACTION`, `find_inputs` (fails early with a clear message) and
  `documents(path, validation)` yielding (key, text) pairs of one split.
  """

  # TFDS's default lookup of the builder's file imports the `importlib_resources` backport,
  # which is not installed on Python >= 3.9; subclasses set `code_path = epath.Path(__file__)`.
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  DESCRIPTION = ''
  EXPECTED = ''
  SOURCE = ''
  VALIDATION_FRACTION = 0.005

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            'title': tfds.features.Text(),
            'text': tfds.features.Text(),
        }),
        homepage=self.SOURCE,
    )

  def _split_generators(self, dl_manager):
    path = manual_dir(dl_manager, self.EXPECTED, self.SOURCE)
    type(self).find_inputs(path)  # Fail here, with a clear message, rather than mid-generation.
    return {
        'train': self._generate_examples(path, validation=False),
        'validation': self._generate_examples(path, validation=True),
    }

  def _generate_examples(self, path, validation: bool):
    for key, text in self.documents(path, validation):
      yield key, {'title': key, 'text': text}
