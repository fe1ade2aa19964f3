"""Shared defaults for every experiment config, and the paper's OpenWebText recipe.

Every field is listed here once, with a comment; experiment configs import `get_base()` and
override. Fields the paper does not report (optimizer details, schedule, warmup) are our choices
and are marked as such.
"""

import ml_collections

from ctr_jax import config_lib
from ctr_jax import models


def get_base() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.job = 'train'                # 'train' (train and evaluate) | 'evaluate' | 'generate' |
                                 # 'prepare' (only build the dataset, tokenizer and token cache)
  c.seed = 0
  c.model = models.model_config()  # see ctr_jax/models/config.py for the model fields

  # The training recipe (ctr_jax/train_step.py): how batches are trained, not what the model is,
  # so a resumed run may change it.
  c.train = ml_collections.ConfigDict()
  c.train.mode = 'unroll'        # 'unroll' (parallel K-step forward) | 'bptt' (backpropagation
                                 # through the exact sequential forward; context-ready only)
  c.train.k_min = 0              # >0: K ~ Uniform{k_min..model.k_unroll} per batch; 0 = fixed K
  c.train.convergence_weight = 0.1  # lambda of MSE(e + c^(K), stopgrad(e + c^(K-1))) (unroll)
  c.train.remat = False          # rematerialise each fixed-point iteration (unroll)
  c.train.grad_iterations = 0    # >0: backpropagate through the last m of the K iterations only

  c.data = ml_collections.ConfigDict()
  c.data.name = 'kjv_bible'      # 'kjv_bible' | 'openwebtext' | 'wikipedia' | 'pointer_chasing'
  c.data.data_dir = ''           # '' = $TFDS_DATA_DIR or ~/tensorflow_datasets
  c.data.manual_dir = ''         # raw archives for openwebtext / wikipedia
  c.data.seq_len = 256           # T, the paper's "block size"
                                 # (configs/pointer_chasing.py adds the pointer task's fields)

  c.batch_size = 64              # global batch (split over processes and data/fsdp devices)
  c.total_steps = 100_000

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 2e-4              # the paper's learning rate
  c.optim.warmup_steps = 2000    # our choice (not reported by the paper)
  c.optim.min_lr_ratio = 0.1     # cosine decay to lr * min_lr_ratio (our choice)
  c.optim.weight_decay = 0.1     # AdamW, on matrices only (our choice)
  c.optim.b1 = 0.9
  c.optim.b2 = 0.95
  c.optim.eps = 1e-8
  c.optim.grad_clip = 1.0        # global-norm clipping; 0 = off

  c.log_every = 100
  c.eval_every = 5000            # the author's evaluation interval
  c.eval_batches = 20            # validation batches per evaluation (0 = the whole split)
  c.eval_sequential = True       # also evaluate a context-ready model with the exact scan
  c.checkpoint_every = 5000
  c.keep_checkpoints = 3           # newest checkpoints kept (>= 1)
  c.strict_resume = False        # False: a damaged newest checkpoint is moved aside with a warning
                                 # and the run resumes from the newest complete older one;
                                 # True: refuse (docs/reliability.md)
  c.exit_at_step = -1            # save and exit at this step (time-sliced clusters, tests)
  c.init_from = ''               # workdir of a transformer run to convert (zero-init correction);
                                 # for a transformer run: continue its weights (fresh optimiser)

  c.sample = ml_collections.ConfigDict()
  c.sample.prompt = 'And God said'
  c.sample.num_tokens = 64
  c.sample.temperature = 0.8
  c.sample.top_k = 40

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1               # -1 = all remaining devices
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  c.sharding_rules = [list(r) for r in _default_rules()]

  c.distributed = ml_collections.ConfigDict()
  c.distributed.auto = True      # initialise automatically under SLURM / on a TPU pod
  c.distributed.coordinator_address = ''  # e.g. '10.0.0.1:1234' to initialise explicitly
  c.distributed.num_processes = 1
  c.distributed.process_id = 0
  return c


def _default_rules():
  from ctr_jax import sharding  # pylint: disable=g-import-not-at-top
  return sharding.DEFAULT_RULES


def paper_config(size: str, arg: str | None, *, k_min: int = 2,
                 **model_overrides) -> ml_collections.ConfigDict:
  """The author's OpenWebText recipe for one size name (reference section 6.1).

  Vocabulary 32,000, block 256, batch 64, 100K steps, lr 2e-4, K = 5 with k_min = 2, lambda = 0.1,
  16 heads. Args: `runlocal` shrinks it to a CPU run of a few minutes on the embedded corpus.
  """
  args = config_lib.parse_arg(arg, runlocal=False)
  c = get_base()
  fields = dict(vocab_size=32000, max_len=1024, k_unroll=5)
  c.model = models.model_config(name=size, **{**fields, **model_overrides})
  c.train.k_min = k_min
  c.train.convergence_weight = 0.1
  c.data.name = 'openwebtext'
  c.data.seq_len = 256
  c.batch_size = 64
  c.total_steps = 100_000
  c.optim.lr = 2e-4
  if args.runlocal:
    config_lib.shrink_for_cpu(c)
  return c
