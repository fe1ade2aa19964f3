"""One training step for every caller: the trainer, the benchmark, projects and notebooks.

The training recipe (`config.train`) decides how a batch is trained, independently of the
model's architecture:
  mode                'unroll': the parallel K-step fixed-point forward (a transformer's plain
                      forward); 'bptt': the exact sequential forward, differentiated by
                      `ctr_jax.inference.bptt` (context-ready models only).
  k_min               > 0: K ~ Uniform{k_min..model.k_unroll} per batch (random depth); 0 = fixed K.
                      BPTT has no K and ignores it.
  convergence_weight  lambda of the context-ready convergence term; BPTT has no such term and
                      ignores it.
  remat               what the backward pass recomputes instead of storing: 'none', 'iteration'
                      (each fixed-point iteration), 'layer' (each block of the unit or the
                      transformer stack), 'matmuls' (each block but its weight products; the
                      names: `ctr_jax.ops.recurrence.REMAT`). True / False in older configs and
                      checkpoints mean 'iteration' / 'none'. Unroll only: BPTT recomputes every
                      position in its backward pass already.
  grad_iterations     m > 0: backpropagate through the last m of the K iterations only (beyond
                      the paper). The first K - m run on stop_gradient'ed parameters, so they
                      store nothing for the backward pass; the forward is unchanged. 0 = all K.

    recipe = train_step.Recipe.from_config(config.train)
    step = train_step.make_train_step(model, tx, losses.NextToken(), recipe=recipe,
                                      base_rng=jax.random.key(1), deterministic=True)
    state = train_step.init_state(params, tx)
    state, metrics = jax.jit(step, static_argnums=2, donate_argnums=0)(state, batch, k)
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ctr_jax.inference import bptt
from ctr_jax.ops import recurrence

MODES = ('unroll', 'bptt')


@dataclasses.dataclass(frozen=True)
class Recipe:
  """The frozen training recipe (`config.train`); the defaults are `config_lib.get_base`'s."""
  mode: str = 'unroll'
  k_min: int = 0
  convergence_weight: float = 0.1
  remat: str = 'none'
  grad_iterations: int = 0

  def __post_init__(self):
    object.__setattr__(self, 'remat', recurrence.remat_name(self.remat))  # True -> 'iteration'

  @classmethod
  def from_config(cls, train_cfg) -> 'Recipe':
    # A field added later is missing from older saved configs: its default applies.
    return cls(**{f.name: train_cfg.get(f.name, f.default) for f in dataclasses.fields(cls)})


def validate(train_cfg, model_cfg) -> None:
  """Raises ValueError naming the `config.train` field a model cannot train with."""
  def check(ok, field, message):
    if not ok:
      raise ValueError(f'config.train.{field}: {message}')
  check(train_cfg.mode in MODES, 'mode', f'got {train_cfg.mode!r}, allowed {list(MODES)}')
  check(0 <= train_cfg.k_min <= model_cfg.k_unroll, 'k_min',
        f'must satisfy 0 <= k_min <= model.k_unroll={model_cfg.k_unroll} (0 = fixed K), got '
        f'{train_cfg.k_min}')
  check(train_cfg.convergence_weight >= 0, 'convergence_weight',
        f'must be >= 0, got {train_cfg.convergence_weight}')
  remat = recurrence.remat_name(train_cfg.get('remat', 'none'))  # one line naming the field
  m = train_cfg.get('grad_iterations', 0)
  check(isinstance(m, int) and 0 <= m <= model_cfg.k_unroll, 'grad_iterations',
        f'must be an integer in [0, model.k_unroll={model_cfg.k_unroll}] (0 = all), got {m!r}')
  if m:
    check(model_cfg.kind == 'context_ready' and train_cfg.mode == 'unroll', 'grad_iterations',
          "truncates the K-unroll: needs model.kind='context_ready' and train.mode='unroll'")
    check(not model_cfg.cumulative, 'grad_iterations',
          'needs model.cumulative=False (the cumulative ablation carries u across iterations)')
  if train_cfg.mode == 'bptt':
    check(model_cfg.kind == 'context_ready', 'mode',
          f"'bptt' needs model.kind='context_ready', got {model_cfg.kind!r} (a transformer has "
          "no sequential recurrence: use 'unroll')")
    check(not model_cfg.cumulative, 'mode',
          "'bptt' needs model.cumulative=False (the cumulative ablation has no exact sequential "
          'form)')
    check(model_cfg.dropout == 0, 'mode',
          f"'bptt' trains deterministically: needs model.dropout=0, got {model_cfg.dropout}")
    check(remat == 'none', 'remat',
          f"{remat!r} rematerialises the K-unroll: needs mode='unroll' (BPTT recomputes each "
          "position already), or 'none'")


