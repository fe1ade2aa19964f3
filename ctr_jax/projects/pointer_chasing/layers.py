"""Where in depth a trained pointer-chasing transformer holds each level's answer.

  python -m ctr_jax.projects.pointer_chasing.layers --workdirs=workdirs/pointer_chasing/h3_t3_entry_equals_tables
  python -m ctr_jax.projects.pointer_chasing.layers --workdirs=DIR1,DIR2 --out=docs/pointer_chasing_layers.json

For every entry of every table (`target = key`, all three slots carry the resolved value of the
entry's key) and for the residual stream after each layer (0: the embeddings, n: after block n),
two read-outs of that value:
  lens:  the model's own final norm and head applied to the residual (a logit lens): is the
         answer already written in the direction the output reads?
  probe: a linear read-out (least squares onto the 16 one-hot values, with a bias) fitted on
         --fit_examples examples of one stream and scored on --examples fresh ones: is the answer
         linearly present in any direction, whether or not the head can read it there?
A level-L key whose answer only appears after the last block cannot feed a later lookup: the
composition a level-(L+1) key needs has no layer left (docs/pointer_chasing.md, "A hop
curriculum, and where the answers live"). Transformers only (a context-ready unit's layers are iterated, not stacked).

The json holds the command, each workdir's checkpoint step, and the accuracy per (level, slot,
layer) for both read-outs.
"""

import json
import os
import shlex
import sys

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from ctr_jax import models
from ctr_jax.bench import suite
from ctr_jax.data import pointer_chasing as generator
from ctr_jax.projects import paths
from ctr_jax.training import checkpointing
from ctr_jax.training import workdir as workdir_lib

ROOT = paths.REPO_ROOT

FLAGS = flags.FLAGS
flags.DEFINE_string('workdirs', '', 'Comma-separated workdirs of pointer-chasing transformer runs.')
flags.DEFINE_integer('examples', 1024, 'Fresh examples each read-out is scored on.')
flags.DEFINE_integer('fit_examples', 2048, 'Examples the linear probes are fitted on.')
flags.DEFINE_string('out', '', 'If set, write the json here.')

SLOTS = ('target side', "'='", 'key')
FIT_SEED, SCORE_SEED = -2, generator.EVAL_SEED  # both apart from every training seed (>= 0)


def residuals(model, params, tokens) -> list[jax.Array]:
  """[embeddings, after block 1, ..., after block N], each float32 [B, T, C] (traceable)."""
  is_block = lambda mdl, method: method == '__call__' and (mdl.name or '').startswith('block_')
  _, state = model.apply({'params': params}, tokens, capture_intermediates=is_block)
  stack = state['intermediates']['blocks']
  after = [stack[f'block_{i}']['__call__'][0][0].astype(jnp.float32)
           for i in range(model.spec.depth)]
  e = model.apply({'params': params}, tokens, True, method='embed_tokens')
  return [e.astype(jnp.float32)] + after


def entry_slots(hops: int, encoding: str) -> dict[tuple[int, str], np.ndarray]:
  """(table level, slot) -> the positions of that slot in the level's table (8 each); level 0
  has no target side with a lookup (it is the value token itself)."""
  labels = generator.position_labels(hops, encoding)
  # An entry's target side is labelled with the level of the key it holds, one below its table.
  kinds = tuple(zip((generator.ENTRY_TARGET, generator.EQUALS_TARGET, generator.TABLE_KEY),
                    (1, 0, 0), SLOTS))
  return {(level, slot): np.flatnonzero((labels.kind == kind) & (labels.level + shift == level))
          for level in range(hops) for kind, shift, slot in kinds
          if level or kind != generator.ENTRY_TARGET}


def _stream(hops, encoding, seed, count, batch=64):
  """Tokens and the dense answers (every entry slot: its key's resolved value), in batches."""
  for start in range(0, count, batch):
    yield generator.batch(hops, min(batch, count - start), seed, start=start, encoding=encoding,
                          entry_targets=True, equals_targets=True)


