"""A GGUF file's vocabulary (`tokenizer.ggml.*` metadata) as a Hugging Face `tokenizers.Tokenizer`.

    tokenizer = gguf_tokenizer.from_metadata(metadata)   # or gguf_reader.load_tokenizer(path)
    ids = tokenizer.encode('The capital of France is').ids

`tokenizer.ggml.model` says which kind of vocabulary the file holds:

  'llama'  SentencePiece BPE (Gemma, Llama 2): pieces with scores, byte-fallback pieces <0xNN>.
      SentencePiece repeatedly joins the adjacent pair whose joined piece scores highest. A BPE
      model whose merges are every (left, right) split of every piece, ranked by the joined
      piece's score, makes the same choices (transformers builds Gemma's tokenizer.json the
      same way). Spaces become '▁'; a leading '▁' is added only with add_space_prefix.
      A piece of L characters has at most L - 1 such splits, so the merges are built in time
      and memory proportional to MAX_PIECE_CHARS times the vocabulary's size; a piece longer
      than MAX_PIECE_CHARS (128; Gemma 3's longest is 31) is refused, since a vocabulary of
      nested pieces ('a', 'aa', 'aaa', ...) has a number of merges that grows with the square
      of the piece length (a 4.6 MB file asked for more than 13 GB).
  'gpt2'   byte-level BPE (SmolLM2, GPT-2): the stored merges, and the pre-tokenizer regex that
      `tokenizer.ggml.pre` names ('default' / 'gpt-2': GPT-2's; 'smollm': every digit on its
      own first, as llama.cpp's SMOLLM pre-type and SmolLM2's tokenizer.json).

Control tokens (token_type 3) become special added tokens (`decode(ids,
skip_special_tokens=True)` drops them); user-defined tokens (4) become added tokens matched in
the raw text, as SentencePiece and llama.cpp match them. BOS / EOS are prepended / appended when
`tokenizer.ggml.add_bos_token` / `add_eos_token` say so (llama.cpp's defaults otherwise).
"""
import tokenizers

__all__ = ['MODELS', 'GPT2_PRE_TOKENIZERS', 'MAX_PIECE_CHARS', 'from_metadata']

MODELS = ('llama', 'gpt2')
GPT2_PRE_TOKENIZERS = ('default', 'gpt-2', 'gpt2', 'smollm')
# The longest SentencePiece piece accepted (characters): bounds the merges at 127 per piece.
MAX_PIECE_CHARS = 128
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _sentencepiece_merges(tokens: list[str], scores: list[float], vocab: dict) -> list:
  """Every (left, right) with left + right a piece, best-scoring joined piece first.

  The order of sorting all (-score, id, left, right) tuples, without building them: pieces in
  (-score, id) order, each one's splits by growing left part (a shorter prefix sorts first).
  left and right are the vocabulary's own string objects, so a merge costs one tuple.
  """
  merges = []
  for index in sorted(vocab.values(), key=lambda i: (-scores[i], i)):
    piece = tokens[index]
    for cut in range(1, len(piece)):
      left, right = vocab.get(piece[:cut]), vocab.get(piece[cut:])
      if left is not None and right is not None:
        merges.append((tokens[left], tokens[right]))
  return merges


def _check_token_id(metadata: dict, key: str, tokens: list[str]):
  """The token id stored under `key` (None if absent), or ValueError if it is not one."""
  index = metadata.get(key)
  if index is not None and not (isinstance(index, int) and 0 <= index < len(tokens)):
    raise ValueError(f'GGUF {key} is {index!r}, not a token id (the vocabulary has '
                     f'{len(tokens)} tokens)')
  return index


