"""Conversion of a pretrained transformer into a context-ready model (paper section 5.7).

The correction network is added with its output layer at zero, so c_t = 0 for every input and
the converted model's logits equal the transformer's exactly, at every K and in sequential mode.
Fine-tuning then moves the correction away from zero.
"""

import jax
import jax.numpy as jnp

from ctr_jax import models

ZERO_INIT_CORRECTIONS = ('add', 'token_blind', 'concat')


def transformer_to_context_ready(variables, cfg, rng=None):
  """Variables of a context-ready model built from a transformer's `variables`.

  `cfg` is the target context-ready config; its depth, width, heads, vocabulary and block family
  must match the source (D = N). The correction FFN gets fresh initial weights (from `rng`) except
  its output layer, which is zero.
  """
  spec = models.spec_of(cfg)
  if not spec.is_context_ready:
    raise ValueError(f"model.kind: the target config must be 'context_ready', got {spec.kind!r}")
  if spec.correction not in ZERO_INIT_CORRECTIONS:
    raise ValueError(f'model.correction={spec.correction!r} has no zero-initialised form; use one '
                     f'of {list(ZERO_INIT_CORRECTIONS)}')
  source = dict(variables['params'])
  target_model = models.build(spec)
  dummy = jnp.zeros((1, 2), jnp.int32)
  target_shapes = jax.eval_shape(target_model.init, jax.random.key(0), dummy)['params']
  missing = sorted(set(target_shapes) - set(source) - {'correction'})
  if missing:
    raise ValueError(f'source variables lack {missing}: is it a transformer of the same family?')
  mismatched = [
      jax.tree_util.keystr(path) for path, a, b in _zip_paths(
          {k: source[k] for k in target_shapes if k != 'correction'},
          {k: target_shapes[k] for k in target_shapes if k != 'correction'})
      if a.shape != b.shape]
  if mismatched:
    raise ValueError(f'shape mismatch between the source transformer and the target config at '
                     f'{mismatched[:3]}: depth/width/heads/vocab_size must match')

  fresh = target_model.init(rng if rng is not None else jax.random.key(0), dummy)['params']
  correction = jax.tree.map(jnp.asarray, dict(fresh['correction']))
  ffn = dict(correction['ffn'])
  ffn['fc_out'] = jax.tree.map(jnp.zeros_like, ffn['fc_out'])
  correction['ffn'] = ffn
  params = {k: source[k] for k in target_shapes if k != 'correction'}
  params['correction'] = correction
  return {**variables, 'params': params}


def _zip_paths(a, b):
  flat_a, _ = jax.tree_util.tree_flatten_with_path(a)
  flat_b = jax.tree.leaves(b)
  if len(flat_a) != len(flat_b):
    raise ValueError('the source transformer and the target config have different parameter '
                     'trees: depth/width/heads/vocab_size/block must match')
  return [(path, x, y) for (path, x), y in zip(flat_a, flat_b)]


# Output projections of a block's residual branches: zero in a block added by `grow_transformer`.
_BRANCH_OUTPUTS = (('attn', 'out'), ('mlp', 'fc_out'))


def grow_transformer(source_params, fresh_params):
  """A deeper transformer's params: the source's blocks at the bottom, new blocks on top.

  `fresh_params` are initial params of the deeper target (same family, width, heads and
  vocabulary, more blocks). Everything but the added blocks is the source's; an added block keeps
  its fresh weights except the output projections of its attention and MLP branches, which are
  zero, so the block passes its input through and the grown model computes the source's logits
  exactly (its branches start learning once those projections move; the residual stream below
  them is the trained model's). Used by `config.init_from` when a transformer run starts from a
  shallower transformer: progressive stacking, not in the papers (docs/pointer_chasing.md uses it
  to test where a trained model's lookups sit).
  """
  source, fresh = dict(source_params), dict(fresh_params)
  if set(source) != set(fresh) or 'blocks' not in source:
    raise ValueError(f'growing a transformer needs the same parameter groups; the source has '
                     f'{sorted(source)}, the target {sorted(fresh)}')
  source_blocks, fresh_blocks = dict(source['blocks']), dict(fresh['blocks'])
  n, m = len(source_blocks), len(fresh_blocks)
  if n >= m:
    raise ValueError(f'growing a transformer needs more blocks in the target: source {n}, '
                     f'target {m}')
  shape = lambda tree: jax.tree.map(lambda x: (tuple(x.shape), x.dtype), tree)
  kept = {k: v for k, v in source.items() if k != 'blocks'}
  if shape(kept) != shape({k: fresh[k] for k in kept}) or any(
      shape(source_blocks[f'block_{i}']) != shape(fresh_blocks[f'block_{i}']) for i in range(n)):
    raise ValueError('growing a transformer needs the same width, heads, vocabulary and block '
                     'family in the source and the target')
  blocks = {f'block_{i}': source_blocks[f'block_{i}'] for i in range(n)}
  for i in range(n, m):
    block = jax.tree.map(jnp.asarray, fresh_blocks[f'block_{i}'])
    for branch, projection in _BRANCH_OUTPUTS:
      block[branch] = {**block[branch],
                       projection: jax.tree.map(jnp.zeros_like, block[branch][projection])}
    blocks[f'block_{i}'] = block
  return {**kept, 'blocks': blocks}