def k_for_step(train_cfg, model_cfg, seed: int, step: int) -> int:
  """K of one training batch: fixed, or ~ Uniform{k_min..K} drawn from (seed, step).

  Only the K-unroll draws; BPTT (which has no K) gets the fixed K, so it compiles one step.
  """
  if (model_cfg.kind != 'context_ready' or train_cfg.k_min <= 0
      or train_cfg.get('mode', 'unroll') != 'unroll'):
    return model_cfg.k_unroll
  rng = np.random.default_rng([seed, step, 0x4B])
  return int(rng.integers(train_cfg.k_min, model_cfg.k_unroll + 1))


def forward(model, params, tokens, recipe: Recipe = Recipe(), *, k_unroll=None, rng=None,
            deterministic: bool = True):
  """The training forward the recipe chooses: (logits [B, T, V], aux dict).

  aux holds 'convergence_loss' (and the unroll's change statistics) for the parallel forward and
  nothing for BPTT, which has no fixed-point iteration.
  """
  if recipe.mode == 'bptt':
    if not model.spec.is_context_ready:
      raise ValueError("config.train.mode='bptt' needs a context-ready model")
    return bptt.bptt_logits(model, params, tokens), {}
  if recipe.mode != 'unroll':
    raise ValueError(f'config.train.mode: got {recipe.mode!r}, allowed {list(MODES)}')
  rngs = {'dropout': rng} if rng is not None else {}
  k = k_unroll or getattr(model.spec, 'k_unroll', 1)
  m = recipe.grad_iterations
  if model.spec.is_context_ready and 0 < m < k:
    # The first K - m iterations see constant parameters: nothing of them is differentiated, so
    # nothing is stored; the last m start from their correction.
    early = {'dropout': jax.random.fold_in(rng, 1)} if rng is not None else {}
    c = model.apply({'params': jax.lax.stop_gradient(params)}, tokens, k - m,
                    deterministic=deterministic, rngs=early, method='correction_after')
    return model.apply({'params': params}, tokens, k_unroll=m, remat=recipe.remat,
                       return_aux=True, deterministic=deterministic, rngs=rngs,
                       initial_correction=jax.lax.stop_gradient(c))
  return model.apply({'params': params}, tokens, k_unroll=k_unroll, remat=recipe.remat,
                     return_aux=True, deterministic=deterministic, rngs=rngs)


def init_state(params, tx) -> dict:
  """The training state every loop starts from: {'step', 'params', 'opt_state'}."""
  return {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': tx.init(params)}


def objective_loss(model, params, batch, objective, recipe: Recipe = Recipe(), *, k_unroll=None,
                   rng=None, deterministic: bool = True):
  """The recipe's forward on `objective.inputs(batch)`, scored by `objective.loss`.

  `objective` is a task, or any object with `inputs(batch)` and `loss(logits, aux, batch) ->
  (loss, metrics)` (e.g. `ctr_jax.tasks.losses.NextToken()`). Returns (loss, metrics).
  """
  logits, aux = forward(model, params, objective.inputs(batch), recipe, k_unroll=k_unroll, rng=rng,
                        deterministic=deterministic)
  return objective.loss(logits, aux, batch)


def make_train_step(model, tx, objective, *, recipe: Recipe = Recipe(), base_rng,
                    deterministic: bool, prepare_params=None):
  """A pure step `(state, batch, k_unroll) -> (state, metrics)`; jit it with k_unroll static.

  Args:
    model: the flax module.
    tx: the optax optimizer (`ctr_jax.training.optim.make_optimizer`).
    objective: what the model reads and how its logits are scored (`objective_loss`): the
      trainer passes its task.
    recipe: how the batch is trained (the forward: K-unroll, BPTT, truncated gradients).
    base_rng: the dropout key of step s is `fold_in(base_rng, s)`, so a resumed run draws the same.
    deterministic: no dropout.
    prepare_params: applied to the parameters before the forward (e.g. stop_gradient on frozen
      ones, so their backward pass is never computed); None = as they are.

  state is `init_state(params, tx)`; metrics are the objective's plus the global norms of the
  gradient, the new parameters and the update.
  """
  def train_step(state, batch, k_unroll):
    rng = jax.random.fold_in(base_rng, state['step'])

    def loss(p):
      p = prepare_params(p) if prepare_params is not None else p
      return objective_loss(model, p, batch, objective, recipe, k_unroll=k_unroll, rng=rng,
                            deterministic=deterministic)

    (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state['params'])
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    metrics = {**metrics, 'grad_norm': optax.global_norm(grads),
               'param_norm': optax.global_norm(params),
               'update_norm': optax.global_norm(updates)}
    return {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state}, metrics

  return train_step
