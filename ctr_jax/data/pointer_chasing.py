"""Pointer chasing: a synthetic task that needs one more lookup per table level.

The reference (section 7) uses it to show a depth separation: an N-layer transformer resolves
about N levels, a one-layer context-ready model trained with BPTT resolves all of them.

An example has `hops` = H table levels with 8 keys each and 16 values. Level 0 maps each key to a
random value; level L >= 1 maps its keys onto the keys of level L-1 through a random permutation
(a bijection, so no two keys collapse onto one chain). Each table is written as entries
`target = key` in shuffled order and closed by '|'; it is followed by a query section `QUERY key`
for every key of that level (shuffled) and '|'; the sequence ends with `QUERY key` for one
top-level key. A key is written after its target, so under causal attention the key position can
already see what it maps to (the key-first order did not learn in the author's experiments).

Targets are dense: every key token (in tables, query sections and the final query) carries the
token id of its fully resolved base value; every other position carries -1. The model predicts the
target AT the key position (logits[t] against targets[t]), not the next token. A level-L key needs
L index lookups plus one base lookup.

Token ids: PAD=0, QUERY=1, '='=2, '|'=3, then the keys of level 0, 1, ..., H-1 (8 each), then the
16 values: V = 4 + 8H + 16 (100 for H = 10), T = 42H + 2 (25 table + 17 query tokens per level).

Three encodings, all the author's (reference 7.2), chosen by `encoding`:
  'sections' (default): the layout above, his code's version; scored on the query sections.
  'multi_q':  'sections' with his optional multi-Q helper sections: before level L's query
              section come L partial sections, `QUERY key` for every key of the level with the
              key reached after j = 1 .. L hops as the target (a key of level L - j), so each
              hop of the chain is supervised on its own. His code names them (helper targets
              for 1-hop, 2-hop, ... partial resolutions); this layout is our reading of that.
              T = 42H + 17H(H-1)/2 + 2; scored like 'sections' (the full-resolution sections).
  'tables':   his notes' version, the one his recorded staircases were scored on (3 hops: levels
              L0..L3; 20 hops: "all 21 levels"): the tables alone, then the final `QUERY key`;
              T = 25H + 2, targets at the table keys and the final query; levels L0..L(H-1) are
              the table keys of each level, L(H) the final query. A level-L table key needs
              L + 1 attention layers; a level-L query section in 'sections' needs 2, 3 and
              then L + 1 (L >= 2): docs/pointer_chasing.md, "Representability".

Examples are a pure function of (seed, index): a SplitMix64 hash of the pair seeds each example's
random numbers, so `sample`, `batch` and `PointerChasingSource` agree with each other, batches are
generated without a Python loop over examples, and any example can be regenerated on its own.
Training streams use seeds >= 0; evaluation (`ctr_jax.pointer_eval`) uses `EVAL_SEED` < 0, so the
two never share an example stream.

`format_example(*sample(2, seed=0))` (a test keeps it current): keys are written `a3` (level 0,
key 3), `b5` (level 1, key 5), ..., values `v0`..`v15`; `a6=b4` is the entry "b4 points to a6" and
`:v13` the target at that key (b4 -> a6 -> v13):

  pointer chasing: hops=2, T=86, 33 targets
  L0 table: v2=a0:v2 v14=a3:v14 v10=a4:v10 v15=a1:v15 v2=a7:v2 v4=a2:v4 v5=a5:v5 v13=a6:v13 |
  L0 query: ?a6:v13 ?a0:v2 ?a4:v10 ?a7:v2 ?a3:v14 ?a1:v15 ?a2:v4 ?a5:v5 |
  L1 table: a6=b4:v13 a7=b7:v2 a4=b1:v10 a0=b2:v2 a3=b3:v14 a5=b0:v5 a1=b5:v15 a2=b6:v4 |
  L1 query: ?b0:v5 ?b1:v10 ?b2:v2 ?b4:v13 ?b7:v2 ?b3:v14 ?b6:v4 ?b5:v15 |
  final:    ?b0:v5
"""

from typing import NamedTuple

