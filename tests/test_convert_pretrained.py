"""Conversion of a pretrained transformer and its fine-tuning comparison, on tiny llama models.

The real run (SmolLM2-135M) is ctr_jax.projects.conversion; here a random-init llama-family
transformer and a tiny GGUF file written with the `gguf` writer stand in for it.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import convert_pretrained as config_module
from ctr_jax import models
from ctr_jax.inference import decode
from ctr_jax.models import convert
from ctr_jax.projects.conversion import experiment as cp
from ctr_jax.projects.conversion import report as conversion_report
from helpers import max_abs_diff, random_tokens


def tiny_llama(seed=0):
  cfg = models.model_config(kind='transformer', block='llama', vocab_size=53, width=32, depth=3,
                            num_heads=4, num_kv_heads=2, max_len=64, tie_embeddings=True,
                            layer_norm_eps=1e-6)
  model = models.build(cfg)
  return model, jax.jit(model.init)(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))


def test_converted_llama_reproduces_the_source_parallel_and_sequential():
  model, variables = tiny_llama()
  crt_cfg = cp.context_ready_config(model.spec, k=2)
  assert (crt_cfg.depth, crt_cfg.block, crt_cfg.tie_embeddings) == (3, 'llama', True)
  crt = models.build(crt_cfg)
  crt_vars = convert.transformer_to_context_ready(variables, crt_cfg, jax.random.key(1))
  tokens = random_tokens(3, 53, batch=2, length=12)
  expected = model.apply(variables, tokens)
  for k in (1, 2, 13):
    assert max_abs_diff(crt.apply(crt_vars, tokens, k_unroll=k), expected) <= 1e-5
  assert max_abs_diff(decode.sequential_logits(crt, crt_vars, tokens), expected) <= 1e-5
  # evaluate() sees the same: equal NLLs and ~0 max |Δlogit| at step 0.
  val = np.asarray(random_tokens(4, 53, batch=3, length=9))
  nll, _ = cp.evaluate(model, variables, crt, crt_vars, val, k=2, batch=2, step0=True)
  assert nll['context_ready_parallel'] == pytest.approx(nll['transformer'], abs=1e-5)
  assert nll['context_ready_sequential'] == pytest.approx(nll['transformer'], abs=1e-5)
  assert nll['max_abs_dlogit_parallel_vs_transformer'] <= 1e-5
  assert nll['max_abs_dlogit_sequential_vs_transformer'] <= 1e-5


def test_fine_tune_moves_only_the_trainable_parameters():
  model, variables = tiny_llama()
  crt_cfg = cp.context_ready_config(model.spec, k=2)
  crt = models.build(crt_cfg)
  crt_vars = convert.transformer_to_context_ready(variables, crt_cfg, jax.random.key(1))
  data = np.asarray(random_tokens(5, 53, batch=6, length=9))
  order = cp.batch_order(len(data), steps=3, batch=2, seed=0)
  assert order.shape == (3, 2) and sorted(order.reshape(-1)) == list(range(6))
  optim_config = config_module.get_config('lr=0.01,warmup=0')
  optim_config = cp._optim_config(optim_config)  # pylint: disable=protected-access
  labels = cp.frozen_labels(crt_vars['params'], 'embed', freeze_layers=1)
  new, history, _, _ = cp.fine_tune(crt, crt_vars['params'], data, order,
                                    optim_config=optim_config, labels=labels, k=2,
                                    log=lambda _: None)
  old = crt_vars['params']
  assert len(history) == 3
  same = lambda a, b: all(bool(jnp.all(x == y)) for x, y in zip(jax.tree.leaves(a),
                                                                jax.tree.leaves(b)))
  assert same(new['embed'], old['embed'])  # frozen: no step, no weight decay
  assert same(new['blocks']['block_0'], old['blocks']['block_0'])
  assert not same(new['blocks']['block_1'], old['blocks']['block_1'])
  # The zero output layer gets a gradient at once, so the correction leaves zero.
  assert float(jnp.abs(new['correction']['ffn']['fc_out']['weight']).max()) > 0


@pytest.mark.slow
def test_smoke_run_writes_the_json_and_the_doc(tmp_path):
  test_gguf = pytest.importorskip('test_gguf')
  path = tmp_path / 'tiny.gguf'
  test_gguf.write_gguf(path, 'llama', test_gguf.common_metadata('llama', 2, 2, 1000.0),
                       test_gguf.random_tensors(2, 2, 2, test_gguf.LLAMA_BLOCK))
  docs = tmp_path / 'docs'
  config = config_module.get_config(f'quick,gguf={path},docs={docs}')
  results = cp.run(config, 'the command', log=lambda _: None)
  record = json.loads((docs / 'conversion' / 'tiny.json').read_text())
  assert record['command'] == 'the command' and record['model'] == 'tiny'
  assert record['step0']['nll']['max_abs_dlogit_sequential_vs_transformer'] <= 1e-4
  assert record['step0']['ppl']['context_ready_sequential'] == pytest.approx(
      record['step0']['ppl']['transformer'], rel=1e-4)
  assert len(record['train']['transformer']['train_ce']) == config.steps
  assert set(record['samples']) == {'original', 'transformer', 'context_ready'}
  assert len(record['samples']['context_ready'][0]['ids']) == config.num_tokens
  doc = (docs / 'conversion.md').read_text()
  assert doc.count(conversion_report.BEGIN.format('tiny')) == 1 and 'the command' in doc
  # A second report replaces its section and keeps the hand-written text around it.
  (docs / 'conversion.md').write_text('# Title\n\nhand-written\n\n' + doc.split('\n', 2)[2])
  conversion_report.write_report(results, str(docs), 'tiny')
  doc = (docs / 'conversion.md').read_text()
  assert doc.count(conversion_report.BEGIN.format('tiny')) == 1 and 'hand-written' in doc


@pytest.mark.parametrize('arg, field', [('freeze=all', 'config.freeze'),
                                        ('model=gpt5', 'config.model'),
                                        ('k=0', 'config.k'), ('steps=0', 'config.steps'),
                                        ('warmup=99', 'config.warmup_steps'),
                                        ('lr=-1.0', 'config.lr'),
                                        ('nonsense=1', 'nonsense')])
def test_bad_args_are_named(arg, field):
  with pytest.raises(ValueError, match=field):
    config_module.get_config(arg)
  # run() checks a config edited after loading as well.
  config = config_module.get_config()
  config.freeze = 'all'
  with pytest.raises(ValueError, match='config.freeze'):
    cp.run(config, 'cmd')
