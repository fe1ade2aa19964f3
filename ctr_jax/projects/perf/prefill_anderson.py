"""Would Anderson mixing cut the chunked prefill's passes? Passes to the tolerance, plain vs mixed.

  python -m ctr_jax.projects.perf.prefill_anderson                                   # d2_c256, random weights
  python -m ctr_jax.projects.perf.prefill_anderson --size=d5_c1120 --prompt_len=128
  python -m ctr_jax.projects.perf.prefill_anderson --checkpoint=/tmp/ctr_quickstart  # a training run's weights

The chunked prefill (`ctr_jax.inference.decode.chunked_prefill`) iterates c <- G(c) over a chunk's
positions, one block pass each, until max |G(c) - c| <= tolerance. Anderson mixing (type II,
`memory` past iterates) replaces G(c_k) by the combination of the last iterates whose
residuals cancel best in least squares, per example. It can only help where the iteration's
Jacobian has structure a Krylov method exploits; within a chunk the Jacobian is strictly lower
triangular (position i reads positions < i only), so it is nilpotent and the plain iteration's
own finite termination (exact after `chunk` passes) is already what a Krylov method would give
in the worst case. This script measures what happens in practice: per memory (0 = the plain
iteration, the same passes `chunked_prefill` takes), the passes each chunk needs, max |c_new - c|
after each pass of the first chunk, and max |Δlogit| against the exact position scan.
Pass counts do not depend on the machine's load, so this runs on a busy machine.
"""

import functools

from absl import app, flags
import jax
import jax.numpy as jnp

from ctr_jax import models
from ctr_jax.bench import suite
from ctr_jax.inference import decode
from ctr_jax.models import attention

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'd2_c256', 'A context-ready size name (random weights).')
flags.DEFINE_string('checkpoint', '', 'A training run\'s workdir: its model and weights instead.')
flags.DEFINE_integer('vocab_size', 32000, 'Vocabulary of the random-weight model.')
flags.DEFINE_integer('prompt_len', 256, 'Prompt positions (cut to a checkpoint\'s max_len).')
flags.DEFINE_integer('chunk', 64, 'Positions per chunk.')
flags.DEFINE_list('memories', ['0', '1', '2', '4'], 'Anderson memories to try (0 = plain).')
flags.DEFINE_float('tolerance', 1e-4, 'Stop a chunk once max |c_new - c| <= this.')
flags.DEFINE_integer('max_passes', 64, 'At most this many passes per chunk.')


def anderson_next(xs, gs, memory: int):
  """The next iterate from the past iterates xs and their images gs ([B, ...] each, oldest first).

  memory 0 (or a single iterate): G(x), the plain iteration. Otherwise the type-II update
  x+ = g_k - dG gamma with gamma = argmin |f_k - dF gamma|, f = g - x, over the last `memory`
  differences, solved per example (a tiny ridge term keeps the normal equations regular).
  """
  if memory == 0 or len(xs) < 2:
    return gs[-1]
  b, shape = xs[-1].shape[0], xs[-1].shape
  f = jnp.stack([(g - x).reshape(b, -1) for x, g in zip(xs, gs)], 1)
  g = jnp.stack([g.reshape(b, -1) for g in gs], 1)
  d_f, d_g = f[:, 1:] - f[:, :-1], g[:, 1:] - g[:, :-1]
  gram = jnp.einsum('bin,bjn->bij', d_f, d_f)
  ridge = 1e-10 * jnp.trace(gram, axis1=1, axis2=2)[:, None, None] * jnp.eye(gram.shape[-1])
  gamma = jnp.linalg.solve(gram + ridge, jnp.einsum('bin,bn->bi', d_f, f[:, -1])[..., None])
  return (g[:, -1] - jnp.einsum('bi,bin->bn', gamma[..., 0], d_g)).reshape(shape)


