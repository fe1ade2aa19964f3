"""SmolLM2-135M converted to a context-ready model and fine-tuned on the KJV (issue 18 item 3).

The run whose numbers are in docs/conversion.md (2 shared CPU cores: about 20 minutes of
training, 40 steps of each model):

  python -m ctr_jax.projects.conversion --config=configs/convert_pretrained.py

Args (`:a=1,b=x`): model (a name in ctr_jax.pretrained.MODELS) or gguf=PATH (any llama/gemma3
GGUF file), steps, batch, seq_len, k (the converted model's training K), lr, warmup,
freeze ('embed' | 'none'), freeze_layers (the lowest blocks also frozen), eval_windows,
num_tokens (sampled per prompt), docs (where conversion.md and conversion/<model>.json go),
seed, and quick: a smoke run of a few seconds on a tiny model (with gguf=...) or a few minutes
on the real one. `runlocal` is accepted as by every config and changes nothing (the default
already runs on a CPU).
"""

import ml_collections

from ctr_jax import config_lib

PROMPTS = ('And it came to pass, when the king heard',  # the fine-tuning corpus's style
           'The best thing about living in a big city is')  # plain modern English


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, model='smollm2_135m', gguf='', steps=40, batch=4, seq_len=128,
                             k=2, lr=2e-4, warmup=5, freeze='embed', freeze_layers=0,
                             eval_windows=32, num_tokens=32, docs='docs', seed=0, quick=False,
                             runlocal=False)
  c = ml_collections.ConfigDict()
  c.model = arg.model
  c.gguf = arg.gguf                 # a .gguf file instead of a packaged model
  c.seed = arg.seed
  c.docs_dir = arg.docs

  c.steps = arg.steps               # the same for both fine-tunes
  c.batch = arg.batch
  c.seq_len = arg.seq_len           # windows of seq_len + 1 tokens
  c.k = arg.k                       # K of the converted model's parallel forward (fixed)
  c.freeze = arg.freeze             # 'embed': the 49k x 576 table, which is also the tied head
  c.freeze_layers = arg.freeze_layers
  c.lr = arg.lr                     # the paper's fine-tuning lr, 2e-4
  c.warmup_steps = arg.warmup
  c.min_lr_ratio = 0.1
  c.weight_decay = 0.01

  c.validation_every = 20           # every 20th chapter held out, as the kjv_bible dataset
  c.max_chapters = 0                # 0 = all 1,189
  c.eval_windows = arg.eval_windows  # spread over the held-out chapters
  c.eval_batch = 16
  c.prompts = PROMPTS
  c.num_tokens = arg.num_tokens

  if arg.quick:
    c.steps, c.batch, c.seq_len, c.warmup_steps = 2, 2, 16, 1
    c.max_chapters = 60
    c.eval_windows, c.eval_batch, c.num_tokens = 4, 4, 4
  # Bad values fail here, when the flag is parsed, not after the model has loaded.
  from ctr_jax.projects.conversion import experiment as convert_pretrained  # pylint: disable=g-import-not-at-top
  convert_pretrained.validate(c)
  return c
