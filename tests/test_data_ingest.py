"""Tests of OpenWebText and Wikipedia ingestion on tiny fixtures in the public layouts."""

import bz2
import io
import itertools
import os
import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from ctr_jax.data import common, openwebtext, pipeline, wikipedia


def _names_in_split(template, fraction, validation, count):
  """The first `count` names `template.format(i)` that the hash sends to the given split."""
  names = (template.format(i) for i in itertools.count())
  return list(itertools.islice(
      (n for n in names if common.is_validation(n, fraction) == validation), count))


def _build(builder_cls, data_dir, manual_dir):
  builder = builder_cls(data_dir=str(data_dir), file_format='array_record')
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
  return builder.as_data_source()


def _records(source):
  return {r['title'].decode(): r['text'].decode() for r in (source[i] for i in range(len(source)))}


# ------------------------------------------------------------------------------------
# OpenWebText.
# ------------------------------------------------------------------------------------


def _tar_bytes(files, compression):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode=f'w:{compression}' if compression else 'w') as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()


def _owt_documents():
  """{subset: {txt name: text}}, with documents in both splits of subset 1."""
  # Document keys are "<subset>/<txt name>"; pick names whose key lands in each split.
  def names(validation, count):
    found = _names_in_split('urlsf_subset00-1_data/0000-{}.txt',
                            openwebtext.VALIDATION_FRACTION, validation, count)
    return [n.split('/')[1] for n in found]

  subset1 = {n: f'Train doc {n}.\n\nSecond paragraph, caf\u00e9.' for n in names(False, 3)}
  subset1.update({n: f'Validation doc {n}.' for n in names(True, 1)})
  subset1['empty.txt'] = '  \n'
  subset2 = {'0001-other.txt': 'Another subset, another document.'}
  return {'urlsf_subset00-1_data': subset1, 'urlsf_subset00-2_data': subset2}


def _expected_owt(validation):
  return {f'{subset}/{name}': text.strip()
          for subset, docs in _owt_documents().items() for name, text in docs.items()
          if text.strip() and common.is_validation(f'{subset}/{name}',
                                                   openwebtext.VALIDATION_FRACTION) == validation}


def _write_subsets(directory):
  paths = {}
  for subset, docs in _owt_documents().items():
    data = _tar_bytes({f'{subset}/{n}': t.encode() for n, t in docs.items()}, 'xz')
    paths[f'openwebtext/{subset}.xz'] = data
  for name, data in paths.items():
    os.makedirs(os.path.dirname(directory / name), exist_ok=True)
    (directory / name).write_bytes(data)
  return paths


@pytest.fixture(scope='module')
def owt_archive_dir(tmp_path_factory):
  """A manual_dir holding a tiny `openwebtext.tar.xz` in the public layout."""
  directory = tmp_path_factory.mktemp('owt_manual')
  members = {}
  for name, data in _write_subsets(tmp_path_factory.mktemp('owt_parts')).items():
    members[name] = data
  (directory / openwebtext.ARCHIVE_NAME).write_bytes(_tar_bytes(members, 'xz'))
  return directory


def test_owt_layouts_read_the_same_documents(owt_archive_dir, tmp_path):
  from_archive = dict(openwebtext.iter_documents(owt_archive_dir))
  subsets_dir = tmp_path / 'subsets'
  _write_subsets(subsets_dir)
  assert openwebtext.find_inputs(subsets_dir)[0] == 'subsets'
  from_subsets = dict(openwebtext.iter_documents(subsets_dir))
  txt_dir = tmp_path / 'txt'
  for subset, docs in _owt_documents().items():
    for name, text in docs.items():
      (txt_dir / subset).mkdir(parents=True, exist_ok=True)
      (txt_dir / subset / name).write_text(text, encoding='utf-8')
  assert openwebtext.find_inputs(txt_dir)[0] == 'txt'
  from_txt = dict(openwebtext.iter_documents(txt_dir))
  assert from_archive == from_subsets == from_txt
  assert len(from_archive) == 6


def test_owt_builder_splits(owt_archive_dir, tmp_path):
  sources = _build(openwebtext.CtrOpenWebText, tmp_path / 'data', owt_archive_dir)
  assert _records(sources['train']) == _expected_owt(validation=False)
  assert _records(sources['validation']) == _expected_owt(validation=True)
  assert len(sources['validation']) == 1 and len(sources['train']) == 4


