"""Language modelling: next-token prediction on a tokenized corpus (KJV, OpenWebText, Wikipedia).

The task for the trainer (`LanguageModelling`), and the evaluation pieces notebooks use alone:
validation loss / perplexity in parallel-K and exact sequential mode (`evaluate_lm`), and text
samples (`sample_text`).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.data import pipeline
from ctr_jax.inference import decode
from ctr_jax.tasks import losses
from ctr_jax.tasks.registry import check_batch_tokens, register


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _batch_loss_sum(model, params, batch, k_unroll, sequential):
  inputs, targets = batch[:, :-1], batch[:, 1:]
  variables = {'params': params}
  if sequential:
    logits = decode.sequential_logits(model, variables, inputs)
  else:
    logits = model.apply(variables, inputs, k_unroll=k_unroll)
  mean, count = losses.next_token_loss(logits, targets)
  return mean * count, count


def evaluate_lm(model, params, batches, *, k_unroll=None, sequential=False, to_global=None):
  """Mean next-token loss and perplexity over `batches` (np int32 [B, T+1] each)."""
  total, count = 0.0, 0
  for batch in batches:
    check_batch_tokens(batch, losses.NextToken().inputs, model.spec.vocab_size,
                       'an evaluation batch')
    batch = to_global(batch) if to_global else jnp.asarray(batch)
    s, n = _batch_loss_sum(model, params, batch, k_unroll, sequential)
    total += float(s)
    count += int(n)
  loss = total / max(count, 1)
  return {'loss': loss, 'ppl': math.exp(min(loss, 50.0)), 'tokens': count}


def sample_text(model, params, tokenizer, prompt: str, num_tokens: int, rng, *,
                temperature: float = 0.8, top_k: int = 40) -> str:
  """Continues `prompt` with the exact sequential decoder and returns the decoded text."""
  ids = _prompt_ids(tokenizer, prompt)
  prompt_ids = jnp.asarray(np.array(ids, np.int32)[None])
  out = decode.generate(model, {'params': params}, prompt_ids, num_tokens, rng,
                        temperature=temperature, top_k=top_k)
  return tokenizer.decode([int(t) for t in np.asarray(out[0])])


def _prompt_ids(tokenizer, prompt: str) -> list[int]:
  return tokenizer.encode(prompt) or [tokenizer.eot_id]


def check_sample_length(tokenizer, prompt: str, num_tokens: int, max_len: int) -> None:
  """A ValueError naming config.sample.prompt when its tokens and `num_tokens` more exceed
  `max_len` (checked when the task is made, not after training)."""
  prompt_len = len(_prompt_ids(tokenizer, prompt))
  if prompt_len + num_tokens > max_len:
    raise ValueError(f'config.sample.prompt: {prompt_len} tokens and config.sample.num_tokens='
                     f'{num_tokens} make {prompt_len + num_tokens} positions, more than '
                     f'config.model.max_len={max_len}; shorten the prompt or lower num_tokens')


def validate_lm_config(config) -> None:
  """Data fields the pipeline cannot use, refused before the workdir is touched."""
  pipeline.check_locations(config.data.data_dir, config.data.manual_dir)
  workers = config.data.get('num_workers', 0)
  if not isinstance(workers, int) or workers < 0:
    raise ValueError(f'config.data.num_workers: must be an integer >= 0 (0 = every core), got '
                     f'{workers!r}')


@register('kjv_bible', 'openwebtext', 'wikipedia', validate_config=validate_lm_config)
class LanguageModelling:
  """Next-token prediction: `losses.NextToken` with the config's convergence weight."""

  # The names metrics.jsonl has always used for the LM loss terms.
  metric_names = {'loss': 'train_loss', 'ce_loss': 'train_ce',
                  'convergence_loss': 'convergence_loss'}
  has_sample = True

  def __init__(self, config, process_index: int, process_count: int):
    data = config.data
    self.dataset = pipeline.load(data.name, data_dir=data.data_dir,
                                 manual_dir=data.manual_dir or None,
                                 vocab_size=config.model.vocab_size,
                                 num_workers=data.get('num_workers', 0),
                                 progress=process_index == 0)
    self.tokenizer = self.dataset.tokenizer
    if config.sample.num_tokens > 0:  # a sample after training must fit model.max_len
      check_sample_length(self.tokenizer, config.sample.prompt, config.sample.num_tokens,
                          config.model.max_len)
    self.train_iter = pipeline.train_iterator(
        self.dataset, seq_len=data.seq_len, global_batch_size=config.batch_size, seed=config.seed,
        process_index=process_index, process_count=process_count)
    num = config.eval_batches if config.eval_batches > 0 else None
    self.eval_batches = pipeline.eval_batches(
        self.dataset, seq_len=data.seq_len, global_batch_size=config.batch_size,
        num_batches=num, process_index=process_index, process_count=process_count)
    self.objective = self.abstract(config)[0]
    # The exact scan exists for a context-ready model unless it is the cumulative ablation.
    self.sequential = (config.eval_sequential and config.model.kind == 'context_ready'
                       and not config.model.cumulative)

  @classmethod
  def abstract(cls, config):
    """(NextToken objective, int32 [B, T+1] windows): the training batch without the corpus."""
    return (losses.NextToken(config.train.convergence_weight),
            jax.ShapeDtypeStruct((config.batch_size, config.data.seq_len + 1), jnp.int32))

  def inputs(self, batch):
    return self.objective.inputs(batch)

  def loss(self, logits, aux, batch):
    return self.objective.loss(logits, aux, batch)

  def evaluate(self, model, params, *, to_global, final: bool) -> dict:
    """{'val_loss', 'val_ppl'} (+ '_sequential' keys for the exact scan of a CRT)."""
    del final  # the same validation batches every time
    out = {}
    par = evaluate_lm(model, params, self.eval_batches, to_global=to_global)
    out['val_loss'], out['val_ppl'] = par['loss'], par['ppl']
    if self.sequential:
      seq = evaluate_lm(model, params, self.eval_batches, to_global=to_global, sequential=True)
      out['val_loss_sequential'], out['val_ppl_sequential'] = seq['loss'], seq['ppl']
    return out

  def stop_early(self, evaluation: dict) -> bool:
    del evaluation
    return False  # a language model trains its whole schedule

  def sample(self, model, params, config, rng) -> str:
    return sample_text(model, params, self.tokenizer, config.sample.prompt,
                       config.sample.num_tokens, rng, temperature=config.sample.temperature,
                       top_k=config.sample.top_k)
