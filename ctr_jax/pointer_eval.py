"""Per-level evaluation on pointer chasing (reference section 7): which levels a model resolves.

Accuracy is the argmax prediction AT each key position against that position's target (the
resolved base value), grouped by what the position is: the query section of each level L0..L(H-1)
(a level-L query needs L index lookups plus one base lookup), the final query, and the table keys.
Chance is 1/16; the author counts a level as solved above 90%.

    metrics = pointer_eval.evaluate(predict, hops=3)      # predict: tokens [B, T] -> logits
    pointer_eval.levels_solved(metrics['level_accuracy'])
"""

from collections.abc import Callable, Mapping

import jax
import numpy as np

from ctr_jax import decode, losses
from ctr_jax.data import pointer_chasing

DEFAULT_NUM_EXAMPLES = 1024
PASS_THRESHOLD = 0.9


def loss_on_targets(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean cross-entropy of logits [B, T, V] against the targets [B, T] AT the same positions.

  Positions with target < 0 (everything but the key tokens) are ignored. Not a next-token loss:
  pointer chasing asks for the resolved value of the key being read, so logits[t] meets targets[t].
  """
  return losses.next_token_loss(logits, targets)[0]


def model_predictor(model, params, *, mode: str = 'sequential', k_unroll: int | None = None):
  """A jitted `predict(tokens [B, T]) -> logits [B, T, V]` for `evaluate`.

  mode 'sequential': the exact position scan (what BPTT trains); 'parallel': the model's parallel
  forward with `k_unroll` fixed-point iterations (ignored by transformers).
  """
  variables = {'params': params}
  if mode == 'sequential':
    return lambda tokens: decode.sequential_logits(model, variables, tokens)
  if mode == 'parallel':
    return jax.jit(lambda tokens: model.apply(variables, tokens, k_unroll=k_unroll))
  raise ValueError(f"mode must be 'sequential' or 'parallel', got {mode!r}")


def evaluate(predict: Callable, hops: int, *, num_examples: int = DEFAULT_NUM_EXAMPLES,
             batch_size: int = 64, seed: int = pointer_chasing.EVAL_SEED) -> dict:
  """Accuracies of `predict` on `num_examples` fresh examples of stream `seed`.

  Args:
    predict: tokens int32 [B, T] -> logits [B, T, V] or predicted token ids [B, T]. It is always
      called with full batches of `batch_size` (the last one padded), so a jitted function
      compiles once.
    hops: table levels H.
    num_examples: examples to score.
    batch_size: examples per `predict` call.
    seed: example stream; the default `EVAL_SEED` is disjoint from every training seed (>= 0).

  Returns:
    {'level_accuracy': {'L0': float, ..., 'L<H-1>': float},   # query sections
     'final_query_accuracy': float,
     'table_key_accuracy': float,                             # table keys, all levels
     'table_level_accuracy': {'L0': float, ...},              # table keys, per level
     'num_examples': int}
  """
  if num_examples < 1 or batch_size < 1:
    raise ValueError(f'need num_examples >= 1 and batch_size >= 1, got {num_examples}, '
                     f'{batch_size}')
  labels = pointer_chasing.position_labels(hops)
  correct = np.zeros(len(labels.kind), np.int64)  # per position, summed over examples
  for start in range(0, num_examples, batch_size):
    count = min(batch_size, num_examples - start)
    tokens, targets = pointer_chasing.batch(hops, batch_size, seed, start=start)
    out = np.asarray(predict(tokens))
    predictions = out.argmax(axis=-1) if out.ndim == 3 else out
    if predictions.shape != tokens.shape:
      raise ValueError(f'predict returned shape {out.shape} for tokens of shape {tokens.shape}')
    correct += np.sum(predictions[:count] == targets[:count], axis=0)

  def accuracy(kind, level=None):
    where = labels.kind == kind
    if level is not None:
      where &= labels.level == level
    return float(correct[where].sum() / (where.sum() * num_examples))

  levels = range(hops)
  return {
      'level_accuracy': {f'L{lvl}': accuracy(pointer_chasing.QUERY_KEY, lvl) for lvl in levels},
      'final_query_accuracy': accuracy(pointer_chasing.FINAL_QUERY),
      'table_key_accuracy': accuracy(pointer_chasing.TABLE_KEY),
      'table_level_accuracy': {f'L{lvl}': accuracy(pointer_chasing.TABLE_KEY, lvl)
                               for lvl in levels},
      'num_examples': int(num_examples),
  }


def levels_solved(level_accuracy: Mapping[str, float], threshold: float = PASS_THRESHOLD) -> int:
  """How many levels have accuracy above `threshold` (the author's "pass" is > 90%)."""
  return sum(1 for value in level_accuracy.values() if value > threshold)