def test_owt_pipeline_end_to_end(owt_archive_dir, tmp_path):
  ds = pipeline.load('openwebtext', data_dir=tmp_path, manual_dir=owt_archive_dir,
                     vocab_size=300)
  eot = ds.tokenizer.eot_id
  assert np.sum(ds.train_tokens == eot) == 4
  assert np.sum(ds.validation_tokens == eot) == 1
  text = ds.tokenizer.decode(ds.train_tokens)
  assert sorted(text.split('<|endoftext|>')[:-1]) == sorted(_expected_owt(False).values())
  batch = next(pipeline.train_iterator(ds, seq_len=8, global_batch_size=2))
  assert batch.shape == (2, 9) and batch.dtype == np.int32


# ------------------------------------------------------------------------------------
# Wikipedia.
# ------------------------------------------------------------------------------------

_NS = 'http://www.mediawiki.org/xml/export-0.11/'

_MARKUP = """{{Short description|A test town}}
{{Infobox settlement
| name = Alphaville
| population = {{formatnum:1234}}
}}
'''Alphaville''' ({{IPA|x}}) is a [[town]] in [[Testland|the test country]].<ref name="a">{{cite web
|url=http://example.com/x}}</ref> It has two [[river]]s.<ref name="b/c" />
<!-- a hidden editor comment -->
[[File:Alphaville.jpg|thumb|The [[town hall]] of Alphaville]]

== History ==
''Alphaville'' was founded in 1900 by &quot;settlers&quot;. See [http://example.com the site].
* First item with [[:Category:Towns|towns]]
{| class="wikitable"
|-
! Year !! People
|-
| 1900 || {{n|10}}
|}

== References ==
{{reflist}}
[[Category:Towns in Testland]]
[[de:Alphaville]]
"""


def _page(title, ns, text, redirect=None, page_id=1):
  redirect_tag = f'<redirect title="{redirect}" />' if redirect else ''
  return f"""  <page>
    <title>{title}</title>
    <ns>{ns}</ns>
    <id>{page_id}</id>
    {redirect_tag}
    <revision>
      <id>{page_id + 1000}</id>
      <contributor><username>Someone</username><id>7</id></contributor>
      <text bytes="1" xml:space="preserve">{text}</text>
    </revision>
  </page>
"""


def _escape(text):
  return text.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')


def _wiki_pages():
  """(title, ns, wikitext, redirect target) of the fixture dump, in dump order."""
  [val_title] = _names_in_split('Validation article {}', wikipedia.VALIDATION_FRACTION, True, 1)
  train_title = 'Alphaville'
  assert not common.is_validation(train_title, wikipedia.VALIDATION_FRACTION)
  return [
      (train_title, 0, _MARKUP, None),
      ('Alpha ville', 0, '#REDIRECT [[Alphaville]]', 'Alphaville'),
      ('Alphaville town', 0, '#redirect [[Alphaville]]', None),  # No <redirect> tag.
      ('Talk:Alphaville', 1, 'A talk page about [[Alphaville]].', None),
      ('Category:Towns', 14, 'Towns.', None),
      (val_title, 0, "A '''validation''' article.{{stub}}", None),
      ('Empty article', 0, '{{only a template}}', None),
  ]


@pytest.fixture(scope='module')
def wiki_dir(tmp_path_factory):
  """A manual_dir holding a tiny multistream dump: header, pages and footer streams."""
  directory = tmp_path_factory.mktemp('wiki_manual')
  pages = ''.join(_page(title, ns, _escape(text), redirect, page_id=i + 1)
                  for i, (title, ns, text, redirect) in enumerate(_wiki_pages()))
  head = (f'<mediawiki xmlns="{_NS}" version="0.11" xml:lang="en">\n'
          '  <siteinfo><sitename>Wikipedia</sitename></siteinfo>\n')
  # Multistream dumps are independent bz2 streams concatenated.
  data = bz2.compress(head.encode()) + bz2.compress(pages.encode()) + bz2.compress(
      b'</mediawiki>\n')
  (directory / 'enwiki-20240101-pages-articles-multistream.xml.bz2').write_bytes(data)
  # The index beside a multistream dump must be ignored.
  (directory / 'enwiki-20240101-pages-articles-multistream-index.txt.bz2').write_bytes(
      bz2.compress(b'600:1:Alphaville\n'))
  return directory


