"""Decode-time fusion of the query/key/value projections (`attention.fuse_qkv`) changes speed,
never results: the fused decode equals the unfused one for every block family, weight layout and
dtype, and it really reads the fused matrix, made once per call outside the position loop."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode_hlo import loop_computations

from ctr_jax import models
from ctr_jax.inference import decode
from ctr_jax.models import attention
from helpers import family_lm, max_abs_diff, random_model

FAMILIES = ['gpt', 'gemma', 'llama', 'falcon', 'moe']


def _scan(model, variables, tokens):
  state = decode.init_decode_state(model, tokens.shape[0], tokens.shape[1])
  return jax.jit(decode.position_scan, static_argnums=0)(model, variables, tokens, state)[0]


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('layout', ['out_in', 'in_out'])
@pytest.mark.parametrize('block', FAMILIES)
def test_fused_decode_equals_unfused(block, layout, dtype):
  model, variables, tokens = family_lm(block, dtype=dtype, kernel_layout=layout, seed=3)
  fused = attention.fuse_qkv(variables)
  assert len(jax.tree.leaves(fused['fused'])) >= model.spec.depth  # one matrix per layer at least
  plain, joint = _scan(model, variables, tokens), _scan(model, fused, tokens)
  scale = float(jnp.max(jnp.abs(plain.astype(jnp.float32))))
  # Same products, but XLA may block the longer product's sums differently (measured: <= 5e-7
  # in float32, 0 in bfloat16; one bfloat16 rounding flip would carry through the layers).
  tolerance = 1e-5 if dtype == 'float32' else 1e-2
  assert max_abs_diff(plain, joint) <= tolerance * max(scale, 1.0)


@pytest.mark.parametrize('kind', ['transformer', 'context_ready'])
def test_fused_projection_is_what_attention_reads(kind):
  _, model, variables, tokens = random_model(11, kind=kind, depth=2)
  fused = attention.fuse_qkv(variables)
  qkv = fused['fused']['blocks']['block_0']['attn']['qkv']
  spec = model.spec
  assert qkv['weight'].shape == ((spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim,
                                 spec.width)
  # Poison the separate projections: the fused decode must not touch them.
  poisoned = jax.tree_util.tree_map_with_path(
      lambda path, x: x * jnp.nan if any(getattr(k, 'key', None) in ('query', 'key', 'value')
                                         for k in path) else x, variables['params'])
  out = _scan(model, {**fused, 'params': poisoned}, tokens)
  assert np.all(np.isfinite(np.asarray(out)))
  assert max_abs_diff(out, decode.sequential_logits(model, variables, tokens)) <= 1e-5
  # Fused variables pass through the decode entry points as they are (fuse once, decode often).
  again = decode.sequential_logits(model, {**fused, 'params': poisoned}, tokens)
  assert max_abs_diff(again, out) <= 1e-5


def test_generate_fuses_once_outside_the_loop():
  cfg = models.model_config(kind='transformer', vocab_size=64, width=32, depth=2, num_heads=4,
                            max_len=64)
  model = models.build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  hlo = decode._generate.lower(model, variables, jnp.ones((1, 5), jnp.int32), 7,
                               jax.random.key(1), jnp.float32(0), 0).compile().as_text()
  fused_matrix = re.compile(r'= f32\[96,32\]\{[\d,]*\} concatenate\(')
  in_loop = [line for lines in loop_computations(hlo).values() for line in lines]
  assert in_loop
  # The [3C, C] matrix is built (once per call) and never inside the loop over positions.
  assert fused_matrix.search(hlo)
  assert not [line for line in in_loop if fused_matrix.search(line)]


def test_generate_fuses_once_per_set_of_parameters(monkeypatch):
  model, variables, tokens = family_lm('llama', dtype='float32', seed=5)
  calls = []
  fuse = decode._fuse  # pylint: disable=protected-access
  monkeypatch.setattr(decode, '_fuse', lambda v: calls.append(1) or fuse(v))
  monkeypatch.setattr(decode, '_last_fused', [])
  prompt = tokens[:1, :4]
  first = decode.generate(model, variables, prompt, 3, jax.random.key(0))
  again = decode.generate(model, variables, prompt, 3, jax.random.key(0))
  assert len(calls) == 1 and np.array_equal(first, again)
  # New parameters are fused afresh: the output is the new model's, never the cached one's.
  changed = jax.tree.map(lambda x: x * -1.5, variables)
  out = decode.generate(model, changed, prompt, 3, jax.random.key(0))
  assert len(calls) == 2
  reference = decode.generate(model, jax.tree.map(np.asarray, changed), prompt, 3,
                              jax.random.key(0))  # numpy leaves: never cached
  assert len(calls) == 2 and np.array_equal(out, reference)
