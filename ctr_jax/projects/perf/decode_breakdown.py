"""Where a greedy decode step of the peer-shape model goes, by taking parts away.

  python -m ctr_jax.projects.perf.decode_breakdown
  python -m ctr_jax.projects.perf.decode_breakdown --batches=1 --rounds=15

Issue 20 asks `generate` for 3x the PyTorch peer. This prints, for the peer-shape transformer
(C = 512, N = 6, V = 4096) at each batch size, three tables of marginal ms per generated token
(the difference of a 1-step and a (1 + new_tokens)-step continuation from the same prefilled
state, as the bench's decode rows), paired: every row runs once per round, the order rotating.

1. **Variants.** The step as it is, and diagnostic variants with one part replaced at trace time
   (they decode different tokens; they say what a part costs, they are not models):
   attention over the cache replaced by q (the cache still read, through a sum), attention and
   cache writes removed, LayerNorm reduced to its affine map, RoPE tables not materialised.
2. **Products only.** The step's own weight matrices (fused q/k/v, out, MLP in/out per layer,
   head) multiplied in a dependent chain through `layers.linear`, the model's product path, with
   nothing else: the floor the other parts sit on, and the rate it streams weights at.
3. **Cache length.** The same steps with the KV cache allocated for S slots: attention reads
   every slot (masked past the newest token), so the allocation, not the filled part, is paid.
"""

import contextlib
import statistics
import time
from unittest import mock

from absl import app, flags
import jax
import jax.numpy as jnp

from ctr_jax import models
from ctr_jax.bench import configs as bench_configs
from ctr_jax.bench import suite
from ctr_jax.inference import decode
from ctr_jax.models import attention, layer_norm, layers
from ctr_jax.ops import kernels

FLAGS = flags.FLAGS
flags.DEFINE_list('batches', ['1', '8'], 'Batch sizes B.')
flags.DEFINE_integer('prompt_len', 8, 'Prompt positions, prefilled once outside the timing.')
flags.DEFINE_integer('new_tokens', 64, 'Steps in the long continuation.')
flags.DEFINE_integer('rounds', 9, 'Timed rounds (after one warm-up round).')
flags.DEFINE_list('cache_lengths', ['73', '137', '265', '521'],
                  'Slots S of the KV cache for table 3 (>= prompt_len + 1 + new_tokens).')


VARIANTS = {
    'the step as it is': contextlib.nullcontext,
    'attention replaced by q (cache still read)': lambda: mock.patch.object(
        attention, 'cached_attention', lambda q, k, v, mask, scale: q + 0 * (k.sum() + v.sum())),
    'attention and cache writes removed': lambda: mock.patch.object(
        attention, 'cached_attention', lambda q, k, v, mask, scale: q),
    'LayerNorm as its affine map only': lambda: mock.patch.object(
        layer_norm, 'normalize_affine', lambda x, scale, bias, eps: x * scale + bias),
    'RoPE tables not materialised': lambda: mock.patch.object(
        kernels, 'rotation_table', lambda t: t),
}


def _model():
  cfg = suite.model_config(bench_configs.peer_shape())
  model = models.build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  return cfg, model, decode.with_fused_qkv(variables)


def _continuations(model, fused, batch, slots, cfg, variant=contextlib.nullcontext):
  """(run_short, run_long): compiled 1- and (1 + new_tokens)-step greedy continuations."""
  prompt = jax.random.randint(jax.random.key(1), (batch, FLAGS.prompt_len), 0, cfg.vocab_size)
  logits, state = decode.prefill(model, fused, prompt, slots)
  last = logits[:, -1]
  def run(variables, last_logits, st, steps):
    return decode._sample_loop(model, variables, last_logits, st, steps,  # pylint: disable=protected-access
                               jax.random.key(2), jnp.float32(0), 0)[0]
  compiled = []
  with variant():
    for steps in (1, 1 + FLAGS.new_tokens):
      fn = jax.jit(run, static_argnums=3).lower(fused, last, state, steps).compile()
      compiled.append(lambda fn=fn: fn(fused, last, state))
  return compiled


