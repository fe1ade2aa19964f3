"""The pointer-chasing task for the trainer (reference section 7; `configs/pointer_chasing.py`).

Batches are generated on the fly from (seed, step): step s uses examples s*B .. s*B+B-1 of the
training stream, so the iterator state is just the number of batches consumed. The loss is the
cross-entropy AT every key position (the resolved base value), not a next-token loss. A
context-ready model with `train_mode='bptt'` trains through the exact sequential forward
(`ctr_jax.bptt`); otherwise through its parallel forward (the K-unroll, or a plain transformer).
"""

import jax.numpy as jnp

from ctr_jax import bptt, pointer_eval
from ctr_jax.data import pointer_chasing


class _BatchStream:
  """Endless, checkpointable stream of this process's share of each global batch."""

  def __init__(self, hops, global_batch_size, seed, process_index, process_count,
               **helper_targets):
    if global_batch_size % process_count:
      raise ValueError(f'config.batch_size={global_batch_size} is not divisible by the '
                       f'{process_count} processes')
    self.hops, self.global_batch, self.seed = hops, global_batch_size, seed
    self.helper_targets = helper_targets  # pointer_chasing.HELPER_TARGETS switches
    self.local = global_batch_size // process_count
    self.offset = process_index * self.local
    self.next_index = 0

  def __iter__(self):
    return self

  def __next__(self):
    start = self.next_index * self.global_batch + self.offset
    tokens, targets = pointer_chasing.batch(self.hops, self.local, self.seed, start=start,
                                            **self.helper_targets)
    self.next_index += 1
    return {'tokens': tokens, 'targets': targets}

  def get_state(self) -> dict:
    return {'next_index': self.next_index}

  def set_state(self, state: dict) -> None:
    self.next_index = int(state['next_index'])


class PointerChasing:
  """Pointer chasing with H = config.data.hops table levels."""

  def __init__(self, config, process_index: int, process_count: int):
    self.hops = config.data.hops
    expected_len = pointer_chasing.seq_len(self.hops)
    if config.data.seq_len != expected_len:
      raise ValueError(f'config.data.seq_len must be {expected_len} for hops={self.hops} '
                       f'(42H+2), got {config.data.seq_len}')
    vocab = pointer_chasing.vocab_size(self.hops)
    if config.model.vocab_size != vocab:
      raise ValueError(f'config.model.vocab_size must be {vocab} for hops={self.hops}, got '
                       f'{config.model.vocab_size}')
    # Helper targets only shape training; evaluation always scores the task's own targets.
    self.train_iter = _BatchStream(self.hops, config.batch_size, config.seed, process_index,
                                   process_count, **{h: bool(config.data.get(h, False))
                                                     for h in pointer_chasing.HELPER_TARGETS})
    self.eval_examples = config.eval_batches * config.batch_size
    self.final_examples = config.pointer_eval_examples
    self.batch_size = config.batch_size
    self.final = False

  @staticmethod
  def logits(model, params, tokens, *, k_unroll=None, rng=None, deterministic=True):
    if model.spec.is_context_ready and model.spec.train_mode == 'bptt':
      return bptt.bptt_logits(model, params, tokens)
    rngs = {'dropout': rng} if rng is not None else {}
    return model.apply({'params': params}, tokens, k_unroll=k_unroll, rngs=rngs,
                       deterministic=deterministic)

  def loss(self, model, params, batch, *, k_unroll, rng, deterministic):
    logits = self.logits(model, params, batch['tokens'], k_unroll=k_unroll, rng=rng,
                         deterministic=deterministic)
    loss = pointer_eval.loss_on_targets(logits, batch['targets'])
    zero = jnp.zeros((), jnp.float32)
    return loss, {'loss': loss, 'ce_loss': loss, 'convergence_loss': zero}

  def evaluate(self, model, params, *, to_global, sequential: bool) -> dict:
    """Per-level accuracy; the exact sequential model for a CRT, the forward for a transformer.

    Periodic evaluations use eval_batches * batch_size examples; the last one (after training)
    uses config.pointer_eval_examples (1,024 by default).
    """
    del to_global, sequential
    mode = 'sequential' if model.spec.is_context_ready else 'parallel'
    predict = pointer_eval.model_predictor(model, params, mode=mode)
    num = self.final_examples if self.final else self.eval_examples
    result = pointer_eval.evaluate(predict, self.hops, num_examples=num,
                                   batch_size=self.batch_size)
    out = {'level_accuracy': result['level_accuracy'],
           'final_query_accuracy': result['final_query_accuracy'],
           'table_key_accuracy': result['table_key_accuracy'],
           'table_level_accuracy': result['table_level_accuracy'],
           'levels_solved': pointer_eval.levels_solved(result['level_accuracy']),
           'eval_examples': num}
    return out
