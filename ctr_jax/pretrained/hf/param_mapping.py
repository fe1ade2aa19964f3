"""Hugging Face tensors -> the ctr_jax parameter tree, one function per architecture.

torch Linear weights are [out, in]; the trees are built with flax kernels [in, out] and moved
to the model's `kernel_layout` at the end. `PARAMS` maps an architecture (config_mapping) to
its tensor-name prefixes and its mapping function `(tensors, spec, hf) -> params`.
"""

import numpy as np

from ctr_jax.models import families, layers
from ctr_jax.pretrained.hf.config_mapping import architecture, falcon_layout

# Buffers some checkpoints carry that are not parameters.
_IGNORED_SUFFIXES = ('rotary_emb.inv_freq', '.attn.bias', '.attn.masked_bias')


class _Tensors:
  """Checkpoint tensors under an optional prefix; remembers which ones were used."""

  def __init__(self, tensors: dict, prefixes: tuple[str, ...]):
    self.tensors = tensors
    self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in tensors)), '')
    self.used = set()

  def __contains__(self, name):
    return self.prefix + name in self.tensors

  def get(self, name, transpose=False):
    key = self.prefix + name
    if key not in self.tensors:
      raise ValueError(f'checkpoint is missing tensor {key!r}')
    self.used.add(key)
    value = self.tensors[key]
    return value.T if transpose else value

  def linear(self, name, bias=False):
    out = {'kernel': self.get(name + '.weight', transpose=True)}
    if bias:
      out['bias'] = self.get(name + '.bias')
    return out

  def norm(self, name, bias=False):
    out = {'scale': self.get(name + '.weight')}
    if bias:
      out['bias'] = self.get(name + '.bias')
    return out

  def mark_used(self, key):
    self.used.add(key)


def _attention(t: _Tensors, prefix: str) -> dict:
  """q/k/v/o projections of a Llama-layout attention (also Gemma 3's)."""
  names = {'query': 'q_proj', 'key': 'k_proj', 'value': 'v_proj', 'out': 'o_proj'}
  return {ours: t.linear(f'{prefix}self_attn.{theirs}') for ours, theirs in names.items()}


def _gated_mlp(t: _Tensors, prefix: str) -> dict:
  names = {'gate': 'gate_proj', 'up': 'up_proj', 'down': 'down_proj'}
  return {ours: t.linear(f'{prefix}mlp.{theirs}') for ours, theirs in names.items()}


def _gemma3_params(t: _Tensors, spec, hf: dict) -> dict:
  del hf
  blocks = {}
  for i in range(spec.depth):
    p = f'layers.{i}.'
    blocks[f'block_{i}'] = {
        'attn_norm': t.norm(p + 'input_layernorm'),
        'attn': {**_attention(t, p), 'q_norm': t.norm(p + 'self_attn.q_norm'),
                 'k_norm': t.norm(p + 'self_attn.k_norm')},
        'post_attn_norm': t.norm(p + 'post_attention_layernorm'),
        'mlp_norm': t.norm(p + 'pre_feedforward_layernorm'),
        'mlp': _gated_mlp(t, p),
        'post_mlp_norm': t.norm(p + 'post_feedforward_layernorm'),
    }
  return {'embed': {'embedding': t.get('embed_tokens.weight')}, 'blocks': blocks,
          'ln_f': t.norm('norm')}


def _llama_params(t: _Tensors, spec, hf: dict) -> dict:
  del hf
  blocks = {}
  for i in range(spec.depth):
    p = f'layers.{i}.'
    blocks[f'block_{i}'] = {
        'attn_norm': t.norm(p + 'input_layernorm'),
        'attn': _attention(t, p),
        'mlp_norm': t.norm(p + 'post_attention_layernorm'),
        'mlp': _gated_mlp(t, p),
    }
  return {'embed': {'embedding': t.get('embed_tokens.weight')}, 'blocks': blocks,
          'ln_f': t.norm('norm')}


