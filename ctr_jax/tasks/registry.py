"""The task protocol and the registry that maps `config.data.name` to a task class."""

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Protocol

import jax
import numpy as np

from ctr_jax.inference import decode


class TrainIterator(Iterator, Protocol):
  """An endless batch iterator whose position is saved with every checkpoint."""

  def get_state(self) -> dict: ...

  def set_state(self, state: dict) -> None: ...


class Task(Protocol):
  """What the trainer needs from a task.

  Attributes:
    train_iter: this process's share of each global training batch.
    metric_names: the name a loss metric is logged under (metrics.jsonl, TensorBoard); a key
      not listed is logged as 'train_<key>'.
    has_sample: whether `sample` exists (the trainer writes a sample after training).
  """
  train_iter: TrainIterator
  metric_names: ClassVar[Mapping[str, str]]
  has_sample: ClassVar[bool]

  @classmethod
  def abstract(cls, config) -> tuple[Any, Any]:
    """(objective, one global training batch as jax.ShapeDtypeStructs) without any data: the
    objective has the task's `inputs` and `loss`; what an ahead-of-time compile of the train
    step needs (`ctr_jax.training.aot`)."""

  def inputs(self, batch) -> Any:
    """The tokens [B, T] the model reads from a batch."""

  def loss(self, logits, aux, batch) -> tuple[Any, dict]:
    """(scalar loss, metrics dict with at least 'loss') of the training forward's logits
    [B, T, V] and aux dict (the training step runs the forward its recipe chooses)."""

  def evaluate(self, model, params, *, to_global: Callable, final: bool) -> dict:
    """Evaluation results (nested dicts of scalars allowed); `final`: after training."""

  def stop_early(self, evaluation: dict) -> bool:
    """Whether a periodic evaluation shows the task done, so training may end before
    config.total_steps (the trainer then saves, evaluates finally and writes the summary)."""

  def sample(self, model, params, config, rng) -> str:
    """Only when `has_sample`: a text sample of the trained model."""


_REGISTRY: dict[str, tuple[type, Callable | None]] = {}


def register(*names: str, validate_config: Callable | None = None):
  """Class decorator: serves `config.data.name` in `names`; `validate_config(config)` raises
  ValueError for a config the task cannot run (called before anything touches the workdir)."""
  def wrap(cls):
    for name in names:
      _REGISTRY[name] = (cls, validate_config)
    return cls
  return wrap


def names() -> tuple[str, ...]:
  return tuple(_REGISTRY)


def validate_config(config) -> None:
  if config.data.name not in _REGISTRY:
    raise ValueError(f'config.data.name: got {config.data.name!r}, allowed {list(names())}')
  check = _REGISTRY[config.data.name][1]
  if check is not None:
    check(config)


def abstract(config) -> tuple[Any, Any]:
  """The config's task's (objective, global batch shapes); reads and builds no data."""
  validate_config(config)
  return _REGISTRY[config.data.name][0].abstract(config)


def make(config, process_index: int, process_count: int) -> Task:
  validate_config(config)
  task = _REGISTRY[config.data.name][0](config, process_index, process_count)
  task.train_iter = CheckedBatches(task.train_iter, task.inputs, config.model.vocab_size)
  return task


def check_batch_tokens(batch, inputs: Callable, vocab_size: int, what: str) -> None:
  """A ValueError naming config.model.vocab_size when the host batch (numpy arrays) holds a token
  id the model has no row for: `inputs(batch)` (what the model reads) outside [0, vocab_size),
  or any id >= vocab_size elsewhere (targets; a negative target means "not scored").

  Such an id would make NaN logits (or score a class that does not exist) rather than an error;
  a few numpy reductions per batch, on the host, before the batch goes to the devices.
  """
  bad = decode.first_token_outside(np.asarray(inputs(batch)), vocab_size)
  for leaf in jax.tree.leaves(batch):
    leaf = np.asarray(leaf)
    if bad is None and leaf.size and leaf.max() >= vocab_size:
      index = np.unravel_index(np.argmax(leaf), leaf.shape)
      bad = int(leaf[index]), tuple(int(i) for i in index)
  if bad is not None:
    raise ValueError(f'config.model.vocab_size={vocab_size}: {what} holds token id {bad[0]} '
                     f'(at {list(bad[1])}), outside [0, {vocab_size}); the model has no '
                     'embedding for it (was the data tokenized for another vocabulary?)')


class CheckedBatches:
  """A task's `train_iter` whose every batch passes `check_batch_tokens` (the state is the
  wrapped iterator's, so checkpoints are unchanged)."""

  def __init__(self, batches: TrainIterator, inputs: Callable, vocab_size: int):
    self.batches, self.inputs, self.vocab_size = batches, inputs, vocab_size

  def __iter__(self):
    return self

  def __next__(self):
    batch = next(self.batches)
    check_batch_tokens(batch, self.inputs, self.vocab_size, 'a training batch')
    return batch

  def get_state(self) -> dict:
    return self.batches.get_state()

  def set_state(self, state: dict) -> None:
    self.batches.set_state(state)


def metric_name(task: Task, key: str) -> str:
  return task.metric_names.get(key, f'train_{key}')
