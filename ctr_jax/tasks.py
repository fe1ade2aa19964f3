"""Tasks bind a dataset to the trainer: batches (checkpointable), the loss, and evaluation.

`LanguageModelling` serves the text corpora (next-token prediction).
"""

from ctr_jax import evaluate, losses


class LanguageModelling:
  """Next-token prediction on a tokenized corpus (KJV, OpenWebText, Wikipedia)."""

  def __init__(self, config, process_index: int, process_count: int):
    from ctr_jax.data import pipeline  # pylint: disable=g-import-not-at-top
    from ctr_jax import config_lib  # pylint: disable=g-import-not-at-top
    data = config.data
    self.dataset = pipeline.load(data.name, data_dir=data.data_dir or config_lib.default_data_dir(),
                                 manual_dir=data.manual_dir or None,
                                 vocab_size=config.model.vocab_size)
    self.tokenizer = self.dataset.tokenizer
    self.train_iter = pipeline.train_iterator(
        self.dataset, seq_len=data.seq_len, global_batch_size=config.batch_size, seed=config.seed,
        process_index=process_index, process_count=process_count)
    num = config.eval_batches if config.eval_batches > 0 else None
    self.eval_batches = pipeline.eval_batches(
        self.dataset, seq_len=data.seq_len, global_batch_size=config.batch_size,
        num_batches=num, process_index=process_index, process_count=process_count)

  @staticmethod
  def loss(model, params, batch, *, k_unroll, rng, deterministic):
    return losses.model_loss(model, params, batch, k_unroll=k_unroll, rng=rng,
                             deterministic=deterministic)

  def evaluate(self, model, params, *, to_global, sequential: bool) -> dict:
    """{'val_loss', 'val_ppl'} (+ '_sequential' keys for the exact scan of a CRT)."""
    out = {}
    par = evaluate.evaluate_lm(model, params, self.eval_batches, to_global=to_global)
    out['val_loss'], out['val_ppl'] = par['loss'], par['ppl']
    if sequential:
      seq = evaluate.evaluate_lm(model, params, self.eval_batches, to_global=to_global,
                                 sequential=True)
      out['val_loss_sequential'], out['val_ppl_sequential'] = seq['loss'], seq['ppl']
    return out

  def sample(self, model, params, config, rng) -> str:
    return evaluate.sample_text(model, params, self.tokenizer, config.sample.prompt,
                                config.sample.num_tokens, rng,
                                temperature=config.sample.temperature, top_k=config.sample.top_k)


def make(config, process_index: int, process_count: int):
  if config.data.name == 'pointer_chasing':
    from ctr_jax import pointer_task  # pylint: disable=g-import-not-at-top
    return pointer_task.PointerChasing(config, process_index, process_count)
  return LanguageModelling(config, process_index, process_count)