def _split_falcon_qkv(fused: np.ndarray, layout: str, heads: int, kv_heads: int,
                      head_dim: int):
  """Fused query_key_value rows (weight [rows, C] or bias [rows]) -> q, k, v rows."""
  rest = fused.shape[1:]
  if layout == 'new':
    # Rows are grouped per key/value head: its H/G queries, then its key, then its value.
    grouped = fused.reshape((kv_heads, heads // kv_heads + 2, head_dim) + rest)
    q, k, v = grouped[:, :-2], grouped[:, -2], grouped[:, -1]
  elif layout == 'multi_query':
    grouped = fused.reshape((heads + 2, head_dim) + rest)
    q, k, v = grouped[:heads], grouped[heads:heads + 1], grouped[heads + 1:]
  else:
    grouped = fused.reshape((heads, 3, head_dim) + rest)
    q, k, v = grouped[:, 0], grouped[:, 1], grouped[:, 2]
  return tuple(x.reshape((-1,) + rest) for x in (q, k, v))


def _falcon_params(t: _Tensors, spec, hf: dict) -> dict:
  layout, heads, kv_heads = falcon_layout(hf)
  bias = spec.use_bias
  blocks = {}
  for i in range(spec.depth):
    p = f'h.{i}.'
    q, k, v = _split_falcon_qkv(t.get(p + 'self_attention.query_key_value.weight'), layout,
                                heads, kv_heads, spec.head_dim)
    attn = {'query': {'kernel': q.T}, 'key': {'kernel': k.T}, 'value': {'kernel': v.T},
            'out': t.linear(p + 'self_attention.dense', bias)}
    if bias:
      qb, kb, vb = _split_falcon_qkv(t.get(p + 'self_attention.query_key_value.bias'), layout,
                                     heads, kv_heads, spec.head_dim)
      attn['query']['bias'], attn['key']['bias'], attn['value']['bias'] = qb, kb, vb
    block = {'attn': attn,
             'mlp': {'fc_in': t.linear(p + 'mlp.dense_h_to_4h', bias),
                     'fc_out': t.linear(p + 'mlp.dense_4h_to_h', bias)}}
    if spec.parallel_norms == 2:
      block['attn_norm'] = t.norm(p + 'ln_attn', bias=True)
      block['mlp_norm'] = t.norm(p + 'ln_mlp', bias=True)
    else:
      block['attn_norm'] = t.norm(p + 'input_layernorm', bias=True)
    blocks[f'block_{i}'] = block
  return {'embed': {'embedding': t.get('word_embeddings.weight')}, 'blocks': blocks,
          'ln_f': t.norm('ln_f', bias=True)}


def _gpt2_params(t: _Tensors, spec, hf: dict) -> dict:
  del hf
  c = spec.width
  blocks = {}
  for i in range(spec.depth):
    p = f'h.{i}.'
    # Conv1D stores [in, out]: c_attn's columns are q | k | v.
    w, b = t.get(p + 'attn.c_attn.weight'), t.get(p + 'attn.c_attn.bias')
    conv = lambda name: {'kernel': t.get(name + '.weight'), 'bias': t.get(name + '.bias')}
    blocks[f'block_{i}'] = {
        'ln_attn': t.norm(p + 'ln_1', bias=True),
        'attn': {'query': {'kernel': w[:, :c], 'bias': b[:c]},
                 'key': {'kernel': w[:, c:2 * c], 'bias': b[c:2 * c]},
                 'value': {'kernel': w[:, 2 * c:], 'bias': b[2 * c:]},
                 'out': conv(p + 'attn.c_proj')},
        'ln_mlp': t.norm(p + 'ln_2', bias=True),
        'mlp': {'fc_in': conv(p + 'mlp.c_fc'), 'fc_out': conv(p + 'mlp.c_proj')},
    }
  return {'embed': {'embedding': t.get('wte.weight')},
          'pos_embed': {'embedding': t.get('wpe.weight')}, 'blocks': blocks,
          'ln_f': t.norm('ln_f', bias=True)}


PARAMS = {'gemma3': (('model.',), _gemma3_params), 'llama': (('model.',), _llama_params),
          'falcon': (('transformer.',), _falcon_params),
          'gpt2': (('transformer.',), _gpt2_params)}


def convert_params(hf: dict, tensors: dict, spec) -> dict:
  """The ctr_jax parameter tree (numpy) of a checkpoint's tensors."""
  prefixes, mapping = PARAMS[architecture(hf)]
  t = _Tensors(tensors, prefixes)
  params = mapping(t, spec, hf)
  if 'lm_head.weight' in tensors:
    t.mark_used('lm_head.weight')
    if not spec.tie_embeddings:
      params['head'] = {'kernel': tensors['lm_head.weight'].T}
      if families.traits(spec.block).head_bias:  # e.g. the gpt family's; GPT-2's head has none
        params['head']['bias'] = np.zeros(spec.vocab_size, tensors['lm_head.weight'].dtype)
  elif not spec.tie_embeddings:
    raise ValueError("checkpoint is missing tensor 'lm_head.weight' (tie_word_embeddings is "
                     'false)')
  unused = sorted(k for k in tensors if k not in t.used and not k.endswith(_IGNORED_SUFFIXES))
  if unused:
    raise ValueError(f'checkpoint tensors not understood for {hf.get("model_type")!r}: '
                     f'{unused[:8]}{" ..." if len(unused) > 8 else ""}')
  return layers.to_kernel_layout(params, spec.kernel_layout)
