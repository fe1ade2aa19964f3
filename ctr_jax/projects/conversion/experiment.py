"""A real pretrained transformer converted to a context-ready model, then fine-tuned (issue 18).

For `ctr_jax.projects.conversion`; the command and its arguments are in
configs/convert_pretrained.py. The steps:
  1. convert: the whole pretrained stack becomes the recurrent unit (D = N) and a correction FFN
     is added with its output layer at zero (`convert.transformer_to_context_ready`), so the
     converted model's logits equal the original's; checked on held-out text, parallel K-unroll
     and the exact sequential scan;
  2. data: the embedded King James Bible in the model's own tokenizer, every
     `validation_every`-th chapter held out, windows of seq_len + 1 tokens;
  3. fine-tune the converted model and the unconverted one with the same windows in the same
     order, the same AdamW schedule and the same frozen parameters (the trainer's step and loss);
  4. validation perplexity of both before and after (the converted one by the parallel K-unroll
     and by the exact scan), and greedy samples through `decode.generate`.
"""

import dataclasses
import math
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from ctr_jax import models
from ctr_jax.data import kjv
from ctr_jax.inference import decode
from ctr_jax.models import convert
from ctr_jax.pretrained import gguf_reader
from ctr_jax.pretrained import packaged as pretrained
from ctr_jax.projects.conversion import report as conversion_report
from ctr_jax.reporting import machine
from ctr_jax.tasks import losses
from ctr_jax.training import optim, train_step

FREEZE = ('none', 'embed')  # 'embed': the token embedding table (also the tied head)


def validate(config) -> None:
  """Raises ValueError naming the config field that is out of range."""
  def check(ok, field, message):
    if not ok:
      raise ValueError(f'config.{field}: {message}')
  check(bool(config.gguf) or config.model in pretrained.MODELS, 'model',
        f'got {config.model!r}, allowed {sorted(pretrained.MODELS)} (or gguf=PATH)')
  check(config.freeze in FREEZE, 'freeze', f'got {config.freeze!r}, allowed {list(FREEZE)}')
  for field in ('steps', 'batch', 'seq_len', 'k', 'eval_windows', 'eval_batch', 'num_tokens',
                'validation_every'):
    check(int(config[field]) >= 1, field, f'must be a positive integer, got {config[field]!r}')
  check(config.validation_every >= 2, 'validation_every',
        f'must be >= 2 (1 would hold out every chapter), got {config.validation_every}')
  check(0 <= config.freeze_layers, 'freeze_layers',
        f'must be >= 0 (lowest blocks frozen), got {config.freeze_layers}')
  check(config.lr > 0, 'lr', f'must be > 0, got {config.lr}')
  check(0 <= config.warmup_steps <= config.steps, 'warmup_steps',
        f'must be in [0, steps={config.steps}], got {config.warmup_steps}')


def load_source(config):
  """(model, variables, tokenizer, name) of the pretrained transformer to convert."""
  if config.gguf:
    model, variables, tokenizer = gguf_reader.load_with_tokenizer(config.gguf)
    return model, variables, tokenizer, os.path.splitext(os.path.basename(config.gguf))[0]
  model, variables, tokenizer = pretrained.pretrained(config.model)
  return model, variables, tokenizer, config.model


def context_ready_config(spec, k: int):
  """The context-ready twin of a transformer's spec: same stack (D = N), 'add' correction."""
  fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
  return models.model_config(**{**fields, 'kind': 'context_ready', 'k_unroll': k,
                                'correction': 'add', 'cumulative': False})


# ------------------------------------------------------------------------------------------------
# Data: the embedded corpus in the model's tokenizer.
# ------------------------------------------------------------------------------------------------


def kjv_streams(tokenizer, validation_every: int, max_chapters: int = 0):
  """(train ids, validation ids): chapters in canonical order, every `validation_every`-th held
  out (as the kjv_bible dataset splits), each chapter followed by a blank line."""
  chapters = kjv.read_chapters()
  if max_chapters:
    chapters = chapters[:max_chapters]
  encoded = tokenizer.encode_batch([text + '\n\n' for _, _, text in chapters])
  train, held = [], []
  for i, enc in enumerate(encoded):
    (held if i % validation_every == validation_every - 1 else train).extend(enc.ids)
  return np.asarray(train, np.int32), np.asarray(held, np.int32)


