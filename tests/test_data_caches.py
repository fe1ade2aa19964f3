"""Damaged derived data is named and rebuilt; oversized archive members are skipped (issue 17).

Tokenizer JSON and token `.npy` caches are derived from the dataset, so a damaged one (a
truncated copy, a disk error) is deleted with a warning naming it and built again.
"""

import glob
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from ctr_jax.data import openwebtext, pipeline
from ctr_jax.data import tokenizer as tokenizer_lib
from helpers import tar_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 320


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  """A KJV data_dir with its tokenizer and token caches, and the tokens they hold."""
  data_dir = str(tmp_path_factory.mktemp('data'))
  ds = pipeline.load('kjv_bible', data_dir=data_dir, vocab_size=VOCAB)
  return data_dir, np.array(ds.train_tokens), np.array(ds.validation_tokens)


def _caches(data_dir):
  tok = tokenizer_lib.tokenizer_path('kjv_bible', VOCAB, data_dir)
  train = glob.glob(os.path.join(data_dir, 'tokenizers', f'kjv_bible_{VOCAB}_train_*.npy'))
  assert len(train) == 1
  return tok, train[0]


def _truncate(path, keep=None):
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:len(data) // 2 if keep is None else keep])


def test_damaged_tokenizer_and_token_caches_are_named_and_rebuilt(built, caplog):
  data_dir, train_tokens, validation_tokens = built
  tok_path, train_path = _caches(data_dir)
  with open(tok_path, 'w') as f:
    f.write('{"version": "1.0", "trunc')  # a JSON cut short: tokenizers raises a bare Exception
  _truncate(train_path)  # np.load's mmap: "mmap length is greater than file size"
  with caplog.at_level(logging.WARNING):
    ds = pipeline.load('kjv_bible', data_dir=data_dir, vocab_size=VOCAB)
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert any(tok_path in w and 'training the tokenizer again' in w for w in warnings), warnings
  assert any(train_path in w and 'tokenizing the train split again' in w for w in warnings), (
      warnings)
  np.testing.assert_array_equal(ds.train_tokens, train_tokens)
  np.testing.assert_array_equal(ds.validation_tokens, validation_tokens)
  assert _caches(data_dir) == (tok_path, train_path)  # the same (deterministic) tokenizer


@pytest.mark.parametrize('damage', ['header', 'empty', 'dtype'])
def test_other_token_cache_damage_is_rebuilt(built, damage, caplog):
  data_dir, train_tokens, _ = built
  _, train_path = _caches(data_dir)
  if damage == 'header':
    with open(train_path, 'r+b') as f:
      f.write(b'garbage!')
  elif damage == 'empty':
    _truncate(train_path, keep=0)
  else:
    np.save(train_path, np.zeros(4, np.float64))
  with caplog.at_level(logging.WARNING):
    ds = pipeline.load('kjv_bible', data_dir=data_dir, vocab_size=VOCAB)
  assert any(train_path in r.getMessage() for r in caplog.records)
  np.testing.assert_array_equal(ds.train_tokens, train_tokens)


def test_damaged_tokenizer_without_training_text_names_the_file(tmp_path):
  path = tokenizer_lib.tokenizer_path('x', 300, tmp_path)
  os.makedirs(os.path.dirname(path))
  with open(path, 'wb') as f:
    f.write(b'\x00\xff not json')
  with pytest.raises(ValueError, match=f'{path} is not a readable tokenizer file.*delete it'):
    tokenizer_lib.get_tokenizer('x', 300, tmp_path)
  assert os.path.exists(path)  # nothing to rebuild it from: left for the user


def test_prepare_job_rebuilds_a_truncated_cache_and_says_so(built):
  data_dir, train_tokens, _ = built
  _, train_path = _caches(data_dir)
  _truncate(train_path)
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT}
  result = subprocess.run(
      [sys.executable, '-m', 'ctr_jax.main', '--config=configs/quickstart.py',
       '--config.job=prepare', f'--config.data.data_dir={data_dir}',
       f'--config.model.vocab_size={VOCAB}', f'--workdir={data_dir}/work'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f'the token cache {train_path} is damaged' in result.stderr, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  np.testing.assert_array_equal(np.load(train_path), train_tokens)


# ------------------------------------------------------------------------------------------------
# OpenWebText: an archive member above the size cap is skipped with a warning.
# ------------------------------------------------------------------------------------------------



def test_openwebtext_skips_an_oversized_member(tmp_path, monkeypatch, caplog):
  subset = tar_bytes({'0001.txt': b'small document', 'huge.txt': b'x' * 5000, '0002.txt': b'also'},
                mode='w:xz')
  (tmp_path / 'urlsf_subset00-1_data.xz').write_bytes(subset)
  monkeypatch.setattr(openwebtext, 'MAX_DOCUMENT_BYTES', 1000)
  with caplog.at_level(logging.WARNING):
    docs = list(openwebtext.iter_documents(tmp_path))
  assert [name for name, _ in docs] == ['urlsf_subset00-1_data/0001.txt',
                                        'urlsf_subset00-1_data/0002.txt']
  warnings = [r.getMessage() for r in caplog.records]
  assert any('huge.txt' in w and '5000 bytes' in w for w in warnings), warnings
  # The same inside the public archive (subsets are streamed, documents read whole) ...
  outer = tar_bytes({'openwebtext/urlsf_subset00-1_data.xz': subset}, mode='w:xz')
  (tmp_path / 'urlsf_subset00-1_data.xz').unlink()
  (tmp_path / openwebtext.ARCHIVE_NAME).write_bytes(outer)
  assert list(openwebtext.iter_documents(tmp_path)) == docs
  # ... and among extracted .txt documents.
  loose = tmp_path / 'loose'
  loose.mkdir()
  (loose / 'a.txt').write_text('fine')
  (loose / 'b.txt').write_text('y' * 2000)
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    assert list(openwebtext.iter_documents(loose)) == [('a.txt', 'fine')]
  assert any('b.txt' in r.getMessage() for r in caplog.records)
