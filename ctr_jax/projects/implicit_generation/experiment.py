"""The implicit-update paper's generation experiment (its section 4), for
`ctr_jax.projects.implicit_generation`: small trained models or Hugging Face checkpoints.

For each prompt the baseline model generates greedily with the whole history; at every step the
patches are recomputed and the patched model sees only the current token at its absolute
position. The next token is always the baseline's (teacher forcing), so every step of every
setting is compared on the same history. Per step: argmax agreement, max |Δlogit| and the
total-variation distance of the two softmax distributions.

Because the history is the baseline's in every setting, all (prompt, step) pairs are known once
the baseline has generated, and the full-context records and logits of the greedy run itself
are the baseline of every setting (one computation per dtype: the margin and the tokens chosen
are the ones compared against). Each setting is then batched `patched_next_token` calls over
the pairs (`first_layer` is traced, so the ablation over it does not recompile). Reporting is in
`implicit_generation_report`.
"""

import dataclasses
import functools
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import implicit, models
from ctr_jax.reporting import machine as machine_info
from ctr_jax.tasks import losses
from ctr_jax.training import optim, train_step


def total_variation(logits_a, logits_b):
  """½ Σ_v |softmax(a) − softmax(b)| per row."""
  p = jax.nn.softmax(jnp.asarray(logits_a, jnp.float32), axis=-1)
  q = jax.nn.softmax(jnp.asarray(logits_b, jnp.float32), axis=-1)
  return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)


def step_metrics(baseline, patched) -> dict[str, np.ndarray]:
  """Per-row argmax agreement, max |Δlogit|, total variation of logits [N, V], and the
  baseline's top-1 minus top-2 logit (how close the greedy decision was to a tie)."""
  baseline = jnp.asarray(baseline, jnp.float32)
  patched = jnp.asarray(patched, jnp.float32)
  top2 = jax.lax.top_k(baseline, 2)[0]
  return {'agree': np.asarray(jnp.argmax(baseline, -1) == jnp.argmax(patched, -1)),
          'max_abs_logit': np.asarray(jnp.max(jnp.abs(baseline - patched), axis=-1)),
          'tvd': np.asarray(total_variation(baseline, patched)),
          'margin': np.asarray(top2[:, 0] - top2[:, 1])}


