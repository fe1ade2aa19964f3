"""The implicit-update paper's generation experiment (its section 4), for
`scripts/implicit_generation.py`: small trained models or Hugging Face checkpoints.

For each prompt the baseline model generates greedily with the whole history; at every step the
patches are recomputed and the patched model sees only the current token at its absolute
position. The next token is always the baseline's (teacher forcing), so every step of every
setting is compared on the same history. Per step: argmax agreement, max |Δlogit| and the
total-variation distance of the two softmax distributions.

Because the history is the baseline's in every setting, all (prompt, step) pairs are known once
the baseline has generated; each setting is then one batched `next_token_comparison` over them
(`first_layer` is traced, so the ablation over it does not recompile).
"""

import dataclasses
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import implicit
from ctr_jax import losses
from ctr_jax import models
from ctr_jax import optim
from ctr_jax import train_step
from ctr_jax.implicit import algorithm


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
  state = {'step': jnp.zeros((), jnp.int32), 'params': params, 'opt_state': tx.init(params)}
  # The trainer's step and language-modelling loss (these models are dropout-free transformers).
  update = jax.jit(train_step.make_train_step(model, tx, losses.model_loss,
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


def cast(model_cfg, variables, dtype: str):
  """The same model computing and storing its parameters in `dtype`."""
  cfg = models.model_config(**{**model_cfg.to_dict(), 'dtype': dtype, 'param_dtype': dtype})
  params = jax.tree.map(lambda x: x.astype(dtype), variables['params'])
  return models.build(cfg), {'params': params}


def greedy_history(model, variables, prompts: list[list[int]], num_tokens: int):
  """The baseline's greedy continuation of each prompt, from the same full-context logits the
  patches are computed against. Returns (tokens [P, T] right-padded, prompt lengths [P])."""
  lengths = np.array([len(p) for p in prompts])
  tokens = np.zeros((len(prompts), lengths.max() + num_tokens), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  baseline = jax.jit(lambda v, t, last: algorithm.record(model, v, t, last, 1)[1])
  for step in range(num_tokens):
    last = lengths - 1 + step
    logits = baseline(variables, jnp.asarray(tokens), jnp.asarray(last))
    tokens[np.arange(len(prompts)), last + 1] = np.asarray(jnp.argmax(logits, -1))
  return tokens, lengths


@dataclasses.dataclass(frozen=True)
class Setting:
  dtype: str
  method: str
  mode: str
  first_layer: int


def evaluate(model, variables, tokens, prompt_lengths, num_tokens: int, settings, *,
             chunk: int = 128) -> dict[Setting, dict[str, np.ndarray]]:
  """Metrics [P, num_tokens] of every setting (all with this model's dtype)."""
  p = len(prompt_lengths)
  rows = np.repeat(np.arange(p), num_tokens)
  lengths = (np.asarray(prompt_lengths)[:, None] + np.arange(num_tokens)).reshape(-1)
  all_tokens = tokens[rows]
  results = {}
  for setting in settings:
    parts = []
    for s in range(0, len(rows), chunk):
      base, patched, extras = implicit.next_token_comparison(
          model, variables, all_tokens[s:s + chunk], lengths[s:s + chunk],
          method=setting.method, mode=setting.mode, first_layer=setting.first_layer)
      metrics = step_metrics(base, patched)
      if 'dm_max' in extras:
        metrics['dm_max'] = np.asarray(jnp.max(extras['dm_max'], axis=0), np.float32)
      parts.append(metrics)
    results[setting] = {k: np.concatenate([m[k] for m in parts]).reshape(p, num_tokens)
                        for k in parts[0]}
  return results


def settings_for(block: str, depth: int, dtypes, methods, modes) -> list[Setting]:
  """The grid: 'stable' only where it differs from 'direct' (Gemma's post-norm)."""
  methods = [m for m in methods if m == 'direct' or block == 'gemma']
  firsts = sorted({0, depth // 2, depth - 1})
  return [Setting(*s) for s in itertools.product(dtypes, methods, modes, firsts)]


def summarise(metrics: dict[str, np.ndarray]) -> dict[str, float]:
  out = {'agreement': float(metrics['agree'].mean()),
         'max_abs_logit': float(metrics['max_abs_logit'].max()),
         'mean_abs_logit': float(metrics['max_abs_logit'].mean()),
         'max_tvd': float(metrics['tvd'].max()), 'mean_tvd': float(metrics['tvd'].mean()),
         'min_margin': float(metrics['margin'].min())}
  if 'dm_max' in metrics:
    out['max_dm'] = float(metrics['dm_max'].max())
  return out


def machine() -> str:
  """CPU model and core count (or the accelerator) and library versions the experiment ran on."""
  from ctr_jax.bench import machine as bench_machine  # pylint: disable=g-import-not-at-top
  return bench_machine.summary_line(bench_machine.describe())


def _label(setting: dict) -> str:
  return (f"{setting['dtype']} {setting['method']} {setting['mode']} "
          f"L{setting['first_layer']}+")


def table(results: dict) -> str:
  """Markdown table of every run's summary."""
  lines = ['| model | dtype | method | apply | first layer | agreement | max abs dlogit | '
           'mean abs dlogit | max TVD | mean TVD | max abs dm | min top-2 margin |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for name, family in results['families'].items():
    for run in family['runs']:
      s, m = run['setting'], run['summary']
      dm = f"{m['max_dm']:.3g}" if 'max_dm' in m else '-'
      lines.append(f"| {name} | {s['dtype']} | {s['method']} | {s['mode']} | "
                   f"{s['first_layer']} | {100 * m['agreement']:.0f}% | "
                   f"{m['max_abs_logit']:.2e} | {m['mean_abs_logit']:.2e} | "
                   f"{m['max_tvd']:.2e} | {m['mean_tvd']:.2e} | {dm} | "
                   f"{m['min_margin']:.3f} |")
  return '\n'.join(lines) + '\n'


def write_report(results: dict, workdir: str, figures_dir: str = ''):
  """results.json and table.md in `workdir`; the two figures in `figures_dir` (or workdir)."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  with open(os.path.join(workdir, 'results.json'), 'w') as f:
    json.dump(results, f)
  with open(os.path.join(workdir, 'table.md'), 'w') as f:
    f.write(table(results))
  out_dir = figures_dir or workdir
  os.makedirs(out_dir, exist_ok=True)

  # Per-token metrics of the first prompt, every layer-0 setting, Gemma if it ran.
  families = results['families']
  name = 'gemma' if 'gemma' in families else next(iter(families))
  family = families[name]
  runs = [r for r in family['runs'] if r['setting']['first_layer'] == 0]
  fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
  for run in runs:
    steps = np.arange(1, len(run['per_step']['agree'][0]) + 1)
    label = _label(run['setting'])
    axes[0].plot(steps, np.asarray(run['per_step']['agree'][0], float), 'o-', label=label,
                 alpha=0.7)
    axes[1].semilogy(steps, np.maximum(run['per_step']['max_abs_logit'][0], 1e-9), label=label)
    axes[2].semilogy(steps, np.maximum(run['per_step']['tvd'][0], 1e-12), label=label)
  for ax, title in zip(axes, ('argmax agreement', 'max |Δlogit|', 'total variation')):
    ax.set_title(title)
    ax.set_xlabel('generated token')
  axes[0].set_ylim(-0.1, 1.1)
  axes[2].legend(fontsize=7)
  fig.suptitle(f'{name}: prompt 1, patched without context vs with context')
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, 'implicit_generation_metrics.png'), dpi=110)
  plt.close(fig)

  # Summary over all prompts and tokens.
  labels, agreement, worst, tvd = [], [], [], []
  for name, family in results['families'].items():
    for run in family['runs']:
      labels.append(f"{name} {_label(run['setting'])}")
      agreement.append(100 * run['summary']['agreement'])
      worst.append(run['summary']['max_abs_logit'])
      tvd.append(run['summary']['mean_tvd'])
  fig, axes = plt.subplots(3, 1, figsize=(max(8, 0.28 * len(labels)), 9), sharex=True)
  x = np.arange(len(labels))
  axes[0].bar(x, agreement, color='tab:blue')
  axes[0].set_ylabel('argmax agreement (%)')
  axes[0].set_ylim(min(agreement + [90]) - 2, 100.5)
  axes[1].bar(x, np.maximum(worst, 1e-9), color='tab:red', log=True)
  axes[1].set_ylabel('max |Δlogit|')
  axes[2].bar(x, np.maximum(tvd, 1e-12), color='tab:green', log=True)
  axes[2].set_ylabel('mean total variation')
  axes[2].set_xticks(x)
  axes[2].set_xticklabels(labels, rotation=90, fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, 'implicit_generation_summary.png'), dpi=110)
  plt.close(fig)