def _products_chain(fused, batch, width):
  """A jitted loop of new_tokens steps that multiplies a [B, C] row block by every weight matrix
  a decode step reads, in the step's order, each product depending on the previous one."""
  layer_nodes = []
  for name in sorted(fused['params']['blocks'], key=lambda n: int(n.split('_')[-1])):
    block = fused['params']['blocks'][name]
    layer_nodes.append([fused[attention.FUSED]['blocks'][name]['attn']['qkv'],
                        block['attn']['out'], block['mlp']['fc_in'], block['mlp']['fc_out']])
  head = fused['params']['head']
  def step(h, _):
    for qkv, out, fc_in, fc_out in layer_nodes:
      y = layers.linear(h, qkv, jnp.float32)
      h = h + layers.linear(y[:, :width] + y[:, width:2 * width] + y[:, 2 * width:], out,
                            jnp.float32)
      h = h + layers.linear(jax.nn.gelu(layers.linear(h, fc_in, jnp.float32)), fc_out,
                            jnp.float32)
    logits = layers.linear(h, head, jnp.float32)
    return h + 1e-3 * logits[:, :width], None
  chain = jax.jit(lambda h: jax.lax.scan(step, h, None, length=FLAGS.new_tokens)[0])
  h0 = jnp.ones((batch, width), jnp.float32)
  weight_bytes = 4 * sum(n['weight'].size for nodes in layer_nodes for n in nodes)
  weight_bytes += 4 * head['weight'].size
  return (lambda: chain(h0)), weight_bytes


def _rounds(calls: dict) -> dict:
  """{name: [seconds per round]} for callables run once each per round, the order rotating."""
  for fn in calls.values():
    jax.block_until_ready(fn())
  names = list(calls)
  times = {n: [] for n in names}
  for r in range(FLAGS.rounds):
    for n in names[r % len(names):] + names[:r % len(names)]:
      start = time.perf_counter()
      jax.block_until_ready(calls[n]())
      times[n].append(time.perf_counter() - start)
  return times


def _marginal_ms(times, short, long):
  return [1e3 * (b - a) / FLAGS.new_tokens for a, b in zip(times[short], times[long])]


def _measure_variants(cfg, model, fused, batch):
  slots = FLAGS.prompt_len + 1 + 2 * FLAGS.new_tokens
  calls = {}
  for name, variant in VARIANTS.items():
    short, long = _continuations(model, fused, batch, slots, cfg, variant)
    calls[(name, 'short')], calls[(name, 'long')] = short, long
  chain, weight_bytes = _products_chain(fused, batch, cfg.width)
  calls[('products', 'chain')] = chain
  times = _rounds(calls)
  first = _marginal_ms(times, *[(next(iter(VARIANTS)), s) for s in ('short', 'long')])
  print(f'\nB = {batch}: variants (KV cache of {slots} slots, marginal ms per token over '
        f'{FLAGS.new_tokens} steps; median of {FLAGS.rounds} paired rounds)\n')
  print('| variant | ms/token | ÷ the step as it is |')
  print('|---|---|---|')
  for name in VARIANTS:
    ms = _marginal_ms(times, (name, 'short'), (name, 'long'))
    ratio = statistics.median(a / b for a, b in zip(ms, first))
    print(f'| {name} | {statistics.median(ms):.3f} | {ratio:.3f} |')
  chain_ms = [1e3 * t / FLAGS.new_tokens for t in times[('products', 'chain')]]
  ratio = statistics.median(a / b for a, b in zip(chain_ms, first))
  rate = weight_bytes / (statistics.median(chain_ms) * 1e-3) / 1e9
  print(f'| the weight products alone ({weight_bytes / 1e6:.1f} MB, {rate:.1f} GB/s) | '
        f'{statistics.median(chain_ms):.3f} | {ratio:.3f} |')


def _measure_cache_lengths(cfg, model, fused, batch):
  calls = {}
  for slots in map(int, FLAGS.cache_lengths):
    if slots < FLAGS.prompt_len + 1 + FLAGS.new_tokens:
      raise app.UsageError(f'--cache_lengths: {slots} slots cannot hold prompt_len + 1 + '
                           f'new_tokens = {FLAGS.prompt_len + 1 + FLAGS.new_tokens} positions')
    calls[(slots, 'short')], calls[(slots, 'long')] = _continuations(model, fused, batch, slots,
                                                                     cfg)
  times = _rounds(calls)
  print(f'\nB = {batch}: the same steps against the KV cache allocation (filled: '
        f'{FLAGS.prompt_len + 1} to {FLAGS.prompt_len + 1 + FLAGS.new_tokens} positions)\n')
  print('| cache slots S | ms/token |')
  print('|---|---|')
  for slots in map(int, FLAGS.cache_lengths):
    ms = _marginal_ms(times, (slots, 'short'), (slots, 'long'))
    print(f'| {slots} | {statistics.median(ms):.3f} |')


def main(argv):
  del argv
  cfg, model, fused = _model()
  print(f'{jax.devices()[0].device_kind}, {jax.device_count()} device(s), jax {jax.__version__}; '
        f'peer-shape transformer, {models.count_params(fused["params"]):,} parameters')
  for batch in map(int, FLAGS.batches):
    _measure_variants(cfg, model, fused, batch)
    _measure_cache_lengths(cfg, model, fused, batch)


if __name__ == '__main__':
  app.run(main)
