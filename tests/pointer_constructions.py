"""Hand-set weights for our real models that chase pointers exactly (docs/pointer_chasing.md,
"Representability"); tests/test_pointer_representability.py scores them with the task's own
evaluation.

Every construction writes the residual stream as named feature blocks (one-hot vectors), each
feature f stored as the pair of dimensions (+f, -f): every residual then has mean exactly zero,
so a LayerNorm with unit scale and zero bias only divides by |features| / sqrt(F). A large
constant `anchor` feature in every embedding keeps that norm within ~0.1% of ANCHOR at every
position, so one fixed read-out gain undoes the LayerNorms. Attention is made hard with large
scores; RoPE is the standard base-10000 ladder, used two ways within a 256-wide head:
  - the 16 fastest pairs carry position-only patterns from the query/key biases: a query pair
    (cos d*theta, -sin d*theta) against a key pair (1, 0) scores cos((delta - d) * theta), so the
    mean over the pairs peaks at offset delta = d, at least GAP above any other offset;
  - the slowest pairs barely turn over the sequence (cos >= COS_MIN) and carry content codes.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import models
from ctr_jax.data import pointer_chasing as pc

ANCHOR = 1000.0
HEAD_DIM = 256
NUM_HEADS = 4
POS_PAIRS = 16
BETA = 40.0       # slope of the MLP units that compute ANDs: gelu(+-BETA/2) = BETA/2 or ~0
MARGIN = 40.0     # smallest score gap between the chosen key and any other


def rope_freqs():
  half = HEAD_DIM // 2
  return 10000.0 ** (-np.arange(half) / half)


def pattern_stats(length: int):
  """(GAP, lowest score) of the mean positional pattern over offsets 0 .. length."""
  theta = rope_freqs()[:POS_PAIRS]
  offsets = np.arange(length + 1)
  scores = np.cos(np.outer(offsets, theta)).mean(axis=1)  # peak at d = 0; any d shifts it
  return 1.0 - scores[1:].max(), scores.min()


class Features:
  """Named blocks of features and the weight vectors that read and write them."""

  def __init__(self, blocks):
    self.offset, self.size, total = {}, dict(blocks), 0
    for name, size in blocks:
      self.offset[name] = total
      total += size
    self.num = total
    self.width = 2 * total

  def index(self, block, i):
    assert 0 <= i < self.size[block], (block, i)
    return self.offset[block] + i

  def write(self, block, i):
    """Residual vector [C] adding 1 to feature (block, i)."""
    out = np.zeros(self.width)
    f = self.index(block, i)
    out[2 * f], out[2 * f + 1] = 1.0, -1.0
    return out

  def read(self, block, i):
    """Weights [C] reading feature (block, i) off a LayerNorm output (unit scale, zero bias)."""
    gain = ANCHOR / np.sqrt(self.num)  # LN(x) = x * sqrt(F) / |features|, |features| ~ ANCHOR
    return self.write(block, i) * gain / 2


class Dense:
  """An [in, out] matrix and bias being filled in."""

  def __init__(self, fan_in, fan_out):
    self.w, self.b = np.zeros((fan_in, fan_out)), np.zeros(fan_out)


def set_dense(node, dense: Dense):
  """Writes a Dense into a parameter node of either kernel layout."""
  if 'weight' in node:
    node['weight'] = jnp.asarray(dense.w.T, jnp.float32)
  else:
    node['kernel'] = jnp.asarray(dense.w, jnp.float32)
  if 'bias' in node:
    node['bias'] = jnp.asarray(dense.b, jnp.float32)


class Head:
  """One head's query/key/value/output pieces inside a layer's dense layers."""

  def __init__(self, feats, q, k, v, o, h):
    self.feats, self.q, self.k, self.v, self.o = feats, q, k, v, o
    self.base = h * HEAD_DIM
    self.theta = rope_freqs()

  def positional(self, offset, amplitude, gate=None):
    """Scores amplitude * mean_j cos((delta - offset) theta_j); `gate` = (block, token, change):
    the amplitude moves by `change` where that feature is 1."""
    half = HEAD_DIM // 2
    for j in range(POS_PAIRS):
      pattern = np.array([np.cos(offset * self.theta[j]), -np.sin(offset * self.theta[j])])
      # The attention scale is HEAD_DIM ** -0.5 = 1 / 16 = 1 / POS_PAIRS: the sum is the mean.
      for coord, dim in zip(pattern, (j, j + half)):
        self.q.b[self.base + dim] = amplitude * coord
        if gate:
          block, token, change = gate
          self.q.w[:, self.base + dim] += self.feats.read(block, token) * change * coord
      self.k.b[self.base + j] = 1.0

  def content(self, q_block, k_block, tokens, strength):
    """+strength (times cos <= 1 of a slow pair) where q_block and k_block hold the same token."""
    half = HEAD_DIM // 2
    assert len(tokens) <= half - POS_PAIRS
    for n, token in enumerate(tokens):
      dim = self.base + half - 1 - n
      self.q.w[:, dim] += self.feats.read(q_block, token) * strength * np.sqrt(HEAD_DIM)
      self.k.w[:, dim] += self.feats.read(k_block, token)

  def move(self, src_blocks, dst_block, tokens):
    """The value carries the sum of `tokens` over src_blocks; the output adds it to dst_block."""
    for n, token in enumerate(tokens):
      for src in src_blocks:
        self.v.w[:, self.base + n] += self.feats.read(src, token)
      self.o.w[self.base + n] = self.feats.write(dst_block, token)


def score_scales(length, num_codes):
  """(amplitude of the fallback where a head is active, content strength, inactive amplitude).

  Active and no match: the fallback offset beats every other by amp * GAP >= MARGIN. A match
  beats the fallback: strength * COS_MIN + amp * lowest >= amp + MARGIN. Inactive: the fallback
  beats any match by amp_inactive * GAP - strength >= MARGIN.
  """
  gap, lowest = pattern_stats(length)
  half = HEAD_DIM // 2
  cos_min = np.cos(length * rope_freqs()[half - num_codes:half]).min()  # the content pairs
  assert cos_min > 0.5, 'content codes need slower pairs: a longer head or fewer codes'
  amp = MARGIN / gap
  strength = (amp * (1 - lowest) + MARGIN) / cos_min
  return amp, strength, (strength + MARGIN) / gap


def init_params(spec_kwargs, length):
  cfg = models.model_config(**spec_kwargs)
  model = models.build(cfg)
  params = model.init(jax.random.key(0), jnp.zeros((1, length), jnp.int32))['params']
  return model, jax.tree.map(lambda x: x * 0, params)


def set_norms(tree):
  """Unit scale, zero bias on every LayerNorm in `tree` (in place)."""
  for name, node in tree.items():
    if isinstance(node, dict):
      if set(node) == {'scale', 'bias'}:
        node['scale'] = jnp.ones_like(node['scale'])
      else:
        set_norms(node)


def unfreeze(tree):
  return {k: unfreeze(v) if hasattr(v, 'items') else v for k, v in tree.items()}


def _layer_dense(width):
  q_size = NUM_HEADS * HEAD_DIM
  return Dense(width, q_size), Dense(width, q_size), Dense(width, q_size), Dense(q_size, width)


def _store_attention(node, q, k, v, o):
  for name, dense in zip(('query', 'key', 'value', 'out'), (q, k, v, o)):
    set_dense(node[name], dense)


def _readout(params, feats, blocks, values, vocab):
  """Logits of the value tokens: the sum of their features in `blocks`; others far below."""
  head = Dense(feats.width, vocab)
  head.b[:] = -1e4
  for token in values:
    head.b[token] = 0.0
    for block in blocks:
      head.w[:, token] += feats.read(block, token)
  set_dense(params['head'], head)


def _embedding(feats, vocab):
  return jnp.asarray(np.stack([ANCHOR * feats.write('anchor', 0) + feats.write('tok', t)
                               for t in range(vocab)]), jnp.float32)


def transformer(hops: int, depth: int, encoding: str):
  """(model, params): an N = depth transformer chasing one level per layer.

  Layer 1: heads copying the tokens one and two back (p1, p2), and an MLP marking table keys
  (slot = my token where p1 is '='). Every later layer, four heads, each falling back to its own
  position where it has nothing to do (p1 not '=' for the first, not QUERY for the others):
    chase:  a table key reads ans + p2 (its value if level 0) at the table key of its target;
    fetch:  a query key copies p2 (the target) from its key's table entry into ft;
    query:  a query key reads ans + p2 at the table key of ft, and
    direct: at its own key's table entry, into qans.
  The logits read ans + qans + p2 on the value tokens. A level-L table key is answered after
  L + 1 layers; a level-L query after max(2, L + 1) layers if L != 1, and after 3 if L = 1.
  """
  vocab, length = pc.vocab_size(hops), pc.seq_len(hops, encoding)
  keys = [pc.key_token(lvl, i) for lvl in range(hops) for i in range(pc.NUM_KEYS)]
  values = [pc.value_token(hops, v) for v in range(pc.NUM_VALUES)]
  feats = Features([('anchor', 1), ('tok', vocab), ('p1', vocab), ('p2', vocab),
                    ('slot', vocab), ('ft', vocab), ('ans', vocab), ('qans', vocab)])
  mlp_dim = len(keys)
  model, params = init_params(dict(kind='transformer', depth=depth, vocab_size=vocab,
                                   width=feats.width, num_heads=NUM_HEADS, head_dim=HEAD_DIM,
                                   mlp_dim=mlp_dim, max_len=length, dropout=0.0), length)
  params = unfreeze(params)
  set_norms(params)
  params['embed']['embedding'] = _embedding(feats, vocab)
  amp, strength, amp_inactive = score_scales(length, len(keys))
  for layer in range(depth):
    block = params['blocks'][f'block_{layer}']
    q, k, v, o = _layer_dense(feats.width)
    heads = [Head(feats, q, k, v, o, h) for h in range(NUM_HEADS)]
    if layer == 0:
      for head, offset, dst in ((heads[0], 1, 'p1'), (heads[1], 2, 'p2')):
        head.positional(offset, 4 * amp)
        head.move(('tok',), dst, range(vocab))
      fc_in, fc_out = Dense(feats.width, mlp_dim), Dense(mlp_dim, feats.width)
      for n, key in enumerate(keys):  # slot[key] = tok[key] AND p1['=']
        fc_in.w[:, n] = BETA * (feats.read('tok', key) + feats.read('p1', pc.EQUALS))
        fc_in.b[n] = -1.5 * BETA
        fc_out.w[n] = feats.write('slot', key) * 2 / BETA
      set_dense(block['mlp']['fc_in'], fc_in)
      set_dense(block['mlp']['fc_out'], fc_out)
    else:
      chase, fetch, query, direct = heads
      chase.positional(0, amp_inactive, gate=('p1', pc.EQUALS, amp - amp_inactive))
      chase.content('p2', 'slot', keys, strength)
      chase.move(('ans', 'p2'), 'ans', values)
      for head, q_block, src, dst in ((fetch, 'tok', ('p2',), 'ft'),
                                      (query, 'ft', ('ans', 'p2'), 'qans'),
                                      (direct, 'tok', ('ans', 'p2'), 'qans')):
        head.positional(0, amp_inactive, gate=('p1', pc.QUERY, amp - amp_inactive))
        head.content(q_block, 'slot', keys, strength)
        head.move(src, dst, range(vocab) if dst == 'ft' else values)
    _store_attention(block['attn'], q, k, v, o)
  _readout(params, feats, ('ans', 'qans', 'p2'), values, vocab)
  return model, params


def _and_unit(fc_in, fc_out, n, feats, inputs, out_block, out_token):
  """MLP unit n: adds 1 to (out_block, out_token) iff every feature in `inputs` is 1."""
  fc_in.w[:, n] = BETA * sum(feats.read(block, token) for block, token in inputs)
  fc_in.b[n] = -BETA * (len(inputs) - 0.5)
  fc_out.w[n] += feats.write(out_block, out_token) * 2 / BETA


def context_ready(hops: int, encoding: str):
  """(model, params): a D = 1 context-ready model that answers every level through its correction.

  The recurrent state carries what a transformer would need more layers for. Features of
  z_{t-1} + e_t, read by the correction at t: tok (x_t), otok (x_{t-1}, moved there by the block
  MLP), p1 (x_{t-2}), and t-1's ans, att. The correction writes into u_t:
    p1     = x_{t-1};
    ans    = at a table key (x_{t-1} = '='): att of the '=' (its target's answer) or the target
             itself if it is a value;
    pst    = x_{t-1} where x_{t-1} was a table key, and pans = that key's ans: so the position
             after a table key is where the key's answer can be looked up;
    lookup = at '=': the target key (x_{t-1}); at a query key (x_{t-1} = QUERY): the key.
  The one attention head reads pans where pst == lookup (else its own pans, zero where it
  matters) into att; the block MLP moves tok to otok and takes the anchor out of z, so that
  z_{t-1} + e_t has one anchor at every t, t = 0 (z_{-1} = 0) included. Logits read ans + att.
  A level-L key is answered once its target's table entry has passed: one position later, not
  one layer more.
  """
  vocab, length = pc.vocab_size(hops), pc.seq_len(hops, encoding)
  keys = [pc.key_token(lvl, i) for lvl in range(hops) for i in range(pc.NUM_KEYS)]
  values = [pc.value_token(hops, v) for v in range(pc.NUM_VALUES)]
  feats = Features([('anchor', 1), ('tok', vocab), ('otok', vocab), ('p1', vocab),
                    ('ans', vocab), ('pst', vocab), ('pans', vocab), ('lookup', vocab),
                    ('att', vocab)])
  corr_units = [(((('otok', t),), 'p1', t)) for t in range(vocab)]
  corr_units += [((('otok', pc.EQUALS), ('att', v)), 'ans', v) for v in values]
  corr_units += [((('otok', pc.EQUALS), ('p1', v)), 'ans', v) for v in values]
  corr_units += [((('p1', pc.EQUALS), ('otok', key)), 'pst', key) for key in keys]
  corr_units += [((('p1', pc.EQUALS), ('ans', v)), 'pans', v) for v in values]
  corr_units += [((('tok', pc.EQUALS), ('otok', key)), 'lookup', key) for key in keys]
  corr_units += [((('tok', key), ('otok', pc.QUERY)), 'lookup', key) for key in keys]
  mlp_dim = max(len(corr_units), vocab)
  model, params = init_params(dict(kind='context_ready', depth=1, k_unroll=1, vocab_size=vocab,
                                   width=feats.width, num_heads=NUM_HEADS, head_dim=HEAD_DIM,
                                   mlp_dim=mlp_dim, max_len=length, dropout=0.0), length)
  params = unfreeze(params)
  set_norms(params)
  params['embed']['embedding'] = _embedding(feats, vocab)

  fc_in, fc_out = Dense(feats.width, mlp_dim), Dense(mlp_dim, feats.width)
  for n, (inputs, block, token) in enumerate(corr_units):
    _and_unit(fc_in, fc_out, n, feats, inputs, block, token)
  set_dense(params['correction']['ffn']['fc_in'], fc_in)
  set_dense(params['correction']['ffn']['fc_out'], fc_out)

  block = params['blocks']['block_0']
  amp, strength, _ = score_scales(length, len(keys))
  q, k, v, o = _layer_dense(feats.width)
  lookup = Head(feats, q, k, v, o, 0)
  lookup.positional(0, amp)
  lookup.content('lookup', 'pst', keys, strength)
  lookup.move(('pans',), 'att', values)
  _store_attention(block['attn'], q, k, v, o)
  fc_in, fc_out = Dense(feats.width, mlp_dim), Dense(mlp_dim, feats.width)
  for t in range(vocab):  # tok -> otok
    fc_in.w[:, t] = BETA * feats.read('tok', t)
    fc_in.b[t] = -0.5 * BETA
    fc_out.w[t] = (feats.write('otok', t) - feats.write('tok', t)) * 2 / BETA
  fc_out.b = -ANCHOR * feats.write('anchor', 0)
  set_dense(block['mlp']['fc_in'], fc_in)
  set_dense(block['mlp']['fc_out'], fc_out)
  _readout(params, feats, ('ans', 'att'), values, vocab)
  return model, params
