"""The PyTorch peer: a Hugging Face GPT-2 of the same shape, random weights, timed in this run.

Optional: needs the `bench` extra (`pip install -e ".[bench]"`: the torch CPU build and
transformers). Without it the peer rows are skipped with a note, not an error. Dropout is off,
threads = all cores (torch's default), AdamW, and `generate` with the KV cache, greedy.

`dtype` follows the bench's: 'bfloat16' runs the peer's forward passes under
`torch.autocast('cpu', torch.bfloat16)` (float32 parameters and optimizer, bfloat16 products),
the same mixed precision as our model's `dtype='bfloat16'` with `param_dtype='float32'`.
"""

import contextlib

from ctr_jax.reporting import timing

DTYPES = ('float32', 'bfloat16')


def _precision(dtype: str):
  """The context the peer's forward runs in for the bench's `dtype`."""
  import torch  # pylint: disable=g-import-not-at-top
  if dtype not in DTYPES:
    raise ValueError(f'peer dtype: got {dtype!r}, allowed {list(DTYPES)}')
  if dtype == 'float32':
    return contextlib.nullcontext()
  return torch.autocast('cpu', dtype=torch.bfloat16)


def available() -> str:
  """'' when torch and transformers import, else the reason they do not."""
  try:
    import torch  # noqa: F401  (only whether it imports)
    import transformers  # noqa: F401
  except ImportError as e:
    return f'PyTorch peer skipped: {e} (pip install -e ".[bench]")'
  return ''


def label(dtype: str = 'float32') -> str:
  import torch  # pylint: disable=g-import-not-at-top
  precision = ', bf16 autocast' if dtype == 'bfloat16' else ''
  return f'HF GPT-2, torch {torch.__version__} ({torch.get_num_threads()} threads{precision})'


def _model(width: int, depth: int, heads: int, vocab: int, max_len: int):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import GPT2Config, GPT2LMHeadModel  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = GPT2Config(vocab_size=vocab, n_positions=max_len, n_embd=width, n_layer=depth,
                      n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=0, eos_token_id=0)
  return GPT2LMHeadModel(config)


def train_step_fn(*, width: int, depth: int, heads: int, vocab: int, seq_len: int, batch: int,
                  dtype: str = 'float32'):
  """One AdamW training step of the peer (forward, cross-entropy, backward, clipping), as a
  closure; the benchmark and `ctr_jax.projects.perf.profile_training` time this same step."""
  import torch  # pylint: disable=g-import-not-at-top
  model = _model(width, depth, heads, vocab, max(seq_len, 1024))
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
  tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=torch.Generator().manual_seed(1))
  inputs, targets = tokens[:, :-1], tokens[:, 1:]

  def step():
    with _precision(dtype):
      logits = model(inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                             targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)

  return step


def decode_latency(*, width: int, depth: int, heads: int, vocab: int, batch: int, prompt_len: int,
                   new_tokens: int, warmup: int, repeats: int, dtype: str = 'float32') -> dict:
  """Marginal ms per generated position of `model.generate` (greedy, KV cache)."""
  import torch  # pylint: disable=g-import-not-at-top
  model = _model(width, depth, heads, vocab, max(prompt_len + new_tokens + 1, 1024))
  model.eval()
  prompt = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
  mask = torch.ones_like(prompt)

  def run(n):
    with torch.inference_mode(), _precision(dtype):
      model.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                     do_sample=False, use_cache=True, pad_token_id=0)

  seconds = timing.per_item_seconds(run, 1, 1 + new_tokens, warmup=warmup, repeats=repeats)
  return {'ms_per_token': 1e3 * seconds}


def generate_runner(*, width: int, depth: int, heads: int, vocab: int, batch: int,
                    prompt_len: int, max_len: int, dtype: str = 'float32'):
  """`call(n)`: `model.generate` of n greedy tokens (KV cache) after a random prompt."""
  import torch  # pylint: disable=g-import-not-at-top
  model = _model(width, depth, heads, vocab, max(max_len, 1024))
  model.eval()
  prompt = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
  mask = torch.ones_like(prompt)

  def call(n):
    with torch.inference_mode(), _precision(dtype):
      return model.generate(prompt, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, use_cache=True, pad_token_id=0)

  return call
