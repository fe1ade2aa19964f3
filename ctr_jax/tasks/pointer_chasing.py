"""Pointer chasing (reference section 7; `configs/pointer_chasing.py`): the task and its scoring.

Batches are generated on the fly (`ctr_jax.data.pointer_chasing`) from (seed, step): step s uses
examples s*B .. s*B+B-1 of the training stream, so the iterator state is just the number of
batches consumed. The loss is the cross-entropy AT every key position (the resolved base value),
not a next-token loss, of the logits of the training recipe's forward (the training step's: the
K-unroll, BPTT through the exact scan with `config.train.mode='bptt'`, or a transformer's forward).

Evaluation is per-level accuracy: which levels a model resolves. Accuracy is the argmax
prediction AT each key position against that position's target, grouped by what the position
is: the query section of each level L0..L(H-1) (a level-L query needs L index lookups plus one
base lookup), the final query, and the table keys. Chance is 1/16; the author counts a level as
solved above 90%. With the 'tables' encoding (the author's notes version, no query sections)
the levels are his: the table keys of each level L0..L(H-1), then L(H), the final query.

    metrics = pointer_chasing.evaluate(predict, hops=3)   # predict: tokens [B, T] -> logits
    pointer_chasing.levels_solved(metrics['level_accuracy'])
"""

from collections.abc import Callable, Mapping
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax.data import curricula
from ctr_jax.data import pointer_chasing as generator
from ctr_jax.inference import decode
from ctr_jax.tasks import losses
from ctr_jax.tasks.registry import register

DEFAULT_NUM_EXAMPLES = 1024
PASS_THRESHOLD = 0.9


LOSS_OVER = ('targets', 'all')


def loss_on_targets(logits: jax.Array, targets: jax.Array, over: str = 'targets') -> jax.Array:
  """Cross-entropy of logits [B, T, V] against the targets [B, T] AT the same positions.

  Positions with target < 0 (everything but the key tokens) contribute nothing. Not a next-token
  loss: pointer chasing asks for the resolved value of the key being read, so logits[t] meets
  targets[t]. `over`: 'targets' averages over the target positions (the author's ignore-index
  cross-entropy); 'all' divides the same sum by every position B * T, a constant factor (the
  share of target positions) smaller, which matters only through gradient clipping and Adam's
  epsilon.
  """
  mean, count = losses.next_token_loss(logits, targets)
  if over == 'targets':
    return mean
  if over == 'all':
    return mean * count / targets.size
  raise ValueError(f"over must be one of {LOSS_OVER}, got {over!r}")


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
             batch_size: int = 64, seed: int = generator.EVAL_SEED,
             encoding: str = generator.DEFAULT_ENCODING) -> dict:
  """Accuracies of `predict` on `num_examples` fresh examples of stream `seed`.

  Args:
    predict: tokens int32 [B, T] -> logits [B, T, V] or predicted token ids [B, T]. It is always
      called with full batches of `batch_size` (the last one padded), so a jitted function
      compiles once.
    hops: table levels H.
    num_examples: examples to score.
    batch_size: examples per `predict` call.
    seed: example stream; the default `EVAL_SEED` is disjoint from every training seed (>= 0).
    encoding: 'sections' or 'tables' (ctr_jax.data.pointer_chasing).

  Returns:
    {'level_accuracy': {'L0': float, ..., 'L<H-1>': float},   # query sections; for 'tables'
                                                              # table keys, plus 'L<H>': final
     'final_query_accuracy': float,
     'table_key_accuracy': float,                             # table keys, all levels
     'table_level_accuracy': {'L0': float, ...},              # table keys, per level
     'position_accuracy': float [T] (NaN off targets),        # for `plateau_profile`
     'num_examples': int}
  """
  if num_examples < 1 or batch_size < 1:
    raise ValueError(f'need num_examples >= 1 and batch_size >= 1, got {num_examples}, '
                     f'{batch_size}')
  labels = generator.position_labels(hops, encoding)
  correct = np.zeros(len(labels.kind), np.int64)  # per position, summed over examples
  for start in range(0, num_examples, batch_size):
    count = min(batch_size, num_examples - start)
    tokens, targets = generator.batch(hops, batch_size, seed, start=start, encoding=encoding)
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
  if encoding == 'tables':
    level_accuracy = {f'L{lvl}': accuracy(generator.TABLE_KEY, lvl) for lvl in levels}
    level_accuracy[f'L{hops}'] = accuracy(generator.FINAL_QUERY)
  else:
    level_accuracy = {f'L{lvl}': accuracy(generator.QUERY_KEY, lvl) for lvl in levels}
  return {
      'level_accuracy': level_accuracy,
      'final_query_accuracy': accuracy(generator.FINAL_QUERY),
      'table_key_accuracy': accuracy(generator.TABLE_KEY),
      'table_level_accuracy': {f'L{lvl}': accuracy(generator.TABLE_KEY, lvl)
                               for lvl in levels},
      'position_accuracy': np.where(labels.kind == generator.NONE, np.nan,
                                    correct / num_examples),
      'num_examples': int(num_examples),
  }