def train(model_cfg, train_tokens: np.ndarray, *, steps: int, batch_size: int, seq_len: int,
          optim_config, seed: int = 0, log=print):
  """A few hundred AdamW steps on random windows of a token stream; returns (model, variables)."""
  model = models.build(model_cfg)
  rng = np.random.default_rng(seed)
  params = jax.jit(model.init)(jax.random.key(seed),
                               jnp.zeros((1, seq_len), jnp.int32))['params']
  tx = optim.make_optimizer(optim_config, steps)
  state = train_step.init_state(params, tx)
  # The trainer's step and language-modelling loss (these models are dropout-free transformers).
  update = jax.jit(train_step.make_train_step(model, tx, losses.NextToken(),
                                              base_rng=jax.random.key(seed), deterministic=True),
                   static_argnums=2)

  offsets = np.arange(seq_len + 1)
  start, loss = time.time(), None
  for step in range(1, steps + 1):
    starts = rng.integers(0, len(train_tokens) - seq_len - 1, batch_size)
    batch = jnp.asarray(np.asarray(train_tokens[starts[:, None] + offsets], np.int32))
    state, metrics = update(state, batch, None)
    loss = metrics['loss']
    if step % max(steps // 4, 1) == 0 or step == steps:
      log(f'  step {step}/{steps}: loss {float(loss):.3f} ({time.time() - start:.0f} s)')
  return model, {'params': state['params']}, float(loss)


def cast(model, variables, dtype: str):
  """The same model computing and storing its parameters in `dtype`."""
  spec = dataclasses.replace(model.spec, dtype=dtype, param_dtype=dtype)
  params = jax.tree.map(lambda x: x.astype(dtype), variables['params'])
  return type(model)(spec), {'params': params}


@dataclasses.dataclass
class Baseline:
  """The baseline's greedy run: every (prompt, step) pair the settings are compared on.

  Row r = prompt * num_tokens + step: the query is `query[r]` at absolute position
  `positions[r]`, with the full-context records and logits of that very forward pass (the one
  that chose the next token), so every setting is compared against one baseline.
  """
  tokens: np.ndarray      # [P, T] prompts and greedy continuations, right-padded
  lengths: np.ndarray     # [P] prompt lengths
  num_tokens: int
  query: np.ndarray       # [P * N]
  positions: np.ndarray   # [P * N]
  records: list           # per layer {name: [P * N, ...]}
  logits: np.ndarray      # [P * N, V]


def greedy_baseline(model, variables, prompts: list[list[int]], num_tokens: int) -> Baseline:
  """The baseline's greedy continuation of each prompt, keeping each step's full-context
  records and logits for the patched passes."""
  lengths = np.array([len(p) for p in prompts])
  tokens = np.zeros((len(prompts), lengths.max() + num_tokens), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  steps = []
  for step in range(num_tokens):
    last = lengths - 1 + step
    records, logits = implicit.record_next_token(model, variables, tokens, last + 1)
    tokens[np.arange(len(prompts)), last + 1] = np.asarray(jnp.argmax(logits, -1))
    steps.append(jax.device_get((records, logits)))
  # [steps][P] -> rows ordered prompt-major.
  stack = lambda *xs: np.stack(xs, axis=1).reshape((-1,) + xs[0].shape[1:])
  records, logits = jax.tree.map(stack, *steps)
  positions = (lengths[:, None] - 1 + np.arange(num_tokens)).reshape(-1)
  query = tokens[np.repeat(np.arange(len(prompts)), num_tokens), positions]
  return Baseline(tokens, lengths, num_tokens, query, positions, records, logits)


def greedy_history(model, variables, prompts: list[list[int]], num_tokens: int):
  """(tokens [P, T] right-padded, prompt lengths [P]) of the baseline's greedy run."""
  run = greedy_baseline(model, variables, prompts, num_tokens)
  return run.tokens, run.lengths


@dataclasses.dataclass(frozen=True)
class Setting:
  dtype: str
  method: str
  mode: str
  first_layer: int
  loop: str = 'closed'   # 'open': each layer's patch from the recorded (unpatched) path


@functools.partial(jax.jit, static_argnames=('model', 'method', 'mode', 'loop'))
def _patch_then_apply(model, variables, records, query, positions, first_layer, method, mode,
                      loop):
  """Computes the patch (closed or open loop), then a second pass of the query alone with
  it applied: the logits a deployed patch gives, whichever loop computed it."""
  x = implicit.algorithm.embed(model, variables, query, positions)
  _, patch, _ = implicit.algorithm.reduced(model, variables, x, positions, records=records,
                                           method=method, mode=mode, loop=loop,
                                           first_layer=first_layer)
  out = implicit.algorithm.reduced(model, variables, x, positions, patch=patch, mode=mode)
  return out[:, -1]


def patched_then_applied(model, variables, records, query, positions, *, method: str,
                         mode: str, first_layer: int, loop: str) -> jax.Array:
  """Patched next-token logits [B, V] from a separate pass that applies the patch computed
  by the closed loop (Algorithm 1) or the open loop; `implicit.patched_next_token` returns the
  computing pass's own logits, which in the open loop are not the patched model's."""
  query = jnp.asarray(query, jnp.int32).reshape(-1, 1)
  positions = jnp.asarray(positions, jnp.int32).reshape(-1, 1)
  return _patch_then_apply(model, variables, records, query, positions,
                           jnp.asarray(first_layer, jnp.int32), method=method, mode=mode,
                           loop=loop)


def auto_chunk(spec, mode: str, rows: int, budget_gb: float) -> int:
  """(prompt, step) pairs per call within about `budget_gb` of patch memory.

  'materialise' forms one patched copy of every MLP matrix per example (in float32, then in
  the parameter dtype), and XLA may keep a few layers' copies alive at once; 'action' never
  forms them, so it takes every row.
  """
  if mode != 'materialise':
    return rows
  per_example = 3 * spec.width * spec.mlp_dim * (4 + 4 + 2) * 3  # 3 matrices, 3 layers alive
  return int(max(1, min(rows, budget_gb * 2**30 // per_example)))


def evaluate(model, variables, baseline: Baseline, settings, *, chunk: int = 0,
             budget_gb: float = 4.0, log=None,
             separate_pass: bool = False) -> dict[Setting, dict[str, np.ndarray]]:
  """Metrics [P, num_tokens] of every setting (all with this model's dtype), against the one
  baseline; `chunk` = 0 picks it per mode (`auto_chunk`). Each setting's dict also holds
  'layers': the per-layer diagnostics {name: [L, P, num_tokens]} and 'seconds'.
  `separate_pass`: the logits come from `patched_then_applied` (needed for the open loop;
  then no per-layer diagnostics)."""
  rows = len(baseline.query)
  shape = (len(baseline.lengths), baseline.num_tokens)
  results = {}
  for setting in settings:
    size = chunk or auto_chunk(model.spec, setting.mode, rows, budget_gb)
    start, parts, layers = time.time(), [], []
    for s in range(0, rows, size):
      records = jax.tree.map(lambda a, s=s: a[s:s + size], baseline.records)
      if separate_pass or setting.loop != 'closed':
        patched = patched_then_applied(
            model, variables, records, baseline.query[s:s + size],
            baseline.positions[s:s + size], method=setting.method, mode=setting.mode,
            first_layer=setting.first_layer, loop=setting.loop)
        parts.append(step_metrics(baseline.logits[s:s + size], patched))
        continue
      patched, extras = implicit.patched_next_token(
          model, variables, records, baseline.query[s:s + size],
          baseline.positions[s:s + size], method=setting.method, mode=setting.mode,
          first_layer=setting.first_layer)
      metrics = step_metrics(baseline.logits[s:s + size], patched)
      extras = jax.device_get(extras)
      if 'dm_max' in extras:
        metrics['dm_max'] = np.max(extras['dm_max'], axis=0).astype(np.float32)
      parts.append(metrics)
      layers.append(extras)
    out = {k: np.concatenate([m[k] for m in parts]).reshape(shape) for k in parts[0]}
    out['layers'] = {k: np.concatenate([e[k] for e in layers], axis=1).reshape((-1,) + shape)
                     for k in (layers[0] if layers else ())}
    out['seconds'] = time.time() - start
    if log is not None:
      log(f'    {setting}: {out["seconds"]:.0f} s (chunk {size})')
    results[setting] = out
  return results


def settings_for(block: str, depth: int, dtypes, methods, modes,
                 materialise_first_layers=None, first_layers=None,
                 loops=('closed',)) -> list[Setting]:
  """The grid: 'stable' only where it differs from 'direct' (Gemma's post-norm); first
  patched layers 0, L/2, L - 1 or `first_layers` (for 'materialise' only those in
  `materialise_first_layers` if given, the cheap reduction of a slow run); each loop."""
  methods = [m for m in methods if m == 'direct' or block == 'gemma']
  firsts = sorted(set(first_layers) if first_layers else {0, depth // 2, depth - 1})
  out = []
  for s in itertools.product(dtypes, methods, modes, firsts, loops):
    if (s[2] == 'materialise' and materialise_first_layers is not None
        and s[3] not in materialise_first_layers):
      continue
    out.append(Setting(*s))
  return out


def summarise(metrics: dict[str, np.ndarray]) -> dict[str, float]:
  out = {'agreement': float(metrics['agree'].mean()),
         'max_abs_logit': float(metrics['max_abs_logit'].max()),
         'mean_abs_logit': float(metrics['max_abs_logit'].mean()),
         'max_tvd': float(metrics['tvd'].max()), 'mean_tvd': float(metrics['tvd'].mean()),
         'min_margin': float(metrics['margin'].min())}
  if 'dm_max' in metrics:
    out['max_dm'] = float(metrics['dm_max'].max())
  return out


def cluster_bootstrap(values, *, resamples: int = 10000, seed: int = 0,
                      level: float = 0.95) -> dict[str, float]:
  """Mean of per-cluster values [n] (here: one per prompt) with a percentile bootstrap
  interval that resamples whole clusters with replacement: the tokens of one prompt share a
  history and are correlated, so the prompt is the independent unit. The interval is the
  (1 - level) / 2 and (1 + level) / 2 quantiles of `resamples` resampled means (fixed seed)."""
  values = np.asarray(values, np.float64).reshape(-1)
  rng = np.random.default_rng(seed)
  means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
  lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
  return {'mean': float(values.mean()), 'lo': float(lo), 'hi': float(hi), 'n': len(values)}


def per_prompt(metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Per prompt [P]: argmax agreement, mean and max of the per-token max |Δlogit|."""
  agree = np.asarray(metrics['agree'], np.float64)
  dlogit = np.asarray(metrics['max_abs_logit'], np.float64)
  return {'agreement': agree.mean(axis=1), 'mean_abs_logit': dlogit.mean(axis=1),
          'max_abs_logit': dlogit.max(axis=1)}


def interval_summary(runs: list[dict], *, resamples: int = 10000, seed: int = 0) -> dict:
  """95% cluster-bootstrap intervals of every run (its 'setting' and 'per_step' [P, N]) and
  of the paired per-prompt differences stable - direct (same dtype and loop) and open - closed
  (same dtype and method); a difference resamples the prompts' differences."""
  def key(setting):
    return '/'.join(str(setting[k]) for k in ('dtype', 'method', 'mode', 'first_layer',
                                               'loop'))

  stats = {key(r['setting']): per_prompt(r['per_step']) for r in runs}
  boot = functools.partial(cluster_bootstrap, resamples=resamples, seed=seed)
  out = {'resamples': resamples, 'seed': seed, 'level': 0.95, 'runs': {}, 'differences': {}}
  for name, stat in stats.items():
    out['runs'][name] = {k: boot(v) for k, v in stat.items()}
    out['runs'][name]['per_prompt_agreement'] = stat['agreement'].tolist()
  pairs = [('method', 'direct', 'stable'), ('loop', 'closed', 'open')]
  for r in runs:
    for field, a, b in pairs:
      if r['setting'].get(field) != a:
        continue
      other = dict(r['setting'], **{field: b})
      if key(other) not in stats:
        continue
      base, alt = stats[key(r['setting'])], stats[key(other)]
      out['differences'][f'{key(other)} - {key(r["setting"])}'] = {
          'field': field, 'a': key(r['setting']), 'b': key(other),
          **{k: boot(alt[k] - base[k]) for k in base}}
  return out


def dm_layers(layers: dict[str, np.ndarray]) -> list[dict]:
  """Per layer: where the largest scale patch of all (prompt, step) pairs sits and what made
  it large (its numerator, the denominator f = N(h) and h there, the scale m there, the
  stable update's μ), with the most frequent argmax channel over the pairs."""
  if 'dm_max' not in layers:
    return []
  out = []
  for i in range(layers['dm_max'].shape[0]):
    at = {k: v[i].reshape(-1) for k, v in layers.items()}
    row = int(np.argmax(at['dm_max']))
    channels, counts = np.unique(at['dm_channel'], return_counts=True)
    entry = {'layer': i, 'max_dm': float(at['dm_max'][row]),
             'median_dm': float(np.median(at['dm_max'])),
             'channel': int(at['dm_channel'][row]),
             'numerator': float(at['dm_numerator'][row]), 'f': float(at['dm_f'][row]),
             'h': float(at['dm_h'][row]), 'rms_h': float(at['rms_h'][row]),
             'scale': float(at['dm_scale'][row]),
             'min_abs_f': float(np.min(at['min_abs_f'])),
             'top_channel': int(channels[np.argmax(counts)]),
             'top_channel_share': float(counts.max() / counts.sum())}
    if 'mu' in at:
      entry['mu'] = float(at['mu'][row])
    out.append(entry)
  return out


def machine() -> str:
  """CPU model and core count (or the accelerator) and library versions the experiment ran on."""
  return machine_info.summary_line(machine_info.describe())
