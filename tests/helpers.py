"""Small shared helpers for tests."""

import jax
import numpy as np

from ctr_jax import models


def random_model(seed: int, *, kind='context_ready', depth=None, dtype='float32', **overrides):
  """A small model of random size (width, heads, vocab, depth) and its variables."""
  r = np.random.default_rng(seed)
  heads = int(r.choice([2, 4]))
  width = heads * int(r.choice([8, 12, 16]))
  cfg = models.model_config(kind=kind, vocab_size=int(r.integers(11, 60)), width=width,
                            depth=depth or int(r.integers(1, 4)), num_heads=heads, max_len=64,
                            dtype=dtype, **overrides)
  model = models.build(cfg)
  tokens = random_tokens(seed, cfg.vocab_size, batch=2, length=int(r.integers(3, 10)))
  variables = model.init(jax.random.key(seed), tokens)
  return cfg, model, variables, tokens


def random_tokens(seed, vocab, batch, length):
  return jax.random.randint(jax.random.key(seed + 1000), (batch, length), 0, vocab)


def max_abs_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
