"""Generated sections of hand-written markdown: every report writes through `replace_between`.

A section sits between a begin and an end marker (HTML comments, invisible when rendered). A
rerun replaces only that block; text outside the markers is the authors' and is kept. The write
is atomic (a temporary file, then a rename), so a report stopped halfway leaves the old file.
"""

import os


def replace_between(path: str, begin: str, end: str, body: str, *, new_file: str = '') -> str:
  """Writes `body` between `begin` and `end` in the markdown file `path`; returns `path`.

  Appends the block when the markers are absent. A missing file starts as `new_file` (e.g. a
  '# Title' line).
  """
  text = ''
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
  elif new_file:
    text = new_file.rstrip() + '\n\n'
  block = f'{begin}\n{body.rstrip()}\n{end}'
  if begin in text and end in text[text.index(begin):]:
    head, rest = text.split(begin, 1)
    text = head + block + rest.split(end, 1)[1]
  else:
    text = (text.rstrip() + '\n\n' if text.strip() else '') + block + '\n'
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)
  return path