import numpy as np

PAD, QUERY, EQUALS, SEP = 0, 1, 2, 3
NUM_SPECIAL = 4
NUM_KEYS = 8
NUM_VALUES = 16
TABLE_LEN = 3 * NUM_KEYS + 1   # `target = key` entries and '|'
QUERY_LEN = 2 * NUM_KEYS + 1   # `QUERY key` pairs and '|'
LEVEL_LEN = TABLE_LEN + QUERY_LEN
IGNORE = -1                    # target at positions without one

# Section kinds of a target position (see `position_labels`). Two optional helpers add targets
# that evaluation never scores. ENTRY_TARGET positions (the target side of an index-table entry,
# a key of the level below) carry its resolved value with entry_targets=True, so each lookup of
# the chain is supervised on its own. EQUALS_TARGET positions (the '=' of every entry, all levels)
# carry the entry's resolved value with equals_targets=True: the answer one token before the key,
# so that at every level the key token can read it from the position before it, the way a level-0
# key reads its value (our helper, not the author's; see docs/pointer_chasing.md).
# PARTIAL_QUERY: the keys of the 'multi_q' encoding's partial sections (trained, never scored).
NONE, TABLE_KEY, QUERY_KEY, FINAL_QUERY, ENTRY_TARGET, EQUALS_TARGET, PARTIAL_QUERY = range(7)
# Their switches: keyword arguments of `sample`, `batch`, `PointerChasingSource`, and fields of
# config.data (args of configs/pointer_chasing.py).
HELPER_TARGETS = ('entry_targets', 'equals_targets')

ENCODINGS = ('sections', 'tables', 'multi_q')
DEFAULT_ENCODING = 'sections'

# Seed of the evaluation stream; negative so that no training seed (>= 0) can produce it.
EVAL_SEED = -1

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def check_hops(hops: int) -> int:
  if int(hops) != hops or hops < 1:
    raise ValueError(f'hops (table levels) must be a positive integer, got {hops!r}')
  return int(hops)


def check_encoding(encoding: str) -> str:
  if encoding not in ENCODINGS:
    raise ValueError(f'encoding must be one of {ENCODINGS}, got {encoding!r}')
  return encoding


def _query_sections(level: int, encoding: str) -> int:
  """Query sections after level `level`'s table: 1, none ('tables'), or L partial + 1 full."""
  return {'sections': 1, 'tables': 0, 'multi_q': level + 1}[check_encoding(encoding)]


def _level_starts(hops: int, encoding: str) -> list[int]:
  """Offset of each level's table, and the offset of the final query at the end."""
  starts = [0]
  for lvl in range(hops):
    starts.append(starts[-1] + TABLE_LEN + QUERY_LEN * _query_sections(lvl, encoding))
  return starts


def vocab_size(hops: int) -> int:
  """4 special tokens, 8 keys per level, 16 values: 100 for hops = 10."""
  return NUM_SPECIAL + NUM_KEYS * check_hops(hops) + NUM_VALUES


def seq_len(hops: int, encoding: str = DEFAULT_ENCODING) -> int:
  """T = 42 * hops + 2: per level a 25-token table and a 17-token query section, then the query
  ('sections'); T = 25 * hops + 2 for 'tables'; 42 * hops + 17 * hops * (hops - 1) / 2 + 2 for
  'multi_q'."""
  return _level_starts(check_hops(hops), encoding)[-1] + 2


def key_token(level: int, key):
  """Token id of key `key` (0..7) of table level `level`."""
  return NUM_SPECIAL + NUM_KEYS * level + key


def value_token(hops: int, value):
  """Token id of value `value` (0..15)."""
  return NUM_SPECIAL + NUM_KEYS * hops + value


class PositionLabels(NamedTuple):
  """What each position of a `hops`-level sequence is, identical for every example.

  kind:  int32 [T]: NONE, TABLE_KEY, QUERY_KEY or FINAL_QUERY (the positions with a target),
         ENTRY_TARGET / EQUALS_TARGET (a target only with entry_targets / equals_targets),
         PARTIAL_QUERY ('multi_q' only: a target in training, never scored).
  level: int32 [T]: table level of the key at that position (-1 where kind is NONE; for '='
         the level of its table).
  """
  kind: np.ndarray
  level: np.ndarray