_KIND_NAMES = {generator.TABLE_KEY: 'table keys', generator.QUERY_KEY: 'query section',
               generator.PARTIAL_QUERY: 'partial section', generator.FINAL_QUERY: 'final query'}


def plateau_profile(position_accuracy, hops: int,
                    encoding: str = generator.DEFAULT_ENCODING) -> str:
  """Where a model stands, position by position: a markdown table with one row per scored
  section (table keys, partial and full query sections, final query) of each level and one column
  per slot (entry or query 1..8 in the order written), each cell the accuracy there. A plateau
  reads as whole rows at 1.0 and whole rows at chance, or as a slot pattern within a row (e.g.
  only entries late in a table right)."""
  labels = generator.position_labels(hops, encoding)
  accuracy = np.asarray(position_accuracy, np.float64)
  rows = ['| section | level | ' + ' | '.join(f'{i + 1}' for i in range(generator.NUM_KEYS))
          + ' |', '|---|---|' + '---|' * generator.NUM_KEYS]
  seen = []
  for t, (kind, level) in enumerate(zip(labels.kind, labels.level)):
    if kind in _KIND_NAMES and (kind, level) not in seen:
      seen.append((kind, level))
  for kind, level in seen:
    where = np.nonzero((labels.kind == kind) & (labels.level == level))[0]
    if kind == generator.PARTIAL_QUERY:  # several partial sections per level: one row each
      chunks = [where[i:i + generator.NUM_KEYS] for i in range(0, len(where), generator.NUM_KEYS)]
      names = [f'{_KIND_NAMES[kind]}, {j + 1} hop{"s" * (j > 0)}' for j in range(len(chunks))]
    else:
      chunks, names = [where], [_KIND_NAMES[kind]]
    for name, chunk in zip(names, chunks):
      cells = ' | '.join(f'{a:.2f}' for a in accuracy[chunk])
      rows.append(f'| {name} | L{level} | {cells} |')
  return '\n'.join(rows)


def levels_solved(level_accuracy: Mapping[str, float], threshold: float = PASS_THRESHOLD) -> int:
  """How many levels have accuracy above `threshold` (the author's "pass" is > 90%)."""
  return sum(1 for value in level_accuracy.values() if value > threshold)


def solved_everything(evaluation: Mapping, stop_accuracy: float) -> bool:
  """Every level and the final query at or above `stop_accuracy` (never when it is 0)."""
  if stop_accuracy <= 0:
    return False
  scores = [*evaluation['level_accuracy'].values(), evaluation['final_query_accuracy']]
  return min(scores) >= stop_accuracy


