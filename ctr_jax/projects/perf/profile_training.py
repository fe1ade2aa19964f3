"""Where a training step's time goes, op by op, in JAX and in the PyTorch peer, on the same shape.

  python -m ctr_jax.projects.perf.profile_training                  # peer shape: C=512 N=6 T=256 B=8 V=4096
  python -m ctr_jax.projects.perf.profile_training --side=jax       # one side only
  python -m ctr_jax.projects.perf.profile_training --width=64 --depth=2 --seq_len=32 --batch=2 --vocab=256

Both sides run the benchmark's own step (`ctr_jax.bench.suite.train_step_and_state`, the trainer's
jitted, donated step; `ctr_jax.bench.peer.train_step_fn`, HF GPT-2 with AdamW), warm up, then
profile `--steps` steps: `jax.profiler` (XLA:CPU thunk events, each named by its HLO instruction,
whose `op_name` metadata in the compiled HLO says which module and which pass, forward or
backward, it belongs to) and `torch.profiler` (self CPU time per aten operator). Every event is
put in one of the CATEGORIES below, so the two sides print one table.

Times are summed over events (thread time), per step. XLA:CPU runs independent thunks at once on
the two cores, so its events add up to more than the step's wall time; torch runs one operator at
a time (each split across the cores inside), so its self times add up to about the wall time.
The '≈ wall ms' columns scale each side's shares to its step's wall time, the figures to compare.
Profile on a quiet machine; the profiler itself adds a few percent.
"""

import collections
import glob
import re
import tempfile
import time

from absl import app, flags
import jax
from jax.profiler import ProfileData

from ctr_jax.bench import configs as bench_configs
from ctr_jax.bench import peer, suite

FLAGS = flags.FLAGS


def _define_flags():
  # Defined only when run as a script, so tests can import the profilers beside other scripts.
  flags.DEFINE_enum('side', 'both', ['both', 'jax', 'torch'], 'Which side to profile.')
  flags.DEFINE_integer('width', 512, 'C.')
  flags.DEFINE_integer('depth', 6, 'N.')
  flags.DEFINE_integer('heads', 8, 'Attention heads.')
  flags.DEFINE_integer('vocab', 4096, 'V.')
  flags.DEFINE_integer('seq_len', 256, 'T.')
  flags.DEFINE_integer('batch', 8, 'B.')
  flags.DEFINE_integer('steps', 3, 'Profiled steps (after 2 warm-up steps).')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'],
                    "Products' precision on both sides (bfloat16: our dtype, the peer's autocast; "
                    'parameters stay float32).')


CATEGORIES = ('dense matmuls, forward', 'dense matmuls, backward', 'attention matmuls',
              'softmax and mask', 'LayerNorm', 'GELU', 'bias, residual, other elementwise',
              'loss (log-softmax, cross-entropy)', 'optimizer (AdamW, clipping, norms)',
              'copies, transposes, layout', 'other')


# ---------------------------------------------------------------------------------------------
# JAX: thunk events -> HLO instruction -> op_name metadata -> category.

def _hlo_instructions(compiled_text: str) -> dict:
  """{instruction name: (opcode or fusion kind, op_name, fused computation text)}."""
  computations = {}
  for block in re.split(r'\n(?=\S)', compiled_text):
    header = re.match(r'(?:ENTRY )?%?([\w.\-]+)', block)
    if header:
      computations[header.group(1)] = block
  out = {}
  for line in compiled_text.split('\n'):
    m = re.match(r'\s*(?:ROOT )?%?([\w.\-]+) = \S+ ([\w\-]+)\(', line)
    if not m:
      continue
    name, opcode = m.groups()
    op_name = re.search(r'op_name="([^"]*)"', line)
    calls = re.search(r'calls=%?([\w.\-]+)', line)
    body = computations.get(calls.group(1), '') if calls else ''
    out[name] = (opcode, op_name.group(1) if op_name else '', body)
  return out


def _jax_category(opcode: str, op_name: str, body: str) -> str:
  is_dot = opcode in ('dot', 'convolution') or ' dot(' in body or 'ynn' in opcode
  backward = 'transpose(' in op_name
  in_model = 'LM)' in op_name or 'LM/' in op_name or 'jvp(' in op_name
  attention_core = '/attn/' in op_name and not re.search(r'/attn/(query|key|value|out)', op_name)
  if opcode in ('copy', 'transpose', 'bitcast', 'reshape', 'copy-start', 'copy-done'):
    return 'copies, transposes, layout'
  if not in_model and not backward:
    return 'optimizer (AdamW, clipping, norms)'
  if is_dot:
    if attention_core:
      return 'attention matmuls'
    return 'dense matmuls, backward' if backward else 'dense matmuls, forward'
  if attention_core or 'softmax' in op_name and '/attn' in op_name:
    return 'softmax and mask'
  if '/ln_' in op_name:
    return 'LayerNorm'
  if re.search(r'gelu|tanh|erf', op_name) and '/mlp' in op_name:
    return 'GELU'
  if 'log_softmax' in op_name or 'logsumexp' in op_name or 'take_along_axis' in op_name:
    return 'loss (log-softmax, cross-entropy)'
  if op_name:
    return 'bias, residual, other elementwise'
  return 'other'


