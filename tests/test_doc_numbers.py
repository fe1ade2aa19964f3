"""The prose pages quote results only as the generated sections print them.

README.md, docs/claims.md and the hand-written parts of every docs page cite means with their
spread (`31.06 ± 0.17`) and 95% intervals (`[−5.58, −3.72]`) from the results json files; those
numbers must stand, character for character (up to the minus sign and a leading +), in a section
that a command wrote from the json (between generated markers), so a rerun that changes a result
and leaves a quote behind fails here.
"""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = r'[−+-]?\d[\d,]*\.\d+%?'  # a measured value has decimals; [0, 1] is a range
QUOTED = re.compile(rf'{NUMBER} ± {NUMBER}|\[{NUMBER}, {NUMBER}\]')
GENERATED = (
    re.compile(r'<!-- ([\w-]+(?::[\w.-]+)?)[^>]*-->(.*?)<!-- /\1 -->', re.S),
    re.compile(r'<!-- BEGIN generated: (\S+)[^>]*-->(.*?)<!-- END generated: \1 -->', re.S),
    re.compile(r'<!-- ([\w-]+): begin \(generated\) -->(.*?)<!-- \1: end -->', re.S),
)


def _normal(text: str) -> str:
  return re.sub(r'(?<=[\[ ])\+(?=\d)', '', text.replace('−', '-'))


def split_generated(text: str) -> tuple[str, str]:
  """(the generated sections' text, the rest)."""
  spans = sorted(m.span(2) for pattern in GENERATED for m in pattern.finditer(text))
  generated, rest, at = [], [], 0
  for start, end in spans:
    if start < at:  # nested in a section already taken
      continue
    rest.append(text[at:start])
    generated.append(text[start:end])
    at = end
  rest.append(text[at:])
  return '\n'.join(generated), '\n'.join(rest)


def _pages() -> dict[str, str]:
  paths = [os.path.join(ROOT, 'README.md')] + glob.glob(os.path.join(ROOT, 'docs', '*.md'))
  out = {}
  for path in paths:
    with open(path, encoding='utf-8') as f:
      out[os.path.relpath(path, ROOT)] = f.read()
  return out


def test_split_generated_finds_each_marker_style():
  text = ('a 1.0 ± 0.1\n<!-- study:x (generated) -->\nb 2.0 ± 0.2\n<!-- /study:x -->\n'
          '<!-- BEGIN generated: y/z -->c [1, 2]<!-- END generated: y/z -->\n'
          '<!-- p: begin (generated) -->d<!-- p: end -->\ne')
  generated, rest = split_generated(text)
  assert '2.0 ± 0.2' in generated and 'c [1, 2]' in generated and 'd' in generated
  assert '1.0 ± 0.1' in rest and 'e' in rest and '2.0' not in rest


def test_quoted_results_stand_in_a_generated_section():
  pages = _pages()
  generated = _normal('\n'.join(split_generated(text)[0] for text in pages.values()))
  stale = []
  for name, text in pages.items():
    for quote in sorted(set(QUOTED.findall(split_generated(text)[1]))):
      if _normal(quote) not in generated:
        stale.append(f'{name}: {quote}')
  assert not stale, 'quoted but in no generated section (rerun the study, or fix the quote):\n' + (
      '\n'.join(stale))
