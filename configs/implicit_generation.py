"""Implicit context updates during generation (arXiv 2511.17864, section 4) on small models.

Trains small Gemma-, Llama- and Falcon-style models on the embedded KJV corpus (cached in the
workdir), then generates 20 greedy tokens for 5 prompts; at every step the patches are
recomputed and the patched model sees only the current token. Compares float32 and bfloat16,
the direct and the stable update (Gemma), and the first patched layer (0, L/2, last only):

  python -m ctr_jax.projects.implicit_generation --config=configs/implicit_generation.py

The same experiment on a real pretrained model from its pip package (ctr_jax/pretrained/packaged.py,
docs/pretrained.md): `model=gemma3_270m` (Gemma 3 270M base, GGUF Q4_K_M) or `model=smollm2_135m`
(SmolLM2-135M-Instruct, GGUF Q4_1), the paper's five prompts:

  python -m ctr_jax.projects.implicit_generation --config=configs/implicit_generation.py:model=gemma3_270m

Each run writes its results json under docs/implicit_generation/ and regenerates its section of
docs/implicit_updates.md or docs/implicit_updates_pretrained.md (between the section's markers)
from it.

With intervals (issue 42 item 5): the paper's five prompts and fifteen more, 50 tokens each,
first patched layer 0, apply action, the closed loop (Algorithm 1) and the open loop on the same
tokens, per-prompt 95% cluster-bootstrap intervals (docs/implicit_generation/gemma3_270m_20x50.json):

  python -m ctr_jax.projects.implicit_generation \
      --config=configs/implicit_generation.py:model=gemma3_270m,prompts=20,tokens=50

Or on a Hugging Face checkpoint (e.g. google/gemma-3-1b-it downloaded to a
directory; the paper's five prompts, Gemma chat format):

  python -m ctr_jax.projects.implicit_generation \
      --config=configs/implicit_generation.py:hf_dir=/path/to/gemma-3-1b-it

Results (results.json, table.md) go to `workdir`, figures also to `figures_dir`. Args: `model`
('' = the small trained models), `quick`, a smoke run in well under a minute that writes
neither docs nor figures; `runlocal` is accepted as by every config and changes nothing
(the default already runs on a CPU).
"""

import ml_collections

from ctr_jax import config_lib

# The paper's prompts (used with a Hugging Face checkpoint).
PAPER_PROMPTS = (
    'Write a single-sentence weather forecast for Mars, from the perspective of a slightly '
    'annoyed robot:',
    "Constraint: No 'e's. Topic: The meaning of life. Length: Exactly 20 words. Write:",
    "Explain what a 'bug' is in computer programming, but explain it to a 16th-century "
    'medieval peasant. Use 20 words or less:',
    'Topic: Three siblings named Jack, Fred, and Alice. Task: Write one 5-7-5 haiku about them:',
    'We can absorb the impact of a prompt for a modern language model such as Gemma into the '
    'MLP weights. Write a two-line rhyming couplet about this fact:',
)
# Fifteen more plain-text prompts of varied kinds (instructions, questions, openings, lists,
# code and arithmetic), for the intervals run (`prompts=20`): the paper's five come first.
MORE_PROMPTS = (
    'The capital of France is',
    'Here is a simple recipe for pancakes:',
    'Q: Why is the sky blue?\nA:',
    'def fibonacci(n):',
    'Once upon a time, in a small village by the sea,',
    'The three primary colours are',
    'List four common household pets:',
    'Translate into French: "Good morning, how are you?"',
    'Summarise the water cycle in two sentences:',
    'The train left the station at noon, and',
    'In 1969, the first humans landed on',
    'Give one tip for getting better sleep:',
    'Photosynthesis is the process by which',
    '12 + 7 =',
    'Dear hiring manager, I am writing to apply for',
)
# Openings in the style of the small models' training text.
KJV_PROMPTS = (
    'In the beginning God created',
    'And the LORD spake unto Moses, saying,',
    'The LORD is my shepherd;',
    'Blessed are the poor in spirit:',
    'And it came to pass, when the king heard',
)


def _family(block, **model):
  base = dict(kind='transformer', block=block, width=96, depth=4, num_heads=4, head_dim=24,
              mlp_dim=384, max_len=128, init='normal', rope_base=10000.0)
  return ml_collections.ConfigDict({**base, **model})