def profile_jax(fields, seq_len, batch, steps):
  step, state, tokens, _, _ = suite.train_step_and_state(fields, seq_len=seq_len, batch=batch,
                                                         k_unroll=0)
  instructions = _hlo_instructions(step.lower(state, tokens).compile().as_text())
  for _ in range(2):
    state, metrics = step(state, tokens)
    jax.block_until_ready(metrics)
  trace_dir = tempfile.mkdtemp(prefix='ctr_profile_')
  with jax.profiler.trace(trace_dir):
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = step(state, tokens)
      jax.block_until_ready(metrics)
    wall = (time.perf_counter() - start) / steps
  (path,) = glob.glob(f'{trace_dir}/**/*.xplane.pb', recursive=True)
  totals, ops = collections.Counter(), collections.Counter()
  for plane in ProfileData.from_file(path).planes:
    for line in plane.lines:
      for event in line.events:
        hlo_op = dict(event.stats).get('hlo_op')
        if hlo_op is None or event.name.startswith('end:'):
          continue
        opcode, op_name, body = instructions.get(hlo_op, ('?', '', ''))
        category = _jax_category(opcode, op_name, body)
        totals[category] += event.duration_ns / 1e6 / steps
        ops[(category, hlo_op)] += event.duration_ns / 1e6 / steps
  return wall * 1e3, totals, ops


# ---------------------------------------------------------------------------------------------
# PyTorch: self CPU time per aten operator -> category.

def _torch_category(key: str) -> str:
  k = key.lower()
  if 'optimizer' in k or '_foreach' in k or 'adamw' in k or 'clip_grad' in k or 'norm' in k \
      and 'layer_norm' not in k:
    return 'optimizer (AdamW, clipping, norms)'
  if re.search(r'aten::(bmm|baddbmm)', k) or 'attention' in k:
    return 'attention matmuls'
  if re.search(r'aten::(mm|addmm|matmul|linear)\b', k):
    return 'dense matmuls, forward'
  if re.search(r'(mm|addmm)backward|aten::(mm|addmm)', k):
    return 'dense matmuls, backward'
  if 'softmax' in k and 'log_softmax' not in k or 'masked_fill' in k or 'where' in k:
    return 'softmax and mask'
  if 'layer_norm' in k:
    return 'LayerNorm'
  if 'gelu' in k or 'tanh' in k or 'pow' in k:
    return 'GELU'
  if 'log_softmax' in k or 'nll' in k or 'cross_entropy' in k:
    return 'loss (log-softmax, cross-entropy)'
  if re.search(r'copy|contiguous|transpose|permute|view|clone|cat|split|_to_copy', k):
    return 'copies, transposes, layout'
  if re.search(r'add|mul|sub|div|fill|zero|sum|embedding', k):
    return 'bias, residual, other elementwise'
  return 'other'


def profile_torch(fields, seq_len, batch, steps):
  import torch
  step = peer.train_step_fn(width=fields['width'], depth=fields['depth'],
                            heads=fields['num_heads'], vocab=fields['vocab_size'],
                            seq_len=seq_len, batch=batch, dtype=fields.get('dtype', 'float32'))
  for _ in range(2):
    step()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    start = time.perf_counter()
    for _ in range(steps):
      step()
    wall = (time.perf_counter() - start) / steps
  totals, ops = collections.Counter(), collections.Counter()
  # Backward matmuls are the aten::mm calls under autograd's *Backward nodes; torch.profiler's
  # self times sit on the aten op, so the backward node's name comes from the event's parent.
  for event in prof.events():
    if event.self_cpu_time_total <= 0:
      continue
    name = event.name
    parent = event.cpu_parent.name if event.cpu_parent is not None else ''
    category = _torch_category(name)
    if category == 'dense matmuls, forward' and 'Backward' in parent:
      category = 'dense matmuls, backward'
    if 'Optimizer' in parent or 'clip_grad' in parent:
      category = 'optimizer (AdamW, clipping, norms)'
    totals[category] += event.self_cpu_time_total / 1e3 / steps
    ops[(category, name)] += event.self_cpu_time_total / 1e3 / steps
  return wall * 1e3, totals, ops


def _print_table(results):
  """Per category: thread time per step, and that time scaled to the step's wall time (share of
  all events x wall ms), the column to compare across the two sides."""
  sides = list(results)
  print('| category | ' + ' | '.join(f'{s} thread ms | {s} share | {s} ≈ wall ms'
                                     for s in sides) + ' |')
  print('|---|' + '---|---|---|' * len(sides))
  sums = {s: sum(results[s][1].values()) for s in sides}
  for category in CATEGORIES:
    cells = []
    for s in sides:
      ms = results[s][1].get(category, 0.0)
      share = ms / sums[s] if sums[s] else 0.0
      cells += [f'{ms:.0f}', f'{100 * share:.0f}%', f'{share * results[s][0]:.0f}']
    print(f'| {category} | ' + ' | '.join(cells) + ' |')
  print('| all events (thread time) | ' + ' | '.join(f'{sums[s]:.0f} | | ' for s in sides) + ' |')
  print('| step wall time (profiled) | ' + ' | '.join(f' | | {results[s][0]:.0f}' for s in sides)
        + ' |')
  for s in sides:
    print(f'\n{s}: the ten longest ops (thread ms/step, category)')
    for (category, op), ms in results[s][2].most_common(10):
      print(f'  {ms:8.1f}  {op[:60]:60s} {category}')


def main(argv):
  del argv
  f = FLAGS
  fields = bench_configs.peer_shape(width=f.width, depth=f.depth, num_heads=f.heads, vocab_size=f.vocab,
                           dtype=f.dtype)
  results = {}
  if f.side in ('both', 'jax'):
    results['jax'] = profile_jax(fields, f.seq_len, f.batch, f.steps)
  if f.side in ('both', 'torch'):
    results['torch'] = profile_torch(fields, f.seq_len, f.batch, f.steps)
  print(f'training step, C={f.width} N={f.depth} heads={f.heads} V={f.vocab} T={f.seq_len} '
        f'B={f.batch}, {f.dtype}, {f.steps} profiled steps')
  _print_table(results)


if __name__ == '__main__':
  _define_flags()
  app.run(main)