def windows(ids: np.ndarray, length: int) -> np.ndarray:
  """Non-overlapping windows [N, length] of a token stream (the tail is dropped)."""
  n = len(ids) // length
  if n < 1:
    raise ValueError(f'a stream of {len(ids)} tokens holds no window of {length}')
  return ids[:n * length].reshape(n, length)


def batch_order(num_windows: int, steps: int, batch: int, seed: int) -> np.ndarray:
  """Window indices [steps, batch]: shuffled epochs, the same for every model trained."""
  rng = np.random.default_rng(seed)
  epochs = -(-steps * batch // num_windows)
  order = np.concatenate([rng.permutation(num_windows) for _ in range(epochs)])
  return order[:steps * batch].reshape(steps, batch)


# ------------------------------------------------------------------------------------------------
# Freezing and training.
# ------------------------------------------------------------------------------------------------


def frozen_labels(params, freeze: str, freeze_layers: int = 0):
  """'frozen' / 'train' per top-level subtree (and per block of the stack)."""
  def label(path, _):
    names = [getattr(k, 'key', '') for k in path]
    if freeze == 'embed' and names[0] == 'embed':
      return 'frozen'
    if names[0] == 'blocks' and int(names[1].rsplit('_', 1)[1]) < freeze_layers:
      return 'frozen'
    return 'train'
  return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(optim_config, steps: int, labels):
  """AdamW (`optim.make_optimizer`) on the trainable parameters; frozen ones never move (no
  weight decay either) and hold no moments."""
  return optax.multi_transform({'train': optim.make_optimizer(optim_config, steps),
                                'frozen': optax.set_to_zero()}, labels)


def stop_frozen(labels):
  """The parameters with the frozen ones behind stop_gradient, so the backward pass neither
  computes their gradients nor runs below the lowest trainable layer (transformer)."""
  return lambda params: jax.tree.map(
      lambda p, lab: jax.lax.stop_gradient(p) if lab == 'frozen' else p, params, labels)


def fine_tune(model, params, train_windows, order, *, optim_config, labels, k=None, seed=0,
              log=print, name=''):
  """Trains on train_windows[order[s]] at step s; returns (params, per-step losses, seconds,
  per-step seconds after the first)."""
  steps = len(order)
  tx = make_optimizer(optim_config, steps, labels)
  # The step donates its state; a copy keeps the caller's arrays (which the converted and the
  # original model share) alive.
  params = jax.tree.map(jnp.copy, params)
  state = train_step.init_state(params, tx)
  update = jax.jit(train_step.make_train_step(model, tx, losses.NextToken(),
                                              base_rng=jax.random.key(seed), deterministic=True,
                                              prepare_params=stop_frozen(labels)),
                   static_argnums=2, donate_argnums=0)
  history, step_times = [], []
  start = time.time()
  for s in range(steps):
    t = time.time()
    state, metrics = update(state, jnp.asarray(train_windows[order[s]]), k)
    history.append(float(metrics['ce_loss']))  # blocks: the step time is the whole step
    step_times.append(time.time() - t)
    if s == 0 or (s + 1) % max(steps // 10, 1) == 0 or s + 1 == steps:
      log(f'  {name} step {s + 1}/{steps}: ce {history[-1]:.4f} ({time.time() - start:.0f} s)')
  return state['params'], history, time.time() - start, step_times[1:]


# ------------------------------------------------------------------------------------------------
# Evaluation.
# ------------------------------------------------------------------------------------------------


def _logits_fn(model, mode: str, k=None):
  if mode == 'sequential':
    return lambda v, x: decode.sequential_logits(model, v, x)
  return jax.jit(lambda v, x: model.apply(v, x, k_unroll=k))


def validation_nll(model, variables, val_windows, *, mode='parallel', k=None, batch=8,
                   reference=None):
  """Mean next-token NLL (nats) over every window; `reference` (a callable of the token chunk,
  returning logits) also gives max |logit - reference| over every position."""
  logits_fn = _logits_fn(model, mode, k)
  total, count, worst = 0.0, 0, 0.0
  for s in range(0, len(val_windows), batch):
    chunk = jnp.asarray(val_windows[s:s + batch])
    logits = logits_fn(variables, chunk[:, :-1])
    ce, n = losses.next_token_loss(logits, chunk[:, 1:])
    total, count = total + float(ce) * int(n), count + int(n)
    if reference is not None:
      worst = max(worst, float(jnp.max(jnp.abs(logits - reference(chunk[:, :-1])))))
  return total / count, worst


def evaluate(tf_model, tf_vars, crt_model, crt_vars, val_windows, *, k, batch, step0=False):
  """Validation NLL of the transformer, the converted model's parallel K-unroll and its exact
  scan, and max |Δlogit| over every validation position: at step 0 of both converted modes
  against the transformer (all must be 0 up to rounding), after fine-tuning of the exact scan
  against the parallel K-unroll (how far K iterations are from the fixed point)."""
  out, times = {}, {}
  t = time.time()
  out['transformer'], _ = validation_nll(tf_model, tf_vars, val_windows, batch=batch)
  times['transformer'] = time.time() - t
  reference = None
  if step0:
    tf_logits = _logits_fn(tf_model, 'parallel')
    reference = lambda x: tf_logits(tf_vars, x)
  t = time.time()
  out['context_ready_parallel'], dlogit = validation_nll(
      crt_model, crt_vars, val_windows, k=k, batch=batch, reference=reference)
  times['context_ready_parallel'] = time.time() - t
  if step0:
    out['max_abs_dlogit_parallel_vs_transformer'] = dlogit
  else:
    crt_logits = _logits_fn(crt_model, 'parallel', k)
    reference = lambda x: crt_logits(crt_vars, x)
  t = time.time()
  out['context_ready_sequential'], dlogit = validation_nll(
      crt_model, crt_vars, val_windows, mode='sequential', batch=batch, reference=reference)
  times['context_ready_sequential'] = time.time() - t
  out['max_abs_dlogit_sequential_vs_' + ('transformer' if step0 else 'parallel')] = dlogit
  # How large the learnt correction is beside the embedding it is added to (first chunk).
  chunk = jnp.asarray(val_windows[:batch, :-1])
  c = crt_model.apply(crt_vars, chunk, k, method='correction_after')
  e = crt_model.apply(crt_vars, chunk, True, method='embed_tokens')
  out['rms_correction'] = float(jnp.sqrt(jnp.mean(jnp.square(c))))
  out['rms_embedding'] = float(jnp.sqrt(jnp.mean(jnp.square(e))))
  return out, times


def samples(model, variables, prompts, tokenizer, num_tokens: int):
  """Greedy continuations through `decode.generate` (a context-ready model: the exact scan)."""
  out = []
  for prompt in prompts:
    ids = jnp.asarray([tokenizer.encode(prompt).ids], jnp.int32)
    t = time.time()
    tokens = decode.generate(model, variables, ids, num_tokens, jax.random.key(0))
    new = [int(i) for i in np.asarray(tokens[0, ids.shape[1]:])]
    out.append({'prompt': prompt, 'text': tokenizer.decode(new), 'ids': new,
                'seconds': round(time.time() - t, 1)})
  return out


def perplexity(nll: float) -> float:
  return math.exp(nll)


# ------------------------------------------------------------------------------------------------
# The whole experiment and its report.
# ------------------------------------------------------------------------------------------------


def _optim_config(config):
  return ml_collections.ConfigDict(dict(
      lr=config.lr, warmup_steps=config.warmup_steps, min_lr_ratio=config.min_lr_ratio,
      weight_decay=config.weight_decay, b1=0.9, b2=0.95, eps=1e-8, grad_clip=1.0))


def _ppl(nlls: dict) -> dict:
  return {k: perplexity(v) for k, v in nlls.items() if not k.startswith(('max_abs', 'rms_'))}


def run(config, command: str, log=print) -> dict:
  """Runs the experiment of `config`; writes the json and the doc section; returns the results."""
  validate(config)
  t = time.time()
  tf_model, tf_vars, tokenizer, name = load_source(config)
  load_s = time.time() - t
  crt_cfg = context_ready_config(tf_model.spec, config.k)
  crt_model = models.build(crt_cfg)
  crt_vars = convert.transformer_to_context_ready(tf_vars, crt_cfg, jax.random.key(config.seed))
  added = models.count_params(crt_vars) - models.count_params(tf_vars)
  log(f'{name}: {tf_model.spec.depth} layers, width {tf_model.spec.width}; '
      f'{models.count_params(tf_vars):,} parameters, +{added:,} in the correction '
      f'(loaded in {load_s:.0f} s)')

  train_ids, val_ids = kjv_streams(tokenizer, config.validation_every, config.max_chapters)
  length = config.seq_len + 1
  train_windows = windows(train_ids, length)
  all_val = windows(val_ids, length)
  # Evenly spaced over the held-out chapters, not only the first few.
  pick = np.linspace(0, len(all_val) - 1, min(config.eval_windows, len(all_val))).astype(int)
  val_windows = all_val[np.unique(pick)]
  order = batch_order(len(train_windows), config.steps, config.batch, config.seed)
  log(f'data: {len(train_ids):,} train / {len(val_ids):,} validation tokens; '
      f'{len(train_windows)} train windows of {length}, {len(val_windows)} validation windows')

  t = time.time()
  before, before_s = evaluate(tf_model, tf_vars, crt_model, crt_vars, val_windows, k=config.k,
                              batch=config.eval_batch, step0=True)
  log('step 0: ' + ', '.join(f'{k} {v:.4g}' for k, v in before.items()) +
      f' ({time.time() - t:.0f} s)')
  samples_original = samples(tf_model, tf_vars, config.prompts, tokenizer, config.num_tokens)

  labels_tf = frozen_labels(tf_vars['params'], config.freeze, config.freeze_layers)
  labels_crt = frozen_labels(crt_vars['params'], config.freeze, config.freeze_layers)
  count = lambda params, labels, which: sum(
      int(np.prod(p.shape)) for p, lab in zip(jax.tree.leaves(params), jax.tree.leaves(labels))
      if lab == which)
  optim_config = _optim_config(config)
  trained = {}
  for key, model, params, labels, k in (
      ('transformer', tf_model, tf_vars['params'], labels_tf, None),
      ('context_ready', crt_model, crt_vars['params'], labels_crt, config.k)):
    log(f'fine-tuning the {key} ({count(params, labels, "train"):,} trainable, '
        f'{count(params, labels, "frozen"):,} frozen)')
    params, history, seconds, step_times = fine_tune(
        model, params, train_windows, order, optim_config=optim_config, labels=labels, k=k,
        seed=config.seed, log=log, name=key)
    trained[key] = {'variables': {'params': params},
                    'record': {'train_ce': history, 'seconds': round(seconds, 1),
                               'median_step_s': float(np.median(step_times)) if step_times
                               else None,
                               'trainable': count(params, labels, 'train'),
                               'frozen': count(params, labels, 'frozen')}}
  tf_ft, crt_ft = trained['transformer']['variables'], trained['context_ready']['variables']
  t = time.time()
  after, after_s = evaluate(tf_model, tf_ft, crt_model, crt_ft, val_windows, k=config.k,
                            batch=config.eval_batch)
  log('after: ' + ', '.join(f'{k} {v:.4g}' for k, v in after.items()) +
      f' ({time.time() - t:.0f} s)')
  results = {
      'command': command, 'machine': machine.summary_line(machine.describe()),
      'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
      'config': config.to_dict(), 'model': name,
      'source': {'depth': tf_model.spec.depth, 'width': tf_model.spec.width,
                 'vocab_size': tf_model.spec.vocab_size, 'block': tf_model.spec.block,
                 'tie_embeddings': tf_model.spec.tie_embeddings,
                 'params': models.count_params(tf_vars),
                 'correction_params': added,
                 'load_s': round(load_s, 1)},
      'data': {'train_tokens': len(train_ids), 'validation_tokens': len(val_ids),
               'train_windows': len(train_windows), 'validation_windows': len(val_windows),
               'window_tokens': length, 'train_tokens_seen': config.steps * config.batch * length},
      'step0': {'nll': before, 'ppl': _ppl(before), 'seconds': before_s},
      'final': {'nll': after, 'ppl': _ppl(after), 'seconds': after_s},
      'train': {k: v['record'] for k, v in trained.items()},
      'samples': {'original': samples_original,
                  'transformer': samples(tf_model, tf_ft, config.prompts, tokenizer,
                                         config.num_tokens),
                  'context_ready': samples(crt_model, crt_ft, config.prompts, tokenizer,
                                           config.num_tokens)},
  }
  conversion_report.write_report(results, config.docs_dir, name)
  return results