# Real pretrained models (ctr_jax.pretrained): how their prompts are formatted and named.
#   plain   the prompt text as is after the tokenizer's BOS: Gemma 3 270M is a *base* model,
#           and wrapped in Gemma's chat turns it only echoes the prompt;
#   chatml  SmolLM2-135M-Instruct's own turns, without a system turn:
#           '<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n' (no BOS, as its
#           tokenizer adds none).
PRETRAINED = {
    'gemma3_270m': dict(label='Gemma 3 270M (Q4_K_M)', prompt_format='plain'),
    'smollm2_135m': dict(label='SmolLM2-135M-Instruct (Q4_1)', prompt_format='chatml'),
}
PROMPT_FORMATS = ('plain', 'chatml', 'gemma_chat')


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, hf_dir='', model='', quick=False, prompts=0, tokens=0,
                             runlocal=False)  # runlocal: no-op
  if arg.model and arg.model not in PRETRAINED:
    raise ValueError(f'config arg model={arg.model!r}: expected one of {sorted(PRETRAINED)} '
                     "or '' (the small trained models)")
  if arg.model and arg.hf_dir:
    raise ValueError('config args model and hf_dir exclude each other; give one')
  intervals = bool(arg.prompts or arg.tokens)
  every = PAPER_PROMPTS + MORE_PROMPTS
  if intervals and not arg.model:
    raise ValueError('config args prompts and tokens (the intervals run) need model=')
  if not 0 <= arg.prompts <= len(every) or arg.tokens < 0:
    raise ValueError(f'config args prompts={arg.prompts}, tokens={arg.tokens}: prompts in '
                     f'[1, {len(every)}], tokens >= 1')
  name = arg.model or ('' if arg.hf_dir else 'small_models')
  if intervals:  # its own json, doc section and figures; the five-prompt run's stay as they are
    arg.prompts = arg.prompts or len(PAPER_PROMPTS)
    arg.tokens = arg.tokens or 20
    name = f'{arg.model}_{arg.prompts}x{arg.tokens}'
  c = ml_collections.ConfigDict()
  c.workdir = '/tmp/implicit_generation' + (f'_{name}' if arg.model else '')
  c.figures_dir = 'docs/figures'          # '' = workdir only
  # The committed results json and the doc section generated from it ('' = neither).
  c.results_json = f'docs/implicit_generation/{name}.json' if name else ''
  # The small models' section is on the experiment's page, the real models' on their own.
  c.doc = ('docs/implicit_updates.md' if name == 'small_models' else
           'docs/implicit_updates_pretrained.md' if name else '')
  c.doc_section = name
  c.figure_prefix = 'implicit_generation' + (f'_{name}' if arg.model else '')
  c.seed = 0

  c.num_tokens = 20                       # greedy tokens per prompt
  c.prompts = KJV_PROMPTS
  c.dtypes = ('float32', 'bfloat16')
  c.methods = ('direct', 'stable')        # 'stable' only where it differs (Gemma)
  c.modes = ('materialise', 'action')     # patched weights stored in the dtype | rank-1 action
  c.eval_batch = 0                        # (prompt, step) pairs per call; 0 = automatic:
  c.memory_budget_gb = 4.0                # 'materialise' holds per-example patched matrices
  # First patched layers of the 'materialise' rows (() = 0, L/2, L - 1, as for 'action').
  c.materialise_first_layers = ()
  # The intervals run (config args prompts, tokens): per-prompt statistics with 95% cluster
  # bootstrap intervals; first patched layer 0, apply action, both loops, and every setting's
  # logits from a separate patched forward pass of the query alone.
  c.intervals = intervals
  c.first_layers = ()                     # () = 0, L/2, L - 1
  c.loops = ('closed',)                   # 'open': each patch from the recorded unpatched path
  c.separate_pass = False                 # logits from a second pass that applies the patch
  c.bootstrap_resamples = 10000

  c.data = ml_collections.ConfigDict()
  c.data.name = 'kjv_bible'
  c.data.data_dir = ''                    # '' = $TFDS_DATA_DIR or ~/tensorflow_datasets
  c.data.vocab_size = 512

  c.train = ml_collections.ConfigDict()
  c.train.steps = 300
  c.train.batch_size = 16
  c.train.seq_len = 64
  c.optim = ml_collections.ConfigDict(dict(lr=3e-3, warmup_steps=40, min_lr_ratio=0.1,
                                           weight_decay=0.01, b1=0.9, b2=0.95, eps=1e-8,
                                           grad_clip=1.0))

  # Gemma 3 in miniature: one KV head, QK-norm, 3 sliding : 1 global layers with their own RoPE
  # bases, four (1 + w) RMSNorms, GeGLU-tanh, sqrt(d) embedding scale, tied head.
  c.families = ml_collections.ConfigDict()
  c.families.gemma = _family('gemma', num_kv_heads=1, qk_norm=True, sliding_window=16,
                             layer_types=('sliding_attention',) * 3 + ('full_attention',),
                             rope_local_base=10000.0, rope_base=1e6, tie_embeddings=True,
                             layer_norm_eps=1e-6)
  c.families.llama = _family('llama', num_kv_heads=2, layer_norm_eps=1e-6)
  c.families.falcon = _family('falcon', num_kv_heads=1, tie_embeddings=True)

  c.labels = ml_collections.ConfigDict(dict(  # how the tables name the small models
      gemma='Gemma-style (small, trained)', llama='Llama-style (small, trained)',
      falcon='Falcon-style (small, trained)'))

  c.model = arg.model                     # a packaged pretrained model replaces the small ones
  c.hf_dir = arg.hf_dir                   # a Hugging Face checkpoint replaces the small models
  c.hf_prompts = PAPER_PROMPTS
  c.prompt_format = 'gemma_chat'          # hf_dir: Gemma's user/model turn markers
  if arg.model:
    c.prompt_format = PRETRAINED[arg.model]['prompt_format']
    c.labels = ml_collections.ConfigDict({arg.model: PRETRAINED[arg.model]['label']})

  if intervals:
    c.hf_prompts = every[:arg.prompts]
    c.num_tokens = arg.tokens
    c.modes = ('action',)
    c.first_layers = (0,)
    c.loops = ('closed', 'open')
    c.separate_pass = True

  if arg.quick:  # a smoke run in well under a minute
    c.train.steps = 20
    c.num_tokens = 3
    c.dtypes = ('float32',)
    c.modes = ('materialise',)
    c.prompts = c.prompts[:2]
    c.hf_prompts = c.hf_prompts[:2]
    c.results_json = c.doc = c.figures_dir = ''
  return c