def layer_readouts(model, params, hops: int, encoding: str, examples: int,
                   fit_examples: int) -> list[dict]:
  """One row per (level, slot): lens and probe accuracy after each layer (see the docstring)."""
  if model.spec.is_context_ready:
    raise ValueError('a context-ready model: this analysis reads stacked layers')
  slots = entry_slots(hops, encoding)
  value0 = generator.value_token(hops, 0)
  layers = model.spec.depth + 1

  @jax.jit
  def run(tokens):  # every layer's residual, and the head's guess read off it (the lens)
    stream = residuals(model, params, tokens)
    lens = [model.apply({'params': params}, x, method='logits').argmax(-1) for x in stream]
    return stream, lens

  def collect(seed, count, with_lens):
    feats = {k: [[] for _ in range(layers)] for k in slots}
    answers = {k: [] for k in slots}
    lens_hits = {k: np.zeros(layers) for k in slots}
    for tokens, targets in _stream(hops, encoding, seed, count):
      stream, lens = jax.tree.map(np.asarray, run(jnp.asarray(tokens)))
      for key, pos in slots.items():
        answers[key].append(targets[:, pos].reshape(-1) - value0)
        for layer, x in enumerate(stream):
          feats[key][layer].append(x[:, pos].reshape(-1, x.shape[-1]))
          if with_lens:
            lens_hits[key][layer] += np.sum(lens[layer][:, pos] == targets[:, pos])
    feats = {k: [np.concatenate(f) for f in v] for k, v in feats.items()}
    answers = {k: np.concatenate(v) for k, v in answers.items()}
    return feats, answers, lens_hits

  fit_x, fit_y, _ = collect(FIT_SEED, fit_examples, with_lens=False)
  score_x, score_y, lens_hits = collect(SCORE_SEED, examples, with_lens=True)
  rows = []
  for key in slots:
    probe = []
    for layer in range(layers):
      mean, scale = fit_x[key][layer].mean(0), fit_x[key][layer].std(0) + 1e-6
      design = lambda x: np.concatenate([(x - mean) / scale, np.ones((len(x), 1))], axis=1)
      onehot = np.eye(generator.NUM_VALUES)[fit_y[key]]
      weights, *_ = np.linalg.lstsq(design(fit_x[key][layer]), onehot, rcond=None)
      guess = (design(score_x[key][layer]) @ weights).argmax(-1)
      probe.append(float(np.mean(guess == score_y[key])))
    count = len(score_y[key])
    rows.append({'level': key[0], 'slot': key[1],
                 'lens': [float(h / count) for h in lens_hits[key]], 'probe': probe})
  return rows


def analyse(workdir: str, examples: int, fit_examples: int) -> dict:
  """`layer_readouts` of the latest checkpoint of a pointer-chasing run's workdir."""
  with open(os.path.join(workdir, 'config.json')) as f:
    data = json.load(f)['data']
  hops, encoding = int(data['hops']), data.get('encoding', generator.DEFAULT_ENCODING)
  fields, params = suite.load_checkpoint(workdir, field='--workdirs')
  model = models.build(suite.model_config(fields))
  rows = layer_readouts(model, params, hops, encoding, examples, fit_examples)
  step = max(checkpointing.steps(workdir))  # the checkpoint `load_checkpoint` restored
  return {'workdir': workdir, 'model': f't{model.spec.depth}', 'depth': model.spec.depth,
          'hops': hops, 'encoding': encoding, 'step': step, 'rows': rows}


def table(result: dict) -> str:
  depth = result['depth']
  lines = [f"{result['workdir']} (depth {depth}, H = {result['hops']}, step {result['step']}): "
           'lens / probe accuracy of the entry\'s resolved value', '',
           '| level | slot | ' + ' | '.join(['embeddings'] + [f'after block {i + 1}'
                                              for i in range(depth)]) + ' |',
           '|---|---|' + '---|' * (depth + 1)]
  for r in result['rows']:
    cells = [f'{a:.2f} / {b:.2f}' for a, b in zip(r['lens'], r['probe'])]
    lines.append(f"| L{r['level']} | {r['slot']} | " + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax reports every read at INFO
  workdirs = [w for w in FLAGS.workdirs.split(',') if w]
  if not workdirs:
    raise app.UsageError('--workdirs: give at least one workdir of a pointer-chasing run')
  results = [analyse(w, FLAGS.examples, FLAGS.fit_examples) for w in workdirs]
  for r in results:
    print(table(r), end='\n\n')
  if FLAGS.out:
    command = ' '.join(['python', '-m', 'ctr_jax.projects.pointer_chasing.layers']
                       + [shlex.quote(a) for a in sys.argv[1:]])
    workdir_lib.write_json(FLAGS.out, {'command': command, 'results': results})


if __name__ == '__main__':
  app.run(main)
