"""The implicit-update generation experiment; the command is in configs/implicit_generation.py.

Writes `results.json` and `table.md` to the workdir, three figures to the figures directory,
and (unless `quick`) the results json under docs/implicit_generation/ and its generated section
of docs/implicit_updates.md.
"""

import dataclasses
import hashlib
import json
import os
import sys
import time

from absl import app, flags, logging
import flax.serialization
import jax
import jax.numpy as jnp
from ml_collections import config_flags

from ctr_jax import models
from ctr_jax.data import pipeline
from ctr_jax.pretrained import hf, pretrained
from ctr_jax.projects.implicit_generation import experiment as generation
from ctr_jax.projects.implicit_generation import report

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'configs/implicit_generation.py[:arg]',
                                lock_config=True)
flags.mark_flags_as_required(['config'])


def log(message):
  print(message, flush=True)


def small_models(config):
  """Trains the small models on the embedded corpus, or reloads them from the workdir."""
  # pylint: disable-next=g-import-not-at-top
  ds = pipeline.load(config.data.name, config.data.data_dir,
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
    out[name] = (models.build(model_cfg), variables, loss)
  return out, prompts, tok.decode


def format_prompt(text: str, prompt_format: str) -> str:
  if prompt_format == 'plain':
    return text
  if prompt_format == 'chatml':
    return f'<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n'
  if prompt_format == 'gemma_chat':
    return f'<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n'
  raise ValueError(f"prompt_format={prompt_format!r}: expected one of "
                   "['plain', 'chatml', 'gemma_chat']")


def _encode(tok, texts, prompt_format, bos):
  prompts = []
  for text in texts:
    ids = tok.encode(format_prompt(text, prompt_format)).ids
    if bos is not None and (not ids or ids[0] != bos):
      ids = [bos] + ids
    prompts.append(ids)
  return prompts


def checkpoint_model(config):
  """The Hugging Face checkpoint and the paper's prompts in its own tokenizer."""
  _, variables = hf.load(config.hf_dir)
  hf_config = hf.read_config(config.hf_dir)
  tok = hf.load_tokenizer(config.hf_dir)
  if tok is None:
    raise ValueError(f'{config.hf_dir} has no tokenizer.json')
  prompts = _encode(tok, config.hf_prompts, config.prompt_format, hf_config.get('bos_token_id'))
  name = os.path.basename(os.path.normpath(config.hf_dir))
  model = models.build(hf.model_config_from_hf(hf_config))
  return {name: (model, variables, None)}, prompts, lambda ids: tok.decode(
      [int(i) for i in ids])


def pretrained_model(config):
  """A packaged pretrained model (float32 weights) and the paper's prompts in its tokenizer,
  which adds BOS itself where the model expects one (Gemma) and not otherwise (SmolLM2)."""
  start = time.time()
  model, variables, tok = pretrained(config.model)
  log(f'{config.model}: loaded in {time.time() - start:.0f} s')
  prompts = _encode(tok, config.hf_prompts, config.prompt_format, None)
  return {config.model: (model, variables, None)}, prompts, lambda ids: tok.decode(
      [int(i) for i in ids])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # dataset and backend INFO lines drown the report

  # pylint: enable=g-import-not-at-top
  config = FLAGS.config
  format_prompt('', config.prompt_format)  # validates it before anything slow runs
  start = time.time()
  os.makedirs(config.workdir, exist_ok=True)
  if config.model:
    trained, prompts, decode = pretrained_model(config)
  elif config.hf_dir:
    trained, prompts, decode = checkpoint_model(config)
  else:
    trained, prompts, decode = small_models(config)
  results = {'machine': generation.machine(), 'command': ' '.join(['python -m ctr_jax.projects.implicit_generation', *sys.argv[1:]]),
             'prompt_format': config.prompt_format if (config.model or config.hf_dir)
                              else 'plain, after <|endoftext|>',
             'prompts': [decode(p) for p in prompts], 'prompt_ids': prompts, 'families': {}}
  if config.intervals:
    results['intervals_run'] = {'first_layers': list(config.first_layers),
                                'loops': list(config.loops), 'modes': list(config.modes),
                                'separate_pass': config.separate_pass}
  materialise_firsts = tuple(config.materialise_first_layers) or None
  for name, (model32, variables, loss) in trained.items():
    spec = model32.spec
    family = {'label': config.labels.get(name, name), 'block': spec.block, 'depth': spec.depth,
              'width': spec.width, 'mlp_dim': spec.mlp_dim, 'final_train_loss': loss,
              'generated': {}, 'runs': []}
    for dtype in config.dtypes:
      model, cast_vars = generation.cast(model32, variables, dtype)
      t0 = time.time()
      baseline = generation.greedy_baseline(model, cast_vars, prompts, config.num_tokens)
      family['generated'][dtype] = [decode(baseline.tokens[i, n:n + config.num_tokens])
                                    for i, n in enumerate(baseline.lengths)]
      settings = generation.settings_for(spec.block, spec.depth, [dtype], config.methods,
                                         config.modes, materialise_firsts,
                                         first_layers=tuple(config.first_layers) or None,
                                         loops=tuple(config.loops))
      log(f'{name} {dtype}: baseline {time.time() - t0:.0f} s; {len(settings)} settings x '
          f'{len(prompts)} prompts x {config.num_tokens} tokens')
      evaluated = generation.evaluate(model, cast_vars, baseline, settings,
                                      chunk=config.eval_batch,
                                      budget_gb=config.memory_budget_gb, log=log,
                                      separate_pass=config.separate_pass)
      for setting, metrics in evaluated.items():
        layers, seconds = metrics.pop('layers'), metrics.pop('seconds')
        summary = generation.summarise(metrics)
        log(f'  {setting}: ' + ', '.join(f'{k} {v:.3g}' for k, v in summary.items()))
        family['runs'].append({'setting': dataclasses.asdict(setting), 'summary': summary,
                               'seconds': seconds, 'dm_layers': generation.dm_layers(layers),
                               'per_step': {k: v.tolist() for k, v in metrics.items()}})
      del baseline, evaluated
    if config.intervals:
      family['intervals'] = generation.interval_summary(
          family['runs'], resamples=config.bootstrap_resamples, seed=config.seed)
    results['families'][name] = family
  results['wall_s'] = time.time() - start
  report.write_report(results, config.workdir, config.figures_dir,
                      figure_prefix=config.figure_prefix, results_json=config.results_json,
                      doc=config.doc, section=config.doc_section)
  log(f'wrote {config.workdir}/results.json and table.md'
      + (f', {config.results_json} and its section of {config.doc}' if config.doc else '')
      + f'; figures in {config.figures_dir or config.workdir}')


if __name__ == '__main__':
  app.run(main)