def position_labels(hops: int, encoding: str = DEFAULT_ENCODING) -> PositionLabels:
  """Per-position section kinds and levels, for grouping accuracies by level."""
  hops = check_hops(hops)
  starts = _level_starts(hops, encoding)
  kind = np.full(seq_len(hops, encoding), NONE, np.int32)
  level = np.full(seq_len(hops, encoding), -1, np.int32)
  for lvl in range(hops):
    start = starts[lvl]
    table_keys = start + 3 * np.arange(NUM_KEYS) + 2
    kind[table_keys], level[table_keys] = TABLE_KEY, lvl
    sections = _query_sections(lvl, encoding)
    for section in range(sections):  # the partial sections first, the full one last
      query_keys = start + TABLE_LEN + QUERY_LEN * section + 2 * np.arange(NUM_KEYS) + 1
      kind[query_keys] = QUERY_KEY if section == sections - 1 else PARTIAL_QUERY
      level[query_keys] = lvl
    kind[table_keys - 1], level[table_keys - 1] = EQUALS_TARGET, lvl
    if lvl:
      kind[table_keys - 2], level[table_keys - 2] = ENTRY_TARGET, lvl - 1
  kind[-1], level[-1] = FINAL_QUERY, hops - 1
  return PositionLabels(kind, level)


# ------------------------------------------------------------------------------------------------
# Counter-based randomness: example (seed, index) gets its own SplitMix64 stream, computed for a
# whole batch at once with uint64 arithmetic (which wraps modulo 2^64, as the hash needs).
# ------------------------------------------------------------------------------------------------


def _splitmix(x: np.ndarray) -> np.ndarray:
  with np.errstate(over='ignore'):
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _example_keys(seed: int, indices: np.ndarray) -> np.ndarray:
  if not -(1 << 63) <= int(seed) < (1 << 63):
    raise ValueError(f'seed must fit in a signed 64-bit integer, got {seed}')
  seed_word = np.array([int(seed) & _MASK64], np.uint64)
  return _splitmix(_splitmix(seed_word) ^ indices.astype(np.uint64))


