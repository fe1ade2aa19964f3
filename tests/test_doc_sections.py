"""ctr_jax.reporting.doc_sections: the one writer of generated markdown sections."""

import os

from ctr_jax.reporting import doc_sections


def test_replace_between_keeps_hand_written_text_and_other_sections(tmp_path):
  path = str(tmp_path / 'sub' / 'doc.md')
  mark = lambda n: (f'<!-- {n} -->', f'<!-- /{n} -->')
  doc_sections.replace_between(path, *mark('a'), 'first\n\n', new_file='# Title')
  with open(path, 'a') as f:
    f.write('\nHand-written text.\n')
  doc_sections.replace_between(path, *mark('b'), 'second')
  doc_sections.replace_between(path, *mark('a'), 'third')
  text = open(path).read()
  assert text.startswith('# Title\n\n<!-- a -->\nthird\n<!-- /a -->')
  assert 'first' not in text and text.index('Hand-written') < text.index('<!-- b -->\nsecond\n')
  assert text.count('<!-- a -->') == 1 and not os.path.exists(path + '.tmp')


def test_an_end_marker_before_the_begin_marker_does_not_match(tmp_path):
  path = str(tmp_path / 'doc.md')
  with open(path, 'w') as f:
    f.write('<!-- /x -->\nkeep me\n<!-- x -->\n')
  doc_sections.replace_between(path, '<!-- x -->', '<!-- /x -->', 'new')
  text = open(path).read()
  assert 'keep me' in text and text.rstrip().endswith('<!-- x -->\nnew\n<!-- /x -->')