def test_wiki_iter_articles_drops_redirects_and_other_namespaces(wiki_dir):
  titles = [title for title, _ in wikipedia.iter_articles(wiki_dir)]
  pages = _wiki_pages()
  assert titles == [pages[0][0], pages[5][0], pages[6][0]]


def test_wiki_builder_splits_and_cleaning(wiki_dir, tmp_path):
  sources = _build(wikipedia.CtrWikipedia, tmp_path, wiki_dir)
  train = _records(sources['train'])
  validation = _records(sources['validation'])
  assert list(train) == ['Alphaville']  # The empty article is dropped.
  assert validation == {_wiki_pages()[5][0]: 'A validation article.'}
  assert train['Alphaville'] == (
      'Alphaville is a town in the test country. It has two rivers.\n\n'
      'History\n'
      'Alphaville was founded in 1900 by "settlers". See the site.\n'
      'First item with towns')


@pytest.mark.parametrize('wikitext, expected', [
    ('a {{x|{{y}}|z}} b', 'a b'),
    ('a {{unclosed b', 'a {{unclosed b'),
    ('stray }} here', 'stray }} here'),
    ('[[a|b]] [[c]]s [[Image:x.png|thumb|[[d]] e]] [[Category:f]]', 'b cs'),
    ('x<ref>r {{cite}}</ref> y<ref name=z/>.', 'x y.'),
    ('<!-- c -->t<math>x^2</math>u<br/>v', 'tuv'),
    ("'''''bold italic''''' and ''it''", 'bold italic and it'),
    ('=== Head ===\nbody', 'Head\nbody'),
    ('A&nbsp;B &amp; C', 'A B & C'),
    ('p\n\n\n\n\nq', 'p\n\nq'),
    ('keep\n== See also ==\n* [[x]]', 'keep'),
])
def test_clean_wikitext(wikitext, expected):
  assert wikipedia.clean_wikitext(wikitext) == expected


def test_wiki_rejects_two_dump_variants(wiki_dir, tmp_path):
  for name in ['enwiki-20240101-pages-articles.xml.bz2',
               'enwiki-20240101-pages-articles1.xml-p1p10.bz2']:
    (tmp_path / name).write_bytes(b'')
  with pytest.raises(ValueError, match='more than one Wikipedia dump variant'):
    wikipedia.find_inputs(tmp_path)


def test_wiki_parts_sorted_numerically(tmp_path):
  names = [f'enwiki-20240101-pages-articles{i}.xml-p{i}p{i + 1}.bz2' for i in (10, 2, 1)]
  for name in names:
    (tmp_path / name).write_bytes(b'')
  assert [os.path.basename(p) for p in wikipedia.find_inputs(tmp_path)] == names[::-1]


# ------------------------------------------------------------------------------------
# Missing or unusable manual_dir.
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', ['openwebtext', 'wikipedia'])
@pytest.mark.parametrize('manual', ['unset', 'missing', 'empty', 'wrong_files'])
def test_missing_manual_dir(name, manual, tmp_path):
  manual_dir = {'unset': None, 'missing': tmp_path / 'nope', 'empty': tmp_path / 'empty',
                'wrong_files': tmp_path / 'wrong'}[manual]
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'wrong').mkdir()
  (tmp_path / 'wrong' / 'readme.md').write_text('not a dump')
  with pytest.raises(ValueError, match='config.data.manual_dir') as e:
    pipeline.load(name, data_dir=tmp_path / 'data', manual_dir=manual_dir, vocab_size=300)
  message = str(e.value)
  assert '\n' not in message
  assert 'https://' in message
  assert ('openwebtext.tar.xz' if name == 'openwebtext' else 'pages-articles') in message


@pytest.mark.parametrize('builder_cls', [openwebtext.CtrOpenWebText, wikipedia.CtrWikipedia])
def test_builder_with_empty_manual_dir_raises_value_error(builder_cls, tmp_path):
  (tmp_path / 'manual').mkdir()
  with pytest.raises(ValueError, match='config.data.manual_dir'):
    _build(builder_cls, tmp_path / 'data', tmp_path / 'manual')
