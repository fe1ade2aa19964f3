"""Tests of the cached byte-level BPE tokenizer."""

import os

import numpy as np
import pytest

from ctr_jax.data import tokenizer

_TEXTS = ['The quick brown fox jumps over the lazy dog.',
          'Grüße aus Köln — naïve café, 東京, emoji 🙂.',
          'And God said, Let there be light: and there was light.'] * 20


def test_round_trip_and_special_token(tmp_path):
  tok = tokenizer.get_tokenizer('toy', 300, tmp_path, texts=_TEXTS)
  assert tok.vocab_size == 300
  assert tok.eot_id == 0
  for text in _TEXTS[:3] + ['unseen bytes: \x00\x7f\u2603 ≠', ' leading space', '']:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
  # Only separators inserted by the pipeline are EOT; a literal one is plain text.
  literal = 'a <|endoftext|> b<|endoftext|>'
  ids = tok.encode(literal)
  assert tok.eot_id not in ids
  assert tok.decode(ids) == literal
  assert tok.decode(np.array(tok.encode('x') + [tok.eot_id])) == 'x<|endoftext|>'
  assert tok.decode(tok.encode('x') + [tok.eot_id], skip_special_tokens=True) == 'x'
  assert tok.encode_batch(['ab', literal]) == [tok.encode('ab'), ids]


def test_cached_and_reused(tmp_path):
  calls = []

  def texts():
    calls.append(1)
    return iter(_TEXTS)

  tok = tokenizer.get_tokenizer('toy', 320, tmp_path, texts=texts)
  assert tok.path == os.path.join(str(tmp_path), 'tokenizers', 'toy_320.json')
  assert sorted(os.listdir(tmp_path / 'tokenizers')) == ['toy_320.json']  # No temp files.
  mtime = os.stat(tok.path).st_mtime_ns
  again = tokenizer.get_tokenizer('toy', 320, tmp_path, texts=texts)
  assert calls == [1]  # The training text was not read again.
  assert os.stat(tok.path).st_mtime_ns == mtime
  assert again.encode(_TEXTS[1]) == tok.encode(_TEXTS[1])
  # Once cached, no training text is needed at all.
  assert tokenizer.get_tokenizer('toy', 320, tmp_path).eot_id == tok.eot_id


def test_training_sample_is_capped(tmp_path):
  seen = []

  def texts():
    for i in range(1000):
      seen.append(i)
      yield f'document number {i} '
  tokenizer.get_tokenizer('capped', 300, tmp_path, texts=texts, max_train_bytes=100)
  assert len(seen) < 10


def test_errors(tmp_path):
  with pytest.raises(ValueError, match='at least 257'):
    tokenizer.get_tokenizer('toy', 256, tmp_path, texts=_TEXTS)
  with pytest.raises(ValueError, match='No cached tokenizer'):
    tokenizer.get_tokenizer('missing', 300, tmp_path)