def solve_chunk(model, variables, state, tokens, memory: int, tolerance: float, max_passes: int):
  """`decode._solve_chunk`'s iteration with Anderson mixing, eagerly (for counting passes).

  Returns (z [B, n, C], state, passes used, max |c_new - c| after each pass).
  """
  apply = functools.partial(model.apply, variables)
  start = state.index
  positions = start + jnp.arange(tokens.shape[1])
  e = apply(tokens, True, positions, method='embed_tokens')
  feedback = state.feedback.astype(e.dtype)
  first = apply(feedback[:, None], e[:, :1], method='correct')
  x = jnp.zeros_like(e).at[:, :1].set(first.astype(e.dtype))
  iterate = jax.jit(lambda x, caches: apply(x, e, positions, caches=caches, cache_index=start,
                                            first_feedback=feedback, method='iterate'))
  caches, xs, gs, changes = state.caches, [], [], []
  for _ in range(max_passes):
    g, u, z, caches = iterate(x, caches)
    changes.append(float(jnp.max(jnp.abs(g - x))))
    if changes[-1] <= tolerance:
      break
    xs, gs = (xs + [x])[-(memory + 1):], (gs + [g])[-(memory + 1):]
    x = anderson_next(xs, gs, memory)
  last = apply(z[:, -1:], u[:, -1:], method='feedback')[:, 0]
  state = state.replace(caches=caches, feedback=last.astype(state.feedback.dtype),
                        index=start + tokens.shape[1])
  return z, state, len(changes), changes


def prefill(model, params, prompt, memory: int, chunk: int, tolerance: float, max_passes: int):
  """The whole prompt, chunk by chunk: (logits [B, T0, V], passes per chunk, first chunk's
  changes)."""
  variables = attention.fuse_qkv({'params': params})
  state = decode.init_decode_state(model, prompt.shape[0], prompt.shape[1] + 1)
  outputs, used, trace = [], [], None
  for s in range(0, prompt.shape[1], chunk):
    z, state, n, changes = solve_chunk(model, variables, state, prompt[:, s:s + chunk], memory,
                                       tolerance, max_passes)
    outputs.append(z)
    used.append(n)
    trace = changes if trace is None else trace
  return model.apply(variables, jnp.concatenate(outputs, 1), method='logits'), used, trace


def main(argv):
  del argv
  if FLAGS.checkpoint:
    try:
      fields, params = suite.load_checkpoint(FLAGS.checkpoint, '--checkpoint')
    except ValueError as e:  # a user mistake: no traceback
      raise app.UsageError(str(e)) from None
    prompt_len = min(FLAGS.prompt_len, fields['max_len'])
  else:
    prompt_len = FLAGS.prompt_len
    fields = {'name': FLAGS.size, 'vocab_size': FLAGS.vocab_size, 'max_len': prompt_len + 1}
    params = None
  model = models.build(suite.model_config(fields))
  if not model.spec.is_context_ready:
    raise app.UsageError(f'--size / --checkpoint: got a transformer ({fields}); allowed a '
                         'context-ready model (a transformer prefills in one pass)')
  if params is None:
    params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  prompt = jax.random.randint(jax.random.key(1), (1, prompt_len), 0, fields['vocab_size'])
  reference = decode.prefill(model, {'params': params}, prompt, prompt_len + 1)[0]
  source = FLAGS.checkpoint or f'{FLAGS.size} (random weights)'
  print(f'{source}, prompt {prompt_len}, chunk {FLAGS.chunk}, tolerance {FLAGS.tolerance:g}')
  print('| memory | passes per chunk | mean | max |Δlogit| vs scan | first chunk: max |c_new - c| '
        'per pass |')
  print('|---|---|---|---|---|')
  for memory in (int(m) for m in FLAGS.memories):
    logits, used, trace = prefill(model, params, prompt, memory, FLAGS.chunk, FLAGS.tolerance,
                                  FLAGS.max_passes)
    diff = float(jnp.max(jnp.abs(logits - reference)))
    print(f'| {memory} | {used} | {sum(used) / len(used):.1f} | {diff:.1e} | '
          f'{" ".join(f"{c:.0e}" for c in trace)} |', flush=True)


if __name__ == '__main__':
  app.run(main)
