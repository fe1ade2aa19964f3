"""The JAX measurements: training step, decode step, prefill (scan, parallel, chunked), scaling.

Each function builds its model from a model-config dict (the fields of
`ctr_jax.models.model_config`), times jitted work with `timing`, and returns a flat dict of
numbers that `report` turns into table rows.
"""

import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from ctr_jax import models
from ctr_jax.inference import decode
from ctr_jax.reporting import timing
from ctr_jax.tasks import losses
from ctr_jax.training import checkpointing, optim, train_step


def model_config(fields: dict):
  return models.model_config(**dict(fields))


# Model FLOPs per trained token (the MFU numerator); the trainer's metrics count them the same way.
training_flops_per_token = models.training_flops_per_token


def train_step_and_state(fields: dict, *, seq_len: int, batch: int, k_unroll: int,
                         grad_iterations: int = 0, remat: bool = False):
  """The trainer's own step (`train_step.make_train_step` with the language-modelling loss,
  AdamW, clipping and the norm metrics), jitted and donated as the trainer does, with a fresh
  state and one batch: `(step, state, tokens, cfg, k)`; `step(state, tokens)` returns the next
  state and the metrics. The benchmark and `ctr_jax.projects.perf.profile_training` time this same step.

  grad_iterations: backpropagate through the last m of the K iterations only
  (`config.train.grad_iterations`; 0 = all). remat: rematerialise each fixed-point iteration
  in the backward pass (`config.train.remat`)."""
  cfg = model_config(fields)
  model = models.build(cfg)
  optim_config = ml_collections.ConfigDict({'lr': 1e-4, 'warmup_steps': 0, 'min_lr_ratio': 1.0,
                                            'grad_clip': 1.0, 'b1': 0.9, 'b2': 0.95,
                                            'eps': 1e-8, 'weight_decay': 0.1})
  tx = optim.make_optimizer(optim_config, 1000)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, seq_len), jnp.int32))['params']
  state = train_step.init_state(params, tx)
  k = k_unroll if cfg.kind == 'context_ready' else None
  step_fn = train_step.make_train_step(
      model, tx, losses.NextToken(),
      recipe=train_step.Recipe(grad_iterations=grad_iterations, remat=bool(remat)),
      base_rng=jax.random.key(1), deterministic=cfg.dropout == 0)
  step = jax.jit(functools.partial(step_fn, k_unroll=k), donate_argnums=0)
  tokens = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, cfg.vocab_size)
  return step, state, tokens, cfg, k


def train_step_runner(fields: dict, *, seq_len: int, batch: int, k_unroll: int,
                      grad_iterations: int = 0, remat: bool = False):
  """A zero-argument callable that runs one training step (the state carried inside) and
  returns its loss, with the model config and K: `(run, cfg, k)`.

  The step is compiled ahead of time, so `run.compile_seconds` and `run.memory` (XLA's
  per-device bytes: `temp_bytes` and `needed_bytes`, arguments + outputs - aliased + temporaries)
  are known before the first step runs."""
  step, state, tokens, cfg, k = train_step_and_state(
      fields, seq_len=seq_len, batch=batch, k_unroll=k_unroll, grad_iterations=grad_iterations,
      remat=remat)
  start = time.perf_counter()
  step = step.lower(state, tokens).compile()
  compile_seconds = time.perf_counter() - start
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], tokens)
    return metrics['loss']

  run.params = lambda: holder[0]['params']
  run.compile_seconds = compile_seconds
  run.memory = compiled_memory(step)
  return run, cfg, k


def compiled_memory(compiled) -> dict:
  """XLA's per-device memory estimate of a compiled computation, {} where it gives none."""
  try:
    m = compiled.memory_analysis()
  except (NotImplementedError, AttributeError, RuntimeError):
    return {}
  if m is None:
    return {}
  needed = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes)
  return {'temp_bytes': int(m.temp_size_in_bytes), 'needed_bytes': int(needed)}


def device_memory_limit() -> int | None:
  """Bytes the first device's allocator may hold (`memory_stats()['bytes_limit']`); None on a
  backend that does not say (XLA:CPU)."""
  try:
    stats = jax.devices()[0].memory_stats()
  except (NotImplementedError, RuntimeError):
    return None
  return (stats or {}).get('bytes_limit')


