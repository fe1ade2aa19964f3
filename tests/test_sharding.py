"""Parameter shardings come from the annotations each module creates its parameters with.

On an fsdp x tensor mesh (2 x 4 of the 8 test devices, tests/conftest.py) every parameter of
every block family and both model kinds is sharded, in both weight layouts, whenever its shape
allows it (here: always, every size below divides); the optimizer state follows its parameter.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import ml_collections
import optax
import pytest

from ctr_jax import models
from ctr_jax.training import compat, sharding, train_step

FAMILIES = ('gpt', 'gemma', 'llama', 'falcon', 'moe')
# Sizes every rule's mesh axes divide: fsdp = 2 divides C, Dh; tensor = 4 divides H*Dh, G*Dh,
# F, V.
FAMILY_OPTIONS = {
    'gpt': dict(positions='learned'),
    'gemma': dict(qk_norm=True, num_kv_heads=2),
    'llama': dict(num_kv_heads=2),
    'falcon': dict(use_bias=True, parallel_norms=2),
    'moe': dict(num_experts=4, experts_per_token=2),
}
TOKENS = jnp.zeros((1, 4), jnp.int32)


def mesh():
  return sharding.make_mesh(ml_collections.ConfigDict({'data': 1, 'fsdp': 2, 'tensor': 4}),
                            jax.devices()[:8])


def build(block, kind, layout):
  cfg = models.model_config(kind=kind, block=block, vocab_size=32, width=16, depth=2,
                            num_heads=4, max_len=16, kernel_layout=layout,
                            **FAMILY_OPTIONS[block])
  return models.build(cfg)


def specs(tree):
  return {jax.tree_util.keystr(path): s.spec
          for path, s in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize('layout', models.KERNEL_LAYOUTS)
@pytest.mark.parametrize('kind', models.KINDS)
@pytest.mark.parametrize('block', FAMILIES)
def test_every_parameter_is_sharded(block, kind, layout):
  model = build(block, kind, layout)
  params = jax.eval_shape(model.init, jax.random.key(0), TOKENS)['params']
  axes = sharding.param_axes(model, TOKENS)
  assert jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(params)
  found = specs(sharding.tree_shardings(params, mesh(), sharding.DEFAULT_RULES, axes))
  replicated = [path for path, spec in found.items() if all(a is None for a in spec)]
  assert not replicated, replicated

  w = 'weight' if layout == 'out_in' else 'kernel'
  orient = (lambda s: s[::-1]) if layout == 'out_in' else (lambda s: s)
  assert found["['embed']['embedding']"] == P('tensor', 'fsdp')
  assert found[f"['blocks']['block_0']['attn']['query']['{w}']"] == P(*orient(('fsdp', 'tensor')))
  assert found[f"['blocks']['block_0']['attn']['out']['{w}']"] == P(*orient(('tensor', 'fsdp')))
  if block == 'gpt':
    # The learned position table: sharded along C, its position axis is not the vocabulary.
    assert found["['pos_embed']['embedding']"] == P(None, 'fsdp')
    assert found[f"['head']['{w}']"] == P(*orient(('fsdp', 'tensor')))
  if block == 'moe':
    mlp = "['blocks']['block_1']['mlp']"
    assert found[f"{mlp}['gate']"] == P(None, 'fsdp', 'tensor')
    assert found[f"{mlp}['up']"] == P(None, 'fsdp', 'tensor')
    assert found[f"{mlp}['down']"] == P(None, 'tensor', 'fsdp')
  if kind == 'context_ready':
    ffn = "['correction']['ffn']"
    assert found[f"{ffn}['fc_in']['{w}']"] == P(*orient(('fsdp', 'tensor')))
    assert found[f"{ffn}['fc_out']['{w}']"] == P(*orient(('tensor', 'fsdp')))


def test_optimizer_state_follows_its_parameter_and_sizes_that_do_not_divide_stay_replicated():
  cfg = models.model_config(kind='context_ready', vocab_size=30, width=16, depth=1,
                            num_heads=4, max_len=16)  # V = 30: not divisible by tensor = 4
  model = models.build(cfg)
  tx = optax.adamw(1e-3)

  def init_state(rng):
    params = model.init(rng, TOKENS)['params']
    return train_step.init_state(params, tx)
  state = jax.eval_shape(init_state, jax.random.key(0))
  shardings = sharding.tree_shardings(state, mesh(), sharding.DEFAULT_RULES,
                                      sharding.param_axes(model, TOKENS))
  params = specs(shardings['params'])
  adam = shardings['opt_state'][0]
  assert specs(adam.mu) == params and specs(adam.nu) == params
  assert adam.count.spec == P() and shardings['step'].spec == P()
  assert params["['embed']['embedding']"] == P(None, 'fsdp')
  assert params["['head']['weight']"] == P(None, 'fsdp')


def test_the_rules_come_from_the_config():
  model = build('llama', 'transformer', 'out_in')
  axes = sharding.param_axes(model, TOKENS)
  params = jax.eval_shape(model.init, jax.random.key(0), TOKENS)['params']
  rules = [(name, None if name == 'mlp' else target) for name, target in sharding.DEFAULT_RULES]
  found = specs(sharding.tree_shardings(params, mesh(), rules, axes))
  assert found["['blocks']['block_0']['mlp']['gate']['weight']"] == P(None, 'fsdp')


def test_spec_and_config_agree_on_the_layout_and_saved_configs_keep_the_old_one():
  spec_default = {f.name: f.default for f in dataclasses.fields(models.ModelSpec)}
  assert spec_default['kernel_layout'] == models.default_model_config().kernel_layout == 'out_in'
  # A saved config from before the field existed describes [in, out] kernels.
  saved = models.model_config(vocab_size=32, width=16, num_heads=4).to_dict()
  del saved['kernel_layout']
  assert compat.LEGACY_DEFAULTS['kernel_layout'] == 'in_out'
  assert compat.saved_model_config(saved).kernel_layout == 'in_out'
  assert compat.saved_model_config({**saved, 'kernel_layout': 'out_in'}).kernel_layout \
      == 'out_in'
