"""The task protocol and the registry that maps `config.data.name` to a task class."""

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Protocol


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


def make(config, process_index: int, process_count: int) -> Task:
  validate_config(config)
  return _REGISTRY[config.data.name][0](config, process_index, process_count)


def metric_name(task: Task, key: str) -> str:
  return task.metric_names.get(key, f'train_{key}')
