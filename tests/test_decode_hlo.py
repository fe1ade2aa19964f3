"""The compiled decode loop updates its KV caches in place (a structural check, not a timing).

A whole-cache copy per layer per step once cost more than the attention itself at long contexts
(docs/benchmarks.md); it came from the cache layout, so a layout change could bring it back.
"""

import re

import jax
import jax.numpy as jnp
import pytest

from ctr_jax import models
from ctr_jax.inference import decode


def _computations(hlo: str) -> dict[str, list[str]]:
  """Computation name -> its instruction lines."""
  comps, name = {}, None
  for line in hlo.splitlines():
    header = re.match(r'(?:ENTRY )?%([\w.\-]+) .*\{$', line)
    if header:
      name = header.group(1)
      comps[name] = []
    elif name is not None:
      comps[name].append(line)
  return comps


def loop_computations(hlo: str) -> dict[str, list[str]]:
  """The computations that run inside a while loop (every step): the loop bodies and the
  fusions and calls they reach."""
  comps = _computations(hlo)
  called = lambda lines: {c for line in lines
                          for c in re.findall(r'(?:calls|body|to_apply|branch_computations|'
                                              r'true_computation|false_computation)=\{?%([\w.\-]+)',
                                              line)}
  todo = {b for lines in comps.values() for line in lines
          for b in re.findall(r'body=%([\w.\-]+)', line)}
  seen = set()
  while todo:
    name = todo.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    todo |= called(comps[name])
  return {name: comps[name] for name in seen}


def loop_cache_copies(hlo: str, cache_dims) -> list[str]:
  """Whole-cache copies and transposes that run inside a while loop (every step), including
  inside the fusions and calls the loop bodies reach."""
  # A cache's elements under any axis order (a copy or a transpose of the whole cache);
  # unit axes are dropped, as XLA's bitcasts drop them.
  key = lambda dims: tuple(sorted(d for d in dims if d != 1))
  wanted = {key(dims) for dims in cache_dims}
  found = []
  for lines in loop_computations(hlo).values():
    for line in lines:
      m = re.search(r'= f32\[([\d,]*)\]\{[\d,]*\} (?:copy|transpose)\(', line)
      if m and key(int(d) for d in m.group(1).split(',') if d) in wanted:
        found.append(line.strip())
  return found


@pytest.mark.parametrize('kind', ['transformer', 'context_ready'])
@pytest.mark.parametrize('batch', [1, 3])
def test_generate_writes_the_kv_cache_in_place(kind, batch):
  cfg = models.model_config(kind=kind, vocab_size=64, width=32, depth=2, num_heads=4,
                            max_len=64)
  model = models.build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  prompt = jnp.ones((batch, 5), jnp.int32)
  num_tokens = 7
  hlo = decode._generate.lower(model, variables, prompt, num_tokens, jax.random.key(1),
                               jnp.float32(0), 0).compile().as_text()
  state = decode.init_decode_state(model, batch, 5 + num_tokens)
  dims = {tuple(x.shape) for x in jax.tree.leaves(state.caches)}
  assert 'while' in hlo
  copies = loop_cache_copies(hlo, dims)
  assert not copies, copies[:3]
