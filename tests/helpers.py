"""Small shared helpers for tests."""

import io
import os
import subprocess
import sys
import tarfile

import jax
import numpy as np

from ctr_jax import config_lib, models


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


def tiny_train_config(data_dir: str, **overrides):
  """A seconds-long training config on the embedded corpus (tests only)."""
  c = config_lib.get_base()
  c.model = models.model_config(kind='context_ready', width=32, depth=1, num_heads=2,
                                vocab_size=320, max_len=64, k_unroll=3)
  c.data.data_dir = data_dir
  c.data.seq_len = 16
  c.batch_size = 8
  c.total_steps = 4
  c.optim.warmup_steps = 1
  c.optim.lr = 3e-3
  c.log_every = 1
  c.eval_every = 2
  c.eval_batches = 2
  c.checkpoint_every = 2
  c.sample.num_tokens = 0
  c.eval_sequential = False
  return override(c, **overrides)


def override(config, **overrides):
  """`config` with dotted fields set ('optim.lr': 1e-3), as --config.optim.lr=1e-3 would."""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split('.')
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def snapshot(path) -> dict:
  """Every file below `path` and its bytes: to check a failed run left a workdir unchanged."""
  out = {}
  for base, _, files in os.walk(path):
    for name in files:
      full = os.path.join(base, name)
      with open(full, 'rb') as f:
        out[os.path.relpath(full, path)] = f.read()
  return out


# Small models of every block family for the implicit-update tests: grouped/multi-query
# attention, QK-norm and sliding/full layers where the family has them.
FAMILY_OPTIONS = {
    'gpt': {},
    'gemma': dict(num_kv_heads=1, qk_norm=True, sliding_window=3, rope_local_base=100.0),
    'llama': dict(num_kv_heads=2),
    'falcon': dict(num_kv_heads=1),
    'moe': dict(num_experts=3, experts_per_token=2),
}


def family_lm(block, *, dtype='float32', depth=2, seed=0, kind='transformer', batch=2,
              length=8, norm_std=0.3, **overrides):
  """(model, variables, tokens) of a small `block`-family model with random norm scales.

  Norm scales are perturbed by N(0, norm_std) so that no post-norm scale is all ones. Build
  float64 models inside `jax.enable_x64(True)`.
  """
  options = dict(kind=kind, block=block, vocab_size=29, width=16, depth=depth, num_heads=4,
                 max_len=32, dtype=dtype, param_dtype=dtype)
  if block == 'gemma':
    options['layer_types'] = tuple(('sliding_attention', 'full_attention')[i % 2]
                                   for i in range(depth))
  cfg = models.model_config(**{**options, **FAMILY_OPTIONS[block], **overrides})
  model = models.build(cfg)
  tokens = random_tokens(seed, cfg.vocab_size, batch=batch, length=length)

  @jax.jit  # one compile instead of one per eager op
  def init(key):
    params = model.init(key, tokens)['params']
    paths = jax.tree_util.tree_leaves_with_path(params)
    keys = iter(jax.random.split(jax.random.fold_in(key, 7), len(paths)))

    def perturb(path, x):
      names = [getattr(k, 'key', '') for k in path]
      noise = norm_std * jax.random.normal(next(keys), x.shape, x.dtype)
      is_norm = names[-1] == 'scale' and any('norm' in n or n.startswith('ln') for n in names)
      return x + noise if is_norm else x
    return {'params': jax.tree_util.tree_map_with_path(perturb, params)}
  return model, init(jax.random.key(seed)), tokens


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(args, cwd=ROOT, env_extra=None, timeout=240) -> subprocess.CompletedProcess:
  """`python -m ctr_jax.main ARGS` as a user runs it: one CPU device, this checkout's code, no
  traceback switch; captured output."""
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
         'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT, **(env_extra or {})}
  env.pop('CTR_JAX_TRACEBACK', None)
  return subprocess.run([sys.executable, '-m', 'ctr_jax.main', *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def tar_bytes(members: dict[str, bytes], mode: str = 'w') -> bytes:
  """A tar archive (compressed by `mode`, e.g. 'w:xz') holding `members`, as bytes."""
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode=mode) as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buf.getvalue()
