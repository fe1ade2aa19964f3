"""Trained runs of ctr_jax.projects.reproduce, for the studies that evaluate after training (K
sweeps, exactness, conversion): a run's config and latest parameters, its validation batches as
its trainer saw them, the parallel unroll against the exact scan, and evaluations cached in the
workdir.
"""

import json
import math
import os

import jax.numpy as jnp

from ctr_jax import models
from ctr_jax.data import pipeline
from ctr_jax.inference import decode
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.tasks import losses
from ctr_jax.training import checkpointing


def load_config(workdir: str) -> dict | None:
  """The run's config.json as a dict (None before the run has written it)."""
  return repro_lib.read_json(os.path.join(workdir, 'config.json'))


def load_trained(workdir: str):
  """(model, params, config dict) of the latest checkpoint in `workdir`."""
  model_cfg, params = checkpointing.load_params(workdir)
  return models.build(model_cfg), params, load_config(workdir)


def validation_batches(config: dict, num_batches: int):
  """The run's validation batches (np int32 [B, T+1]), as its trainer evaluated them."""
  data = config['data']
  dataset = pipeline.load(data['name'], data_dir=data['data_dir'],
                          manual_dir=data['manual_dir'] or None,
                          vocab_size=config['model']['vocab_size'])
  return list(pipeline.eval_batches(dataset, seq_len=data['seq_len'],
                                    global_batch_size=config['batch_size'],
                                    num_batches=num_batches, process_index=0, process_count=1))


def parallel_vs_sequential(model, params, batches, k_unroll: int) -> dict:
  """PPL of the parallel K-unroll and of the exact scan on the same tokens, the largest logit
  difference and the fraction of positions whose argmax agrees."""
  sums = {'parallel': 0.0, 'sequential': 0.0}
  count, agree, max_diff = 0, 0, 0.0
  for batch in batches:
    batch = jnp.asarray(batch)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    par = model.apply({'params': params}, inputs, k_unroll=k_unroll)
    seq = decode.sequential_logits(model, {'params': params}, inputs)
    for name, logits in (('parallel', par), ('sequential', seq)):
      mean, n = losses.next_token_loss(logits, targets)
      sums[name] += float(mean) * int(n)
    count += int(targets.size)
    agree += int(jnp.sum(jnp.argmax(par, -1) == jnp.argmax(seq, -1)))
    max_diff = max(max_diff, float(jnp.max(jnp.abs(par - seq))))
  ppl = {k: math.exp(v / count) for k, v in sums.items()}
  return {'ppl_parallel': ppl['parallel'], 'ppl_sequential': ppl['sequential'],
          'abs_delta_ppl': abs(ppl['parallel'] - ppl['sequential']),
          'max_abs_logit_diff': max_diff, 'argmax_agreement': agree / count,
          'tokens': count, 'k_unroll': k_unroll}


def cached(path: str, compute):
  """compute()'s result, stored as JSON at `path` the first time (a finished run's evaluation
  does not change, and regenerating a report should not retrain or re-evaluate)."""
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  value = compute()
  with open(f'{path}.tmp', 'w') as f:
    json.dump(value, f, indent=1)
  os.replace(f'{path}.tmp', path)
  return value