@dataclasses.dataclass(frozen=True)
class TargetsObjective:
  """The pointer task's objective: tokens in, `loss_on_targets` of the logits (no convergence
  term: the task's loss alone, as the author trains it)."""
  loss_over: str = 'targets'

  def inputs(self, batch):
    return batch['tokens']

  def loss(self, logits, aux, batch):
    del aux
    loss = loss_on_targets(logits, batch['targets'], self.loss_over)
    return loss, {'loss': loss}


class _BatchStream:
  """Endless, checkpointable stream of this process's share of each global batch."""

  def __init__(self, hops, global_batch_size, seed, process_index, process_count, encoding,
               key_curriculum=(), hop_curriculum=(), **helper_targets):
    if global_batch_size % process_count:
      raise ValueError(f'config.batch_size={global_batch_size} is not divisible by the '
                       f'{process_count} processes')
    self.hops, self.global_batch, self.seed = hops, global_batch_size, seed
    self.helper_targets = helper_targets  # generator.HELPER_TARGETS switches
    self.encoding = encoding
    self.key_curriculum = key_curriculum  # ((keys, until_step), ...): batch i's keys per level
    self.hop_curriculum = hop_curriculum  # ((levels, until_step), ...): batch i's table levels
    self.local = global_batch_size // process_count
    self.offset = process_index * self.local
    self.next_index = 0

  def __iter__(self):
    return self

  def __next__(self):
    start = self.next_index * self.global_batch + self.offset
    tokens, targets = generator.batch(
        self.hops, self.local, self.seed, start=start, encoding=self.encoding,
        num_keys=curricula.curriculum_keys(self.key_curriculum, self.next_index),
        num_levels=curricula.curriculum_levels(self.hop_curriculum, self.next_index, self.hops),
        **self.helper_targets)
    self.next_index += 1
    return {'tokens': tokens, 'targets': targets}

  def get_state(self) -> dict:
    return {'next_index': self.next_index}

  def set_state(self, state: dict) -> None:
    self.next_index = int(state['next_index'])


# The pointer-only fields, set by configs/pointer_chasing.py.
CONFIG_FIELDS = ('data.hops', 'data.entry_targets', 'data.equals_targets',
                 'pointer_eval_examples')


def encoding_of(config) -> str:
  """config.data.encoding; configs saved before the field existed used 'sections'."""
  return config.data.get('encoding', generator.DEFAULT_ENCODING)


def validate_config(config) -> None:
  """The pointer fields exist and fit each other (T = 42H + 2 or 25H + 2, the vocabulary)."""
  for field in CONFIG_FIELDS:
    node, *rest = field.split('.')
    if node not in config or (rest and rest[0] not in config[node]):
      raise ValueError(f'config.{field} is missing: pointer chasing needs the fields of '
                       'configs/pointer_chasing.py (start from that config)')
  hops = config.data.hops
  if not isinstance(hops, int) or hops < 1:
    raise ValueError(f'config.data.hops: must be an integer >= 1, got {hops!r}')
  for helper in generator.HELPER_TARGETS:
    if config.data[helper] not in (True, False, 0, 1):
      raise ValueError(f'config.data.{helper}: got {config.data[helper]!r}, allowed '
                       '[True, False]')
  stop_accuracy = config.data.get('stop_accuracy', 0.0)
  if not isinstance(stop_accuracy, (int, float)) or not 0 <= stop_accuracy <= 1:
    raise ValueError(f'config.data.stop_accuracy: got {stop_accuracy!r}, allowed a number in '
                     '[0, 1] (0: train every step)')
  if config.eval_batches < 1:  # examples are generated: there is no whole split to read
    raise ValueError(f'config.eval_batches: must be >= 1 for pointer chasing (each periodic '
                     f'evaluation scores eval_batches x batch_size fresh examples), got '
                     f'{config.eval_batches}')
  if config.pointer_eval_examples < 1:
    raise ValueError(f'config.pointer_eval_examples: must be >= 1, got '
                     f'{config.pointer_eval_examples}')
  loss_over = config.data.get('loss_over', 'targets')
  if loss_over not in LOSS_OVER:
    raise ValueError(f'config.data.loss_over: got {loss_over!r}, allowed {list(LOSS_OVER)}')
  try:
    curricula.parse_key_curriculum(config.data.get('key_curriculum', ''))
    curricula.parse_hop_curriculum(config.data.get('hop_curriculum', ''), hops)
  except ValueError as e:
    raise ValueError(f'config.data.{e}') from None
  encoding = encoding_of(config)
  if encoding not in generator.ENCODINGS:
    raise ValueError(f'config.data.encoding: got {encoding!r}, allowed {list(generator.ENCODINGS)}')
  expected_len = generator.seq_len(hops, encoding)
  if config.data.seq_len != expected_len:
    raise ValueError(f'config.data.seq_len must be {expected_len} for hops={hops} and encoding '
                     f'{encoding!r}, got {config.data.seq_len}')
  vocab = generator.vocab_size(hops)
  if config.model.vocab_size != vocab:
    raise ValueError(f'config.model.vocab_size must be {vocab} for hops={hops}, got '
                     f'{config.model.vocab_size}')


