"""Tasks bind a dataset to the trainer: batches (checkpointable), the loss and evaluation.

A task is registered under the `config.data.name` values it serves; the trainer only calls the
`Task` protocol (`registry.Task`) and names no task:

    task = tasks.make(config, process_index, process_count)
    batch = next(task.train_iter)
    objective, batch_shapes = tasks.abstract(config)  # the same objective and batch, no data
    logits, aux = train_step.forward(model, params, task.inputs(batch), recipe)  # the step's
    loss, metrics = task.loss(logits, aux, batch)

`language_modelling` serves the text corpora, `pointer_chasing` the synthetic pointer task.
"""

from ctr_jax.tasks import language_modelling, losses, pointer_chasing
from ctr_jax.tasks.registry import (
  Task,
  TrainIterator,
  abstract,
  make,
  metric_name,
  names,
  validate_config,
)

__all__ = ['Task', 'TrainIterator', 'abstract', 'language_modelling', 'losses', 'make',
           'metric_name', 'names', 'pointer_chasing', 'validate_config']