def is_out_of_memory(error: BaseException) -> bool:
  """An XLA allocation failure (compilation or run), as opposed to any other error."""
  text = str(error)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


def train_throughput(fields: dict, *, seq_len: int, batch: int, k_unroll: int, warmup: int,
                     repeats: int, grad_iterations: int = 0, runner=None) -> dict:
  """Tokens/s of `train_step_and_state`'s step, medians after warm-up.

  runner: a `train_step_runner(...)` result of these same arguments, to time a step that is
  already compiled (the bench reuses its peer-shape row's step for the paired rounds)."""
  run, cfg, k = runner or train_step_runner(fields, seq_len=seq_len, batch=batch,
                                            k_unroll=k_unroll, grad_iterations=grad_iterations)
  seconds = timing.median_seconds(run, warmup=warmup, repeats=repeats)
  flops = training_flops_per_token(cfg, seq_len, k or 1, grad_iterations)
  return {'step_ms': 1e3 * seconds, 'tokens_per_second': batch * seq_len / seconds,
          'flops_per_token': flops, 'params': models.count_params(run.params())}


def decode_bytes_per_step(spec, params, batch: int, context: float) -> float:
  """Bytes a decode step must read at least: every weight once (the embedding table only for
  the B looked-up rows unless it is also the head) plus the KV cache of `context` positions."""
  s = models.spec_of(spec)
  itemsize = jnp.dtype(s.param_dtype).itemsize
  weights = models.count_params(params)
  if not s.tie_embeddings:
    weights -= s.vocab_size * s.width - batch * s.width
  cache = 2 * s.depth * context * s.num_kv_heads * s.head_dim * batch
  return itemsize * weights + jnp.dtype(s.dtype).itemsize * cache


def decode_latency(fields: dict, *, batch: int, prompt_len: int, new_tokens: int, warmup: int,
                   repeats: int) -> dict:
  """Marginal ms per decode step (one token for each of the B sequences), greedy.

  The prompt is prefilled once, outside the timing; `decode.continue_generation` then runs 1 and
  1 + new_tokens steps from that state and the difference cancels the per-call overhead. (Timing
  whole `generate` calls instead buried the steps under the prefill's run-to-run noise at long
  prompts: a 4,096-token prefill takes seconds.)
  """
  cfg = model_config(fields)
  model = models.build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  prompt = jax.random.randint(jax.random.key(1), (batch, prompt_len), 0, cfg.vocab_size)
  logits, state = decode.prefill(model, variables, prompt, prompt_len + 1 + new_tokens)
  last_logits = logits[:, -1]
  run = lambda n: decode.continue_generation(model, variables, last_logits, state, n,
                                             jax.random.key(2), jnp.float32(0))
  seconds = timing.per_item_seconds(run, 1, 1 + new_tokens, warmup=warmup, repeats=repeats)
  context = prompt_len + new_tokens / 2
  return {'ms_per_token': 1e3 * seconds,
          'bytes_per_step': decode_bytes_per_step(cfg, variables['params'], batch, context),
          'params': models.count_params(variables)}


def generate_runner(fields: dict, *, batch: int, prompt_len: int):
  """`(call, params)`: `call(n)` is `decode.generate` of n greedy tokens after a random
  `prompt_len`-token prompt at batch `batch`, fetched to the host, as a user calls it."""
  cfg = model_config(fields)
  model = models.build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  prompt = jax.random.randint(jax.random.key(1), (batch, prompt_len), 0, cfg.vocab_size)
  call = lambda n: np.asarray(decode.generate(model, variables, prompt, n, jax.random.key(2)))
  return call, models.count_params(variables)


def _model_and_prompt(fields: dict, prompt_len: int, params=None):
  """The model of `fields`, its variables (`params`, else a fixed initialisation) and a fixed
  random prompt of `prompt_len` tokens, batch 1."""
  cfg = model_config(fields)
  model = models.build(cfg)
  if params is None:
    params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  prompt = jax.random.randint(jax.random.key(1), (1, prompt_len), 0, cfg.vocab_size)
  return model, {'params': params}, prompt