@register('pointer_chasing', validate_config=validate_config)
class PointerChasing:
  """Pointer chasing with H = config.data.hops table levels."""

  metric_names = {}  # the loss is logged as train_loss
  has_sample = False

  def __init__(self, config, process_index: int, process_count: int):
    self.hops = config.data.hops
    self.encoding = encoding_of(config)
    # Helper targets only shape training; evaluation always scores the task's own targets.
    self.train_iter = _BatchStream(self.hops, config.batch_size, config.seed, process_index,
                                   process_count, self.encoding,
                                   curricula.parse_key_curriculum(
                                       config.data.get('key_curriculum', '')),
                                   curricula.parse_hop_curriculum(
                                       config.data.get('hop_curriculum', ''), self.hops),
                                   **{h: bool(config.data[h]) for h in generator.HELPER_TARGETS})
    self.eval_examples = config.eval_batches * config.batch_size
    self.final_examples = config.pointer_eval_examples
    self.batch_size = config.batch_size
    self.objective = self.abstract(config)[0]
    self.loss_over = self.objective.loss_over
    self.stop_accuracy = float(config.data.get('stop_accuracy', 0.0))

  @classmethod
  def abstract(cls, config):
    """(TargetsObjective, {'tokens', 'targets'}: int32 [B, T]) without generating a batch."""
    shape = jax.ShapeDtypeStruct((config.batch_size, config.data.seq_len), jnp.int32)
    return (TargetsObjective(config.data.get('loss_over', 'targets')),
            {'tokens': shape, 'targets': shape})

  def inputs(self, batch):
    return self.objective.inputs(batch)

  def loss(self, logits, aux, batch):
    return self.objective.loss(logits, aux, batch)

  def evaluate(self, model, params, *, to_global, final: bool) -> dict:
    """Per-level accuracy; the exact sequential model for a CRT, the forward for a transformer.

    Periodic evaluations use eval_batches * batch_size examples; the final one (after training)
    uses config.pointer_eval_examples (1,024 by default).
    """
    del to_global
    mode = 'sequential' if model.spec.is_context_ready else 'parallel'
    predict = model_predictor(model, params, mode=mode)
    num = self.final_examples if final else self.eval_examples
    result = evaluate(predict, self.hops, num_examples=num, batch_size=self.batch_size,
                      encoding=self.encoding)
    return {'level_accuracy': result['level_accuracy'],
            'final_query_accuracy': result['final_query_accuracy'],
            'table_key_accuracy': result['table_key_accuracy'],
            'table_level_accuracy': result['table_level_accuracy'],
            'levels_solved': levels_solved(result['level_accuracy']),
            'eval_examples': num}

  def stop_early(self, evaluation: dict) -> bool:
    """config.data.stop_accuracy > 0: every level and the final query reached it."""
    return solved_everything(evaluation, self.stop_accuracy)
