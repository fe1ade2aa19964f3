"""How fast XLA:CPU multiplies in float32 and in bfloat16, at a square size and at the shapes of
the peer-shape training step (M = B·T = 2048 tokens, C = 512, MLP 4C = 2048, V = 4096).

  python -m ctr_jax.projects.perf.matmul_dtypes
  python -m ctr_jax.projects.perf.matmul_dtypes --tokens=512 --repeats=9
  python -m ctr_jax.projects.perf.matmul_dtypes --step_dots     # the operand types of the bf16 step's dots
  python -m ctr_jax.projects.perf.matmul_dtypes --few_rows      # decode-like products of 1-64 rows
  python -m ctr_jax.projects.perf.matmul_dtypes --resident      # one-row steps over 8-256 MB of weights

Prints one row per shape and weight layout: GFLOP/s of the jitted product in float32, in bfloat16
with bfloat16 output (what a `dtype='bfloat16'` layer computes) and in bfloat16 with float32
accumulation, and the faster bfloat16 ÷ float32 speed. Written to explain docs/benchmarks.md's `cpu_bf16` section: on a
CPU with bfloat16 matrix units (AMX) the peer's bf16 autocast step is much faster than its float32
one, ours is not. Medians of `--repeats` timed calls after one warm-up call.

`--resident` asks whether a decode step whose weights fit the last-level cache reads them faster
than memory: a one-row, decode-like loop over weight sets of 8 to 256 MB, GB/s per size.

`--step_dots` compiles the benchmark's bfloat16 training step at the peer's shape
(`ctr_jax.bench.suite.train_step_and_state`, `dtype='bfloat16'`) and counts the dot products of
its optimised HLO by operand and result types: what XLA:CPU actually multiplies.
"""

import collections
import re
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp

from ctr_jax.bench import configs as bench_configs
from ctr_jax.bench import suite
from ctr_jax.ops import kernels

FLAGS = flags.FLAGS
flags.DEFINE_integer('tokens', 2048, 'M: rows of the activations (B·T).')
flags.DEFINE_integer('repeats', 7, 'Timed calls per product.')
flags.DEFINE_bool('step_dots', False, "Count the bf16 training step's dots by operand types.")
flags.DEFINE_bool('few_rows', False, 'Time decode-like products with few rows: x W^T against '
                  '`kernels.few_rows_product`, through the weights of a 6-layer MLP stack.')
flags.DEFINE_bool('resident', False, 'Time one-row decode-like loops over 8-256 MB of weights: '
                  'the streaming rate of weights that fit the last-level cache against memory.')


def dot_types(hlo_text: str) -> collections.Counter:
  """(lhs type, rhs type, result type, contracting dims) -> count, over the dots of an
  optimised HLO module's text."""
  types = dict(re.findall(r'%([\w.\-]+) = (\w+)\[', hlo_text))  # names are module-unique
  counts = collections.Counter()
  for result, lhs, rhs, rest in re.findall(
      r'= (\w+)\[[^\]]*\][^ ]* dot\(%([\w.\-]+), %([\w.\-]+)\)(.*)', hlo_text):
    dims = ' '.join(re.findall(r'(?:lhs|rhs)_contracting_dims=\{[^}]*\}', rest))
    counts[(types.get(lhs, '?'), types.get(rhs, '?'), result, dims)] += 1
  return counts


def step_dot_types() -> collections.Counter:
  """`dot_types` of the compiled bf16 training step at the peer's shape."""
  step, state, tokens, _, _ = suite.train_step_and_state(
      bench_configs.peer_shape(dtype='bfloat16'), seq_len=256, batch=8, k_unroll=0)
  return dot_types(step.lower(state, tokens).compile().as_text())


def seconds(fn, *args) -> float:
  fn(*args).block_until_ready()
  times = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


VARIANTS = (('float32', jnp.float32, None), ('bf16', jnp.bfloat16, None),
            ('bf16, f32 acc', jnp.bfloat16, jnp.float32))


def rates(m: int, k: int, n: int, layout: str) -> dict[str, float]:
  """GFLOP/s of x [m, k] times a weight stored [out, in] (x W^T, `kernel_layout='out_in'`) or
  [in, out] (x K, `kernel_layout='in_out'`)."""
  flops = 2 * m * k * n
  out = {}
  for name, dtype, acc in VARIANTS:
    x = jax.random.normal(jax.random.key(0), (m, k), dtype)
    if layout == 'out_in':
      w = jax.random.normal(jax.random.key(1), (n, k), dtype)
      product = jax.jit(lambda x, w, acc=acc: jnp.matmul(x, w.T, preferred_element_type=acc))
    else:
      w = jax.random.normal(jax.random.key(1), (k, n), dtype)
      product = jax.jit(lambda x, w, acc=acc: jnp.matmul(x, w, preferred_element_type=acc))
    out[name] = flops / seconds(product, x, w) / 1e9
  return out


