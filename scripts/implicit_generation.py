"""The implicit-update generation experiment; the command is in configs/implicit_generation.py.

Writes `results.json` and `table.md` to the workdir and two figures to the figures directory.
"""

import dataclasses
import hashlib
import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'configs/implicit_generation.py[:arg]',
                                lock_config=True)
flags.mark_flags_as_required(['config'])


def log(message):
  print(message, flush=True)


def small_models(config):
  """Trains the small models on the embedded corpus, or reloads them from the workdir."""
  import flax.serialization  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from ctr_jax import config_lib, models  # pylint: disable=g-import-not-at-top
  from ctr_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from ctr_jax.experiments import implicit_generation as generation
  ds = pipeline.load(config.data.name, config.data.data_dir or config_lib.default_data_dir(),
                     vocab_size=config.data.vocab_size)
  tok = ds.tokenizer
  prompts = [[tok.eot_id] + tok.encode(p) for p in config.prompts]  # as at a document start
  out = {}
  for name, family in config.families.items():
    model_cfg = models.model_config(**family.to_dict(), vocab_size=config.data.vocab_size)
    recipe = json.dumps([model_cfg.to_dict(), config.train.to_dict(), config.optim.to_dict(),
                         config.seed], sort_keys=True, default=str)
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    path = os.path.join(config.workdir, f'{name}_{digest}.msgpack')
    if os.path.exists(path):
      log(f'{name}: reusing the parameters trained earlier ({path})')
      model = models.build(model_cfg)
      template = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
      with open(path, 'rb') as f:
        variables = flax.serialization.from_bytes(template, f.read())
      loss = None
    else:
      log(f'{name}: training')
      _, variables, loss = generation.train(
          model_cfg, ds.train_tokens, steps=config.train.steps,
          batch_size=config.train.batch_size, seq_len=config.train.seq_len,
          optim_config=config.optim, seed=config.seed, log=log)
      with open(path, 'wb') as f:
        f.write(flax.serialization.to_bytes(variables))
    out[name] = (model_cfg, variables, loss)
  return out, prompts, tok.decode


def checkpoint_model(config):
  """The Hugging Face checkpoint and the paper's prompts in its own tokenizer."""
  from ctr_jax import hf  # pylint: disable=g-import-not-at-top
  _, variables = hf.load(config.hf_dir)
  hf_config = hf.read_config(config.hf_dir)
  tok = hf.load_tokenizer(config.hf_dir)
  if tok is None:
    raise ValueError(f'{config.hf_dir} has no tokenizer.json')
  bos = hf_config.get('bos_token_id')
  prompts = []
  for text in config.hf_prompts:
    if config.chat_template:
      text = f'<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n'
    ids = tok.encode(text).ids
    if bos is not None and (not ids or ids[0] != bos):
      ids = [bos] + ids
    prompts.append(ids)
  name = os.path.basename(os.path.normpath(config.hf_dir))
  model_cfg = hf.model_config_from_hf(hf_config)
  return {name: (model_cfg, variables, None)}, prompts, lambda ids: tok.decode(
      [int(i) for i in ids])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # dataset and backend INFO lines drown the report
  # pylint: disable-next=g-import-not-at-top
  from ctr_jax.experiments import implicit_generation as generation
  config = FLAGS.config
  os.makedirs(config.workdir, exist_ok=True)
  trained, prompts, decode = (checkpoint_model(config) if config.hf_dir
                              else small_models(config))
  results = {'machine': generation.machine(), 'command': ' '.join(sys.argv),
             'prompts': [decode(p) for p in prompts], 'families': {}}
  for name, (model_cfg, variables, loss) in trained.items():
    family = {'block': model_cfg.block, 'depth': model_cfg.depth, 'final_train_loss': loss,
              'generated': {}, 'runs': []}
    for dtype in config.dtypes:
      model, cast_vars = generation.cast(model_cfg, variables, dtype)
      tokens, lengths = generation.greedy_history(model, cast_vars, prompts, config.num_tokens)
      family['generated'][dtype] = [decode(tokens[i, n:n + config.num_tokens])
                                    for i, n in enumerate(lengths)]
      settings = generation.settings_for(model_cfg.block, model_cfg.depth, [dtype],
                                         config.methods, config.modes)
      log(f'{name} {dtype}: {len(settings)} settings x {len(prompts)} prompts x '
          f'{config.num_tokens} tokens')
      evaluated = generation.evaluate(model, cast_vars, tokens, lengths, config.num_tokens,
                                      settings, chunk=config.eval_batch)
      for setting, metrics in evaluated.items():
        summary = generation.summarise(metrics)
        log(f'  {setting}: ' + ', '.join(f'{k} {v:.3g}' for k, v in summary.items()))
        family['runs'].append({'setting': dataclasses.asdict(setting), 'summary': summary,
                               'per_step': {k: v.tolist() for k, v in metrics.items()}})
    results['families'][name] = family
  generation.write_report(results, config.workdir, config.figures_dir)
  log(f'wrote {config.workdir}/results.json and table.md; figures in '
      f'{config.figures_dir or config.workdir}')


if __name__ == '__main__':
  app.run(main)