def prefill_comparison(fields: dict, *, prompt_len: int, tolerance: float, warmup: int,
                       repeats: int, params=None) -> dict:
  """Sequential prefill (position scan) vs parallel prefill (fixed-point to `tolerance`)."""
  model, variables, prompt = _model_and_prompt(fields, prompt_len, params)
  length = prompt_len + 1
  sequential = lambda: decode.prefill(model, variables, prompt, length)[0]
  parallel = lambda: decode.parallel_prefill(model, variables, prompt, length, tolerance)
  t_seq = timing.median_seconds(sequential, warmup=warmup, repeats=repeats)
  t_par = timing.median_seconds(parallel, warmup=warmup, repeats=repeats)
  logits, _, iterations = parallel()
  diff = float(jnp.max(jnp.abs(logits - sequential())))
  return {'sequential_ms': 1e3 * t_seq, 'parallel_ms': 1e3 * t_par, 'speedup': t_seq / t_par,
          'iterations': int(iterations), 'max_abs_logit_diff': diff}


FIRST_TOKEN_METHODS = {'context_ready': ('scan', 'chunked', 'parallel'),
                       'transformer': ('parallel',)}


class FirstToken:
  """Time to the first token of one model (random weights) after one random prompt [1, T0]:
  the prefill and the greedy pick from its last logits, fetched to the host.

  Methods: 'scan' (a context-ready model's exact position scan, `decode.prefill`), 'chunked'
  (`decode.chunked_prefill`: the fixed point over `chunk` positions at a time, at most `passes`
  passes per chunk or until max |c_new - c| <= `tolerance`) and 'parallel' (a transformer's one
  pass over the prompt, `decode.prefill`; for a context-ready model the fixed point over the
  whole prompt, `decode.parallel_prefill` to `tolerance`).
  """

  def __init__(self, fields: dict, *, prompt_len: int):
    self.cfg = model_config(fields)
    self.model = models.build(self.cfg)
    self.variables = jax.jit(self.model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
    self.prompt = jax.random.randint(jax.random.key(1), (1, prompt_len), 0, self.cfg.vocab_size)
    self.prompt_len = prompt_len
    self.length = prompt_len + 1

  def call(self, method: str, *, chunk: int = 0, passes: int = 0, tolerance: float = 0.0):
    """A zero-argument callable: (first token [1] on the host, last logits [1, V], block passes
    run one after the other: per chunk for 'chunked', in all for 'parallel', and for 'scan' T0,
    one per position)."""
    allowed = FIRST_TOKEN_METHODS[self.cfg.kind]
    if method not in allowed:
      raise ValueError(f'bench.ttft: method {method!r} is not one for a {self.cfg.kind} model, '
                       f'allowed {list(allowed)}')
    m, v, prompt, length = self.model, self.variables, self.prompt, self.length
    if method == 'chunked':
      fill = lambda: decode.chunked_prefill(m, v, prompt, length, chunk=min(chunk, self.prompt_len),
                                            passes=passes or None, tolerance=tolerance)
    elif method == 'parallel' and self.cfg.kind == 'context_ready':
      fill = lambda: decode.parallel_prefill(m, v, prompt, length, tolerance)
    else:
      positions = self.prompt_len if method == 'scan' else 1
      fill = lambda: (*decode.prefill(m, v, prompt, length), jnp.full((1,), positions))

    def run():
      logits, _, used = fill()
      last = logits[:, -1]
      return np.asarray(jnp.argmax(last, axis=-1)), last, used

    return run

  def measure(self, method: str, *, warmup: int, repeats: int, chunk: int = 0, passes: int = 0,
              tolerance: float = 0.0) -> dict:
    run = self.call(method, chunk=chunk, passes=passes, tolerance=tolerance)
    seconds = timing.median_seconds(lambda: run()[1], warmup=warmup, repeats=repeats)
    token, last, used = run()
    used = np.atleast_1d(np.asarray(used))
    row = {'ms': 1e3 * seconds, 'first_token': int(token[0]), 'last_logits': last,
           'sequential_passes': int(used.sum())}
    if method == 'chunked':
      row.update(chunks=len(used), passes_mean=float(used.mean()), passes_max=int(used.max()))
    return row


def load_checkpoint(workdir: str, field: str = 'bench.chunked.checkpoint'):
  """(model-config fields, params) of the latest checkpoint of a training run's workdir; errors
  name `field`, the setting that gave the workdir."""
  config_path = os.path.join(workdir, 'config.json')
  if not os.path.exists(config_path):
    raise ValueError(f'{field}: {workdir!r} holds no config.json (give the '
                     'workdir of a training run, e.g. /tmp/ctr_quickstart)')
  if not checkpointing.steps(workdir):
    raise ValueError(f'{field}: {workdir!r} holds no checkpoint')
  model_cfg, params = checkpointing.load_params(workdir)
  return model_cfg.to_dict(), params


def chunked_prefill_comparison(fields: dict, *, prompt_len: int, chunks, passes, tolerance: float,
                               tolerance_passes: int, warmup: int, repeats: int,
                               params=None) -> dict:
  """The position scan (`decode.prefill`) vs `decode.chunked_prefill` on one prompt.

  One row per chunk size and pass count (counts above the chunk are skipped: the chunk's own
  count is already exact), and, if `tolerance` > 0, one per chunk size in the tolerance mode,
  at most `tolerance_passes` passes. Both sides compute the logits of every prompt position;
  max |Δlogit| is against the scan's.
  """
  model, variables, prompt = _model_and_prompt(fields, prompt_len, params)
  length = prompt_len + 1
  scan = lambda: decode.prefill(model, variables, prompt, length)[0]
  t_scan = timing.median_seconds(scan, warmup=warmup, repeats=repeats)
  reference = scan()
  rows = []
  for chunk in chunks:
    settings = [(p, 0.0) for p in passes if p <= chunk]
    if tolerance > 0:
      settings.append((min(tolerance_passes, chunk), tolerance))
    for count, tol in settings:
      run = functools.partial(decode.chunked_prefill, model, variables, prompt, length,
                              chunk=chunk, passes=count, tolerance=tol)
      seconds = timing.median_seconds(run, warmup=warmup, repeats=repeats)
      logits, _, used = run()
      rows.append({'chunk': chunk, 'passes': count, 'tolerance': tol, 'ms': 1e3 * seconds,
                   'speedup': t_scan / seconds, 'passes_mean': float(jnp.mean(used)),
                   'passes_max': int(jnp.max(used)), 'exact_bound': count >= chunk,
                   'max_abs_logit_diff': float(jnp.max(jnp.abs(logits - reference)))})
  return {'scan_ms': 1e3 * t_scan, 'rows': rows, 'params': models.count_params(params)}


def train_scaling(fields: dict, *, batch: int, seq_lens, k_values, warmup: int,
                  repeats: int) -> dict:
  """Step time against K (at the largest T) and against T (at the largest K)."""
  t_fixed, k_fixed = max(seq_lens), max(k_values)
  by_k = {k: train_throughput(fields, seq_len=t_fixed, batch=batch, k_unroll=k, warmup=warmup,
                              repeats=repeats)['step_ms'] for k in k_values}
  by_t = {t: train_throughput(fields, seq_len=t, batch=batch, k_unroll=k_fixed, warmup=warmup,
                              repeats=repeats)['step_ms'] for t in seq_lens}
  return {'by_k': by_k, 'by_t': by_t, 't_fixed': t_fixed, 'k_fixed': k_fixed,
          'k_exponent': timing.power_law_exponent(list(by_k), list(by_k.values())),
          't_exponent': timing.power_law_exponent(list(by_t), list(by_t.values()))}


def decode_scaling(fields: dict, *, contexts, new_tokens: int, warmup: int, repeats: int) -> dict:
  """Batch-1 decode ms/token against the context (prompt) length."""
  by_context = {n: decode_latency(fields, batch=1, prompt_len=n, new_tokens=new_tokens,
                                  warmup=warmup, repeats=repeats)['ms_per_token']
                for n in contexts}
  return {'by_context': by_context,
          'exponent': timing.power_law_exponent(list(by_context), list(by_context.values()))}

