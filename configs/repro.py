"""The reproduction study's recipe: one size on the embedded KJV corpus, the same for every run.

  python -m ctr_jax.main --config=configs/repro.py:size=d2_c144_h4,seed=0 --workdir=DIR
  python -m ctr_jax.projects.reproduce --study=table1 --seeds=3     # a whole study (docs/reproduction.md)

Every run of a study shares data (KJV, fixed train/validation split, V = 2,048), tokens seen
(steps x batch x seq_len), optimiser and schedule (AdamW, linear warmup, cosine decay) and seeds,
and differs only in what the study varies. Args:
  size:  a size name, 'd<D>_c<C>_h<H>' (context-ready) or 't<N>_c<C>_h<H>' (transformer).
  steps, batch, seq_len, seed, vocab, lr: the shared recipe (defaults below).
  k, k_min: K of the unroll and the random-depth floor (0 = fixed K); context-ready only.
  correction, cumulative: the ablations (ctr_jax/models/lm.py Correction).
  grad_iterations: backpropagate through the last m iterations only (0 = all; beyond the paper).
  runlocal: a few steps of the same recipe, for smoke tests.
"""

from ctr_jax import config_lib, models


def get_config(arg=None):
  args = config_lib.parse_arg(arg, size='d2_c144_h4', steps=1200, batch=16, seq_len=128, seed=0,
                              vocab=2048, lr=1e-3, k=5, k_min=2, grad_iterations=0, correction='add',
                              cumulative=False, runlocal=False)
  c = config_lib.get_base()
  fields = dict(vocab_size=args.vocab, max_len=max(256, args.seq_len))
  if models.decode_size(args.size)['kind'] == 'context_ready':
    fields.update(k_unroll=args.k, correction=args.correction, cumulative=args.cumulative)
    c.train.k_min = args.k_min
    c.train.grad_iterations = args.grad_iterations
  c.model = models.model_config(name=args.size, **fields)
  c.seed = args.seed
  c.data.name = 'kjv_bible'
  c.data.seq_len = args.seq_len
  c.batch_size = args.batch
  c.total_steps = args.steps
  c.optim.lr = args.lr
  c.optim.warmup_steps = max(1, args.steps // 20)
  c.optim.min_lr_ratio = 0.1
  c.optim.weight_decay = 0.01
  c.log_every = max(1, min(50, args.steps // 10))
  c.eval_every = max(1, args.steps // 6)
  c.eval_batches = 8
  c.checkpoint_every = max(1, args.steps // 6)
  c.keep_checkpoints = 2
  c.sample.num_tokens = 0
  if args.runlocal:
    c.total_steps = 6
    c.optim.warmup_steps = 1
    c.log_every = c.eval_every = c.checkpoint_every = 3
    c.eval_batches = 1
  return c