def _uniforms(keys: np.ndarray, count: int) -> np.ndarray:
  """[B] example keys -> float64 [B, count] uniforms in [0, 1)."""
  with np.errstate(over='ignore'):
    states = keys[:, None] + np.arange(count, dtype=np.uint64)[None] * _GOLDEN
  return (_splitmix(states) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def check_num_keys(num_keys: int) -> int:
  if int(num_keys) != num_keys or not 1 <= num_keys <= NUM_KEYS:
    raise ValueError(f'num_keys (keys per level in an example) must be an integer in '
                     f'1..{NUM_KEYS}, got {num_keys!r}')
  return int(num_keys)


def check_num_levels(num_levels: int, hops: int) -> int:
  if int(num_levels) != num_levels or not 1 <= num_levels <= hops:
    raise ValueError(f'num_levels (table levels in an example) must be an integer in 1..{hops}, '
                     f'got {num_levels!r}')
  return int(num_levels)


def _generate(hops: int, seed: int, indices: np.ndarray, entry_targets: bool = False,
              equals_targets: bool = False, encoding: str = DEFAULT_ENCODING,
              num_keys: int = NUM_KEYS,
              num_levels: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Examples `indices` of stream `seed`: (tokens, targets), int32 [B, T] each.

  Every encoding draws the same tables, query orders and final query from (seed, index): a
  'tables' example is its 'sections' twin without the query sections, a 'multi_q' one the same
  twin with the partial sections (whose orders are drawn after everything else) added.

  num_keys < 8 (a stage of a key curriculum): each level uses `num_keys` of its 8 key tokens,
  a random subset per example and level, with the permutations between those subsets. The layout
  and T stay those of 8 keys: a table's real entries come first, then PAD triples up to 8 slots
  (a query section: PAD pairs), without targets, so every stage has the same shapes.

  num_levels < hops (a stage of a hop curriculum): the example is its full twin with levels
  num_levels .. hops-1 (tables and query sections) blanked to PAD without targets, and the final
  query asks a key of level num_levels-1. The layout and T stay those of `hops` levels: every
  remaining section keeps its position, and the final query its last two slots.
  """
  b, k, starts = len(indices), check_num_keys(num_keys), _level_starts(hops, encoding)
  levels = check_num_levels(hops if num_levels is None else num_levels, hops)
  extra = k * hops * hops if encoding == 'multi_q' else 0
  u = _uniforms(_example_keys(seed, indices), 3 * k * hops + 1 + extra
                + (NUM_KEYS * hops if k < NUM_KEYS else 0))
  # label[:, L, j]: the token index (0..7) of level L's j-th key; the identity for 8 keys.
  label = (np.argsort(u[:, -NUM_KEYS * hops:].reshape(b, hops, NUM_KEYS), axis=-1)[..., :k]
           if k < NUM_KEYS else np.broadcast_to(np.arange(k), (b, hops, k)))
  if k < NUM_KEYS:
    u = u[:, :-NUM_KEYS * hops]  # the rest is sliced as for 8 keys

  def key_of(lvl, keys):
    return key_token(lvl, np.take_along_axis(label[:, lvl], keys, axis=1))
  base_values = np.floor(u[:, :k] * NUM_VALUES).astype(np.int64)          # [B, 8]
  # Argsort of i.i.d. uniforms is a uniformly random permutation (ties have probability ~2^-53).
  perms = np.argsort(u[:, k:k * hops].reshape(b, hops - 1, k), axis=-1)   # level L>=1 -> L-1
  table_order = np.argsort(u[:, k * hops:2 * k * hops].reshape(b, hops, k), axis=-1)
  query_order = np.argsort(u[:, 2 * k * hops:3 * k * hops].reshape(b, hops, k), axis=-1)
  final_key = np.floor(u[:, 3 * k * hops] * k).astype(np.int64)
  # partial_order[:, lvl, j]: the key order of level lvl's j-hop section ('multi_q' only).
  partial_order = np.argsort(u[:, 3 * k * hops + 1:].reshape(b, hops, hops, k), axis=-1) \
      if extra else None

  resolved = [base_values]  # resolved[L][b, key] = base value reached from key of level L
  for lvl in range(1, hops):
    resolved.append(np.take_along_axis(resolved[-1], perms[:, lvl - 1], axis=1))

  tokens = np.full((b, seq_len(hops, encoding)), PAD, np.int32)
  targets = np.full((b, seq_len(hops, encoding)), IGNORE, np.int32)
  for lvl in range(hops):
    start = starts[lvl]
    keys = table_order[:, lvl]
    if lvl == 0:
      pointed = value_token(hops, np.take_along_axis(base_values, keys, axis=1))
    else:
      pointed_keys = np.take_along_axis(perms[:, lvl - 1], keys, axis=1)
      pointed = key_of(lvl - 1, pointed_keys)
      if entry_targets:
        targets[:, start:start + 3 * k:3] = value_token(
            hops, np.take_along_axis(resolved[lvl - 1], pointed_keys, axis=1))
    entries = tokens[:, start:start + 3 * k].reshape(b, k, 3)
    entries[..., 0], entries[..., 1], entries[..., 2] = pointed, EQUALS, key_of(lvl, keys)
    targets[:, start + 2:start + 3 * k:3] = value_token(
        hops, np.take_along_axis(resolved[lvl], keys, axis=1))
    if equals_targets:  # the key points to its entry's target side, so they resolve alike
      targets[:, start + 1:start + 3 * k:3] = targets[:, start + 2:start + 3 * k:3]
    tokens[:, start + 3 * NUM_KEYS] = SEP
    if encoding == 'tables':
      continue

    start += TABLE_LEN
    for hop in range(1, _query_sections(lvl, encoding)):  # 'multi_q': j-hop partial sections
      keys = partial_order[:, lvl, hop]
      reached = keys
      for below in range(lvl, lvl - hop, -1):  # one hop: a level-`below` key to level below-1
        reached = np.take_along_axis(perms[:, below - 1], reached, axis=1)
      _query_section(tokens, targets, start, key_of(lvl, keys), key_of(lvl - hop, reached))
      start += QUERY_LEN
    keys = query_order[:, lvl]
    _query_section(tokens, targets, start, key_of(lvl, keys),
                   value_token(hops, np.take_along_axis(resolved[lvl], keys, axis=1)))

  # Levels past `levels` (a hop-curriculum stage) are blanked; their random numbers were drawn
  # all the same, so the remaining levels are those of the full example.
  tokens[:, starts[levels]:starts[hops]] = PAD
  targets[:, starts[levels]:starts[hops]] = IGNORE
  tokens[:, -2], tokens[:, -1] = QUERY, key_of(levels - 1, final_key[:, None])[:, 0]
  targets[:, -1] = value_token(
      hops, np.take_along_axis(resolved[levels - 1], final_key[:, None], 1)[:, 0])
  return tokens, targets


def _query_section(tokens, targets, start, keys, answers):
  """`QUERY key` for each of `keys` [B, k] at `start`, `answers` [B, k] as targets, then PAD
  pairs up to 8 and '|'."""
  b, k = keys.shape
  pairs = tokens[:, start:start + 2 * k].reshape(b, k, 2)
  pairs[..., 0], pairs[..., 1] = QUERY, keys
  targets[:, start + 1:start + 2 * k:2] = answers
  tokens[:, start + 2 * NUM_KEYS] = SEP


def sample(hops: int, seed: int, index: int = 0, entry_targets: bool = False,
           equals_targets: bool = False,
           encoding: str = DEFAULT_ENCODING) -> tuple[np.ndarray, np.ndarray]:
  """Example `index` of stream `seed`: (tokens, targets), int32 [T] each (targets -1 off keys).

  entry_targets: also give the target side of each index-table entry (a key of the level
    below) its resolved value; see ENTRY_TARGET. Tokens do not change.
  equals_targets: also give each entry's '=' the entry's resolved value; see EQUALS_TARGET.
  encoding: 'sections' or 'tables' (see the module docstring).
  """
  if index < 0:
    raise ValueError(f'index must be >= 0, got {index}')
  tokens, targets = _generate(check_hops(hops), seed, np.array([index], np.int64),
                              entry_targets, equals_targets, check_encoding(encoding))
  return tokens[0], targets[0]


def batch(hops: int, batch_size: int, seed: int, start: int = 0, entry_targets: bool = False,
          equals_targets: bool = False, encoding: str = DEFAULT_ENCODING,
          num_keys: int = NUM_KEYS,
          num_levels: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Examples start .. start + batch_size - 1 of stream `seed`: int32 [B, T] tokens, targets.

  A trainer can take step s as `batch(hops, B, seed, start=s * B)`: one endless stream, no
  example repeated, every batch reproducible from (seed, step) alone. num_keys < 8: examples
  with that many keys per level, in the layout of 8; num_levels < hops: examples with that many
  table levels, in the layout of `hops` (see `_generate`).
  """
  if batch_size < 1 or start < 0:
    raise ValueError(f'need batch_size >= 1 and start >= 0, got {batch_size} and {start}')
  indices = np.arange(start, start + batch_size, dtype=np.int64)
  return _generate(check_hops(hops), seed, indices, entry_targets, equals_targets,
                   check_encoding(encoding), num_keys, num_levels)


class PointerChasingSource:
  """A grain random-access source (`grain.MapDataset.source(...)`) of `num_examples` examples.

  Record i is `{'tokens': int32 [T], 'targets': int32 [T]}` = `sample(hops, seed, i)`.
  """

  def __init__(self, hops: int, num_examples: int, seed: int, entry_targets: bool = False,
               equals_targets: bool = False, encoding: str = DEFAULT_ENCODING):
    self.hops = check_hops(hops)
    self.encoding = check_encoding(encoding)
    self.entry_targets = bool(entry_targets)
    self.equals_targets = bool(equals_targets)
    if num_examples < 1:
      raise ValueError(f'num_examples must be >= 1, got {num_examples}')
    self.num_examples = int(num_examples)
    self.seed = int(seed)

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    if not -self.num_examples <= index < self.num_examples:
      raise IndexError(f'index {index} out of range for {self.num_examples} examples')
    tokens, targets = sample(self.hops, self.seed, int(index) % self.num_examples,
                             self.entry_targets, self.equals_targets, self.encoding)
    return {'tokens': tokens, 'targets': targets}

  def __repr__(self) -> str:
    return (f'PointerChasingSource(hops={self.hops}, num_examples={self.num_examples}, '
            f'seed={self.seed}, entry_targets={self.entry_targets}, '
            f'equals_targets={self.equals_targets}, encoding={self.encoding!r})')


# ------------------------------------------------------------------------------------------------
# Pretty printing.
# ------------------------------------------------------------------------------------------------


def _key_name(level: int, key: int) -> str:
  if level < 26:
    return f'{chr(ord("a") + level)}{key}'
  return f'k{level}.{key}'


def token_name(hops: int, token: int) -> str:
  """A short readable name: 'Q', '=', '|', keys 'a3' (level 0 key 3), 'b5', ..., values 'v7'."""
  token = int(token)
  if token < NUM_SPECIAL:
    return ('PAD', 'Q', '=', '|')[token]
  if token < value_token(hops, 0):
    return _key_name(*divmod(token - NUM_SPECIAL, NUM_KEYS))
  if token < vocab_size(hops):
    return f'v{token - value_token(hops, 0)}'
  return f'<{token}>'


def format_example(tokens, targets, encoding: str = DEFAULT_ENCODING) -> str:
  """Tables, query sections (if any) and the final query of one example, with each key's
  target."""
  tokens, targets = np.asarray(tokens), np.asarray(targets)
  check_encoding(encoding)
  hops = next((h for h in range(1, len(tokens) + 1) if seq_len(h, encoding) >= len(tokens)), 0)
  if tokens.ndim != 1 or not hops or seq_len(hops, encoding) != len(tokens) or \
      targets.shape != tokens.shape:
    raise ValueError(f'expected one {encoding!r} example (length seq_len(hops, {encoding!r})), '
                     f'got shapes {tokens.shape} and {targets.shape}')
  starts = _level_starts(hops, encoding)
  name = lambda t: token_name(hops, t)
  resolved = lambda t: f':{name(targets[t])}' if targets[t] >= 0 else ''
  lines = [f'pointer chasing: hops={hops}, T={len(tokens)}, {int(np.sum(targets >= 0))} targets']
  for lvl in range(hops):
    start = starts[lvl]
    entries = [f'{name(tokens[i])}{resolved(i)}{name(tokens[i + 1])}'
               f'{resolved(i + 1) and resolved(i + 1) + " "}{name(tokens[i + 2])}{resolved(i + 2)}'
               for i in range(start, start + 3 * NUM_KEYS, 3)]
    lines.append(f'L{lvl} table: ' + ' '.join(entries + [name(tokens[start + 3 * NUM_KEYS])]))
    sections = _query_sections(lvl, encoding)
    for section in range(sections):
      first = start + TABLE_LEN + QUERY_LEN * section
      queries = [f'?{name(tokens[i + 1])}{resolved(i + 1)}' if tokens[i] == QUERY else
                 f'{name(tokens[i])} {name(tokens[i + 1])}'
                 for i in range(first, first + 2 * NUM_KEYS, 2)]
      title = f'L{lvl} query:' if section == sections - 1 else f'L{lvl} {section + 1}-hop:'
      lines.append(f'{title} ' + ' '.join(queries + [name(tokens[first + 2 * NUM_KEYS])]))
  lines.append(f'final:    ?{name(tokens[-1])}{resolved(len(tokens) - 1)}')
  return '\n'.join(lines)