def few_rows_rates(rows: int, depth: int = 6, width: int = 512, steps: int = 32):
  """GB/s of weights streamed per decode-like step, plain x W^T vs `kernels.few_rows_product`.

  Each step runs `rows` activations through `depth` MLPs (W_in [4C, C], W_out [C, 4C], stored
  [out, in] as the models store them) inside a `scan`, as a decode loop does, so that the
  weights (50 MB at C = 512) come from memory, not from the cache.
  """
  keys = jax.random.split(jax.random.key(0), 2 * depth)
  weights = [jax.random.normal(k, (4 * width, width) if i % 2 == 0 else (width, 4 * width))
             / width ** 0.5 for i, k in enumerate(keys)]
  x = jax.random.normal(jax.random.key(1), (rows, width))
  return {name: streamed_rate(product, x, weights, steps)
          for name, product in (('x W^T', lambda a, w: a @ w.T),
                                ('few_rows_product', kernels.few_rows_product))}


def streamed_rate(product, x, weights, steps: int) -> float:
  """GB/s of float32 weights read by a decode-like loop: `steps` iterations of a `scan`, each
  taking the activations through every weight in turn (tanh(product(h, w))), so that each step
  reads all the weights once and the next step reads the same ones again."""
  def run(x, weights):
    def step(h, _):
      for w in weights:
        h = jnp.tanh(product(h, w))
      return h, None
    return jax.lax.scan(step, x, None, length=steps)[0]
  per_step = seconds(jax.jit(run), x, weights) / steps
  return sum(w.size for w in weights) * 4 / per_step / 1e9


def resident_rate(megabytes: float, matrices: int = 8, steps: int = 16) -> float:
  """GB/s of float32 weights read per step of a one-row loop over `matrices` square weights of
  `megabytes` in all: every step reads each weight once, as a batch-1 decode step does, and the
  same weights again at the next step, so a set that stays in the cache is read from there."""
  n = int((megabytes * 2**20 / 4 / matrices) ** 0.5)
  weights = [jax.random.normal(k, (n, n)) / n ** 0.5
             for k in jax.random.split(jax.random.key(0), matrices)]
  return streamed_rate(lambda a, w: a @ w.T, jax.random.normal(jax.random.key(1), (1, n)),
                       weights, steps)


def main(argv):
  del argv
  if FLAGS.resident:
    print('| weights MB | one-row step ms | GB/s |')
    print('|---|---|---|')
    for megabytes in (8, 16, 32, 64, 92, 128, 256):
      rate = resident_rate(megabytes)
      print(f'| {megabytes} | {megabytes * 2**20 / rate / 1e6:.2f} | {rate:.1f} |', flush=True)
    return
  if FLAGS.few_rows:
    # Each float32 weight (4 bytes) is used in 2 * rows FLOPs, so GFLOP/s = GB/s * rows / 2:
    # where that stays far below the matmul peak while GB/s falls, the kernel, not memory, limits.
    print('| rows | x W^T GB/s | few_rows_product GB/s | ratio | best GFLOP/s |')
    print('|---|---|---|---|---|')
    for rows in (1, 2, 4, 8, 16, 32, 64):
      r = few_rows_rates(rows)
      best = max(r.values())
      print(f"| {rows} | {r['x W^T']:.1f} | {r['few_rows_product']:.1f} | "
            f"{r['few_rows_product'] / r['x W^T']:.2f}x | {best * rows / 2:.0f} |", flush=True)
    return
  if FLAGS.step_dots:
    counts = step_dot_types()
    print('| lhs | rhs | result | contracting dims | dots in the compiled bf16 training step |')
    print('|---|---|---|---|---|')
    for (lhs, rhs, result, dims), n in sorted(counts.items()):
      print(f'| {lhs} | {rhs} | {result} | {dims} | {n} |')
    bf16 = sum(n for (lhs, rhs, _, _), n in counts.items() if lhs == rhs == 'bf16')
    print(f'\n{bf16} of {sum(counts.values())} dots multiply bfloat16 operands.')
    return
  m = FLAGS.tokens
  shapes = [('square 2048', 2048, 2048, 2048), ('q/k/v/out: C -> C', m, 512, 512),
            ('MLP in: C -> 4C', m, 512, 2048), ('MLP out: 4C -> C', m, 2048, 512),
            ('head: C -> V', m, 512, 4096)]
  device = jax.devices()[0]
  print(f'{device.platform} ({device.device_kind}), {jax.device_count()} device(s), '
        f'jax {jax.__version__}')
  print('| product | weight layout | M | K | N | float32 GFLOP/s | bf16 GFLOP/s '
        '| bf16, f32 acc GFLOP/s | best bf16 ÷ float32 |')
  print('|---|---|---|---|---|---|---|---|---|')
  for label, mm, k, n in shapes:
    for layout in ('out_in', 'in_out'):
      r = rates(mm, k, n, layout)
      best = max(r['bf16'], r['bf16, f32 acc'])
      print(f"| {label} | {layout} | {mm} | {k} | {n} | {r['float32']:.0f} | {r['bf16']:.0f} | "
            f"{r['bf16, f32 acc']:.0f} | {best / r['float32']:.2f}x |", flush=True)


if __name__ == '__main__':
  app.run(main)