def _sentencepiece(tk, metadata: dict, tokens: list[str], vocab: dict):
  scores = metadata.get('tokenizer.ggml.scores')
  if not scores or len(scores) != len(tokens):
    raise ValueError("GGUF tokenizer.ggml.model 'llama' needs tokenizer.ggml.scores, one per "
                     'token')
  longest = max(range(len(tokens)), key=lambda i: len(tokens[i]))
  if len(tokens[longest]) > MAX_PIECE_CHARS:
    raise ValueError(f'GGUF tokenizer.ggml.tokens[{longest}] is {len(tokens[longest])} '
                     f'characters long; SentencePiece pieces are limited to MAX_PIECE_CHARS='
                     f'{MAX_PIECE_CHARS} (their merges grow with the square of the length)')
  unk = _check_token_id(metadata, 'tokenizer.ggml.unknown_token_id', tokens)
  model = tk.models.BPE(vocab, _sentencepiece_merges(tokens, scores, vocab),
                        unk_token=tokens[unk] if unk is not None else None, fuse_unk=True,
                        byte_fallback=True)
  tokenizer = tk.Tokenizer(model)
  replace = tk.normalizers.Replace(' ', '▁')
  decode = [tk.decoders.Replace('▁', ' '), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
  if metadata.get('tokenizer.ggml.add_space_prefix', True):  # llama.cpp's default for SPM
    tokenizer.normalizer = tk.normalizers.Sequence([tk.normalizers.Prepend('▁'), replace])
    decode.append(tk.decoders.Strip(' ', 1, 0))
  else:
    tokenizer.normalizer = replace
  tokenizer.decoder = tk.decoders.Sequence(decode)
  return tokenizer


def _byte_level(tk, metadata: dict, vocab: dict):
  pre = metadata.get('tokenizer.ggml.pre', 'default')
  if pre not in GPT2_PRE_TOKENIZERS:
    raise ValueError(f'GGUF tokenizer.ggml.pre {pre!r} is not supported; supported: '
                     f'{list(GPT2_PRE_TOKENIZERS)}')
  merges = []
  for merge in metadata.get('tokenizer.ggml.merges') or []:
    pair = tuple(merge.split(' '))
    if len(pair) != 2:
      raise ValueError(f'GGUF tokenizer.ggml.merges entry {merge!r} is not "left right"')
    merges.append(pair)
  tokenizer = tk.Tokenizer(tk.models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
  byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre == 'smollm':
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Digits(individual_digits=True), byte_level])
  else:
    tokenizer.pre_tokenizer = byte_level
  tokenizer.decoder = tk.decoders.ByteLevel()
  return tokenizer


def _post_processor(tk, metadata: dict, tokens: list[str], kind: str):
  ends = []
  for which, default in (('bos', kind == 'llama'), ('eos', False)):
    index = _check_token_id(metadata, f'tokenizer.ggml.{which}_token_id', tokens)
    if metadata.get(f'tokenizer.ggml.add_{which}_token', default) and index is not None:
      ends.append((which, tokens[index], int(index)))
  if not ends:
    return None
  bos = [t for w, t, _ in ends if w == 'bos']
  eos = [t for w, t, _ in ends if w == 'eos']
  single = bos + ['$A'] + eos
  pair = single + [f'{t}:1' for t in bos] + ['$B:1'] + [f'{t}:1' for t in eos]
  return tk.processors.TemplateProcessing(single=single, pair=pair,
                                          special_tokens=[(t, i) for _, t, i in ends])


def from_metadata(metadata: dict):
  """The `tokenizers.Tokenizer` of a GGUF file's `tokenizer.ggml.*` metadata."""
  tk = tokenizers
  kind = metadata.get('tokenizer.ggml.model')
  if kind not in MODELS:
    raise ValueError(f'GGUF tokenizer.ggml.model {kind!r} is not supported; supported: '
                     f'{list(MODELS)}')
  tokens = list(metadata.get('tokenizer.ggml.tokens') or [])
  if not tokens:
    raise ValueError('GGUF file has no tokenizer.ggml.tokens vocabulary')
  types = list(metadata.get('tokenizer.ggml.token_type') or [_NORMAL] * len(tokens))
  if len(types) != len(tokens):
    raise ValueError(f'GGUF tokenizer.ggml.token_type has {len(types)} entries for '
                     f'{len(tokens)} tokens')
  vocab = {}
  for index, token in enumerate(tokens):
    vocab.setdefault(token, index)  # a repeated string keeps its first id
  if kind == 'llama':
    tokenizer = _sentencepiece(tk, metadata, tokens, vocab)
  else:
    tokenizer = _byte_level(tk, metadata, vocab)
  added = lambda kind_: [tk.AddedToken(tokens[i], special=kind_ == _CONTROL, normalized=False)
                         for i, t in enumerate(types) if t == kind_ and vocab[tokens[i]] == i]
  tokenizer.add_special_tokens(added(_CONTROL))
  tokenizer.add_tokens(added(_USER_DEFINED))
  post = _post_processor(tk, metadata, tokens, kind)
  if post is not None:
    tokenizer.post_processor = post
  return tokenizer
