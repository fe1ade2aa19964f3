"""Quickstart: a small context-ready transformer on the embedded King James Bible, on a CPU.

  python -m ctr_jax.main --config=configs/quickstart.py --workdir=/tmp/ctr_quickstart

Trains D=2, C=128 with K ~ U{2..4} for 600 steps (about 6 minutes on 2 CPU cores), then reports
validation perplexity in parallel-K and in exact sequential mode and prints a sample.
Args: `transformer` trains the matching 4-layer baseline instead, e.g.
configs/quickstart.py:transformer; `runlocal` (accepted by every config) cuts it to 200 steps, a
smoke run of about 2 minutes: configs/quickstart.py:runlocal or :transformer,runlocal.
"""

from ctr_jax import config_lib, models


def get_config(arg=None):
  args = config_lib.parse_arg(arg, transformer=False, runlocal=False)
  c = config_lib.get_base()
  if args.transformer:
    c.model = models.model_config(kind='transformer', width=128, depth=4, num_heads=4,
                                  vocab_size=4096, max_len=256)
  else:
    c.model = models.model_config(kind='context_ready', width=128, depth=2, num_heads=4,
                                  vocab_size=4096, max_len=256, k_unroll=4)
    c.train.k_min = 2
    c.train.convergence_weight = 0.1
  c.data.name = 'kjv_bible'
  c.data.seq_len = 128
  c.batch_size = 16
  c.total_steps = 600
  c.optim.lr = 2e-3
  c.optim.warmup_steps = 50
  c.optim.weight_decay = 0.01
  c.log_every = 25
  c.eval_every = 200
  c.eval_batches = 6
  c.checkpoint_every = 200
  c.sample.num_tokens = 48
  if args.runlocal:  # already a CPU run: only shorter
    c.total_steps, c.eval_every, c.checkpoint_every = 200, 100, 100
  return c
