"""The two recurrences every model shares, in one place.

* `fixed_point_unroll`: K iterations of a step with shared weights, as one `nn.scan` (the lifted
  `jax.lax.scan`), all positions in parallel. Used by the context-ready parallel forward.
  `unrolled_loops()` makes it emit the K iterations as straight-line code instead (the same
  function), for XLA's cost analysis, which counts a loop's body once.
* `REMAT` and `remat_name`: what the backward pass of the training forward recomputes instead of
  storing (`config.train.remat`).
* `DecodeState` + `shift_right`: the state of the exact left-to-right scan over positions that
  `ctr_jax.inference.decode` runs for both model kinds.
"""

import contextlib
import contextvars
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

# config.train.remat, the names the models take (`model.apply(..., remat=NAME)`):
#   'none'       store every activation the backward pass needs;
#   'iteration'  each fixed-point iteration of the context-ready K-unroll is recomputed from its
#                carry (a transformer has no iterations: nothing changes);
#   'layer'      each block of the unit (or of the transformer's stack) is recomputed from its
#                input;
#   'matmuls'    the same per block, but the outputs of its matmuls without batch dimensions
#                (the weight products; not attention's score products) are stored
#                (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`).
REMAT = ('none', 'iteration', 'layer', 'matmuls')
SAVE_MATMULS = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
_BOOLS = {'true': 'iteration', 'false': 'none'}


def remat_name(value: Any) -> str:
  """One of `REMAT` for a `config.train.remat` value; older configs and checkpoints hold booleans
  (True -> 'iteration', what True meant before the names, False -> 'none')."""
  if isinstance(value, (bool, int)) and not isinstance(value, str) and value in (0, 1):
    return 'iteration' if value else 'none'
  if isinstance(value, str) and value.lower() in _BOOLS:
    return _BOOLS[value.lower()]
  if value in REMAT:
    return value
  raise ValueError(f'config.train.remat: got {value!r}, allowed {list(REMAT)} (or True = '
                   "'iteration', False = 'none')")


_UNROLLED = contextvars.ContextVar('unrolled_loops', default=False)


@contextlib.contextmanager
def unrolled_loops():
  """Within it, `fixed_point_unroll` traces its K iterations as straight-line code, not a loop.

  The function is the same; XLA's cost analysis counts a loop body once whatever its trip
  count, so a FLOP count of the whole K-unroll needs it unrolled (`ctr_jax.training.aot`).
  """
  token = _UNROLLED.set(True)
  try:
    yield
  finally:
    _UNROLLED.reset(token)


def fixed_point_unroll(module: nn.Module, step: Callable, carry: Any, num_steps: int, *,
                       remat: bool = False):
  """Runs `carry, out = step(module, carry)` `num_steps` times; returns (carry, stacked outs).

  The weights of `module` are broadcast into the loop (shared by every iteration) and dropout
  draws fresh randomness per iteration. With `remat`, each iteration's activations are recomputed
  in the backward pass, so memory stays that of one iteration plus the carries.
  """
  def body(mdl, c, _):
    return step(mdl, c)
  if remat:
    body = nn.remat(body, prevent_cse=False)
  scan = nn.scan(body, variable_broadcast='params', split_rngs={'params': False, 'dropout': True},
                 length=num_steps, unroll=max(num_steps, 1) if _UNROLLED.get() else 1)
  return scan(module, carry, None)


def shift_right(x: jax.Array, first: jax.Array | None = None) -> jax.Array:
  """[B, T, C] -> [B, T, C] with out[:, t] = x[:, t-1] and out[:, 0] = first [B, C], default 0
  (z_{-1} = 0; a later chunk of a sequence passes the previous chunk's last z)."""
  if first is None:
    return jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :-1]
  return jnp.concatenate([first[:, None].astype(x.dtype), x[:, :-1]], axis=1)


@flax.struct.dataclass
class DecodeState:
  """What a model carries from one position to the next during exact sequential inference.

  caches:   per-layer {'k': [B*G, Dh, S], 'v': [B*G, S, Dh]} (attention.Cache); S = the longest
            sequence this state holds.
  feedback: [B, C] the cached block output z_{t-1} of the context-ready model (for the
            correction='none' ablation, the block delta z_{t-1} - u_{t-1}); unused by transformers.
  index:    int32 scalar, the position the next token is written to.
  """
  caches: tuple
  feedback: jax.Array
  index: jax.Array
