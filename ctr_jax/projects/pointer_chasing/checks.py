"""Issue 19's one-at-a-time checks: what in our task, model or training differs from the author's?

  python -m ctr_jax.projects.pointer_chasing.checks                 # train what is missing, then report
  python -m ctr_jax.projects.pointer_chasing.checks --only=baseline,no_rope
  python -m ctr_jax.projects.pointer_chasing.checks --report_only   # re-read finished runs
  python -m ctr_jax.projects.pointer_chasing.checks --list          # every check's command

Each check is one `python -m ctr_jax.main --config=configs/pointer_chasing.py:...` run at H = 2
in its own workdir under --root (resumable, every launch in the workdir's invocations.jsonl),
with the author's recipe (reference 7.3: width 128, 4 heads, batch 64, Adam 1e-3 constant,
clipping 1.0, PyTorch initialisation) and exactly one difference from its reference row. The
report (docs/pointer_chasing_checks.json and the marked section of docs/pointer_chasing_checks.md)
gives each run's per-level accuracy on 1,024 fresh examples, the first evaluation at which each
level passed 90%, and a plateau profile (accuracy slot by slot) of the final model.

H = 2 because it is the smallest staircase with a level beyond the first: the 2-layer
transformer can represent L0-L1 of the 'tables' encoding (tests/test_pointer_representability.py)
and the 3-layer one every level of 'sections', so a failure to learn them is training, not
capacity.
"""

import dataclasses
import json
import os

from absl import app, flags

from ctr_jax.projects import paths
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce import trained as repro_trained
from ctr_jax.reporting import doc_sections, machine
from ctr_jax.tasks import pointer_chasing as task

ROOT = paths.REPO_ROOT

FLAGS = flags.FLAGS
flags.DEFINE_string('root', os.path.join(ROOT, 'workdirs', 'pointer_chasing', 'checks'),
                    'Workdirs root.')
flags.DEFINE_string('docs', os.path.join(ROOT, 'docs'), 'Where the report goes.')
flags.DEFINE_list('only', [], 'Train only these checks (names); the report reads every finished '
                  'run.')
flags.DEFINE_bool('report_only', False, 'Only aggregate finished runs.')
flags.DEFINE_bool('list', False, 'Print every check\'s command and exit.')
flags.DEFINE_integer('steps', 3000, 'Training steps of each check.')
flags.DEFINE_string('extra', '', 'Extra flags for every run (recorded in each command), e.g. '
                    '"--config.batch_size=8" in the tests.')

HOPS = 2
BEGIN, END = '<!-- checks:h2 (ctr_jax.projects.pointer_chasing.checks) -->', '<!-- /checks:h2 -->'
TITLE = '# Pointer chasing: one difference at a time'


@dataclasses.dataclass(frozen=True)
class Check:
  name: str         # workdir and --only name
  changed: str      # the one difference from `against`, in words
  arg: str          # configs/pointer_chasing.py arg, without hops and steps
  against: str = ''  # the check it differs from by exactly `changed`
  overrides: tuple = ()  # --config.x=v flags
  steps: int = 0    # 0: --steps


CHECKS = (
    Check('baseline', "the author's recipe on his notes encoding", 'model=t2,encoding=tables'),
    Check('no_rope', 'no position encoding (his no-RoPE option)',
          'model=t2,encoding=tables,positions=none', 'baseline'),
    Check('loss_over_all', 'loss divided by all positions, not by the target positions',
          'model=t2,encoding=tables,loss_over=all', 'baseline'),
    Check('warmup_cosine', 'linear warm-up (5%) and cosine decay to 10% instead of a constant rate',
          'model=t2,encoding=tables', 'baseline',
          ('--config.optim.warmup_steps=150', '--config.optim.min_lr_ratio=0.1')),
    # The author's code has a key curriculum with an unrecorded schedule (reference 7.2); this
    # one is ours: 2 keys per level for the first 500 steps, 4 until 1,000, then all 8.
    Check('key_curriculum', 'a key curriculum: 2 keys per level until step 500, 4 until 1,000',
          'model=t2,encoding=tables,key_curriculum=2:500/4:1000', 'baseline'),
    # Three layers can take the route without query-side composition (give the entry's target
    # token its value by a match of raw tokens, then copy it two positions on): docs, "What
    # this leaves".
    Check('t3_tables', 'a third layer', 'model=t3,encoding=tables', 'baseline'),
    # "Dense targets" read as every position of every entry: the target side and the '=' carry
    # the entry's resolved value as well as the key (our two helpers together).
    Check('t3_dense', "targets at all three positions of every entry (both helpers)",
          'model=t3,encoding=tables,entry_targets=1,equals_targets=1', 't3_tables'),
    Check('t2_dense', "targets at all three positions of every entry (both helpers)",
          'model=t2,encoding=tables,entry_targets=1,equals_targets=1', 'baseline'),
    Check('d1_bptt_dense', "targets at all three positions of every entry (both helpers)",
          'model=d1_bptt,encoding=tables,entry_targets=1,equals_targets=1', 'd1_bptt_tables',
          steps=1500),
    Check('t3_sections', "3 layers on the code encoding (query sections), no helper",
          'model=t3,encoding=sections'),
    Check('t3_multi_q', "his multi-Q helper sections (partial resolutions)",
          'model=t3,encoding=multi_q', 't3_sections'),
    # The author's D = 1 BPTT runs solved 3 hops by 1.5K steps and 5 hops by 1K (reference
    # 7.4), and a BPTT step costs several transformer steps here: 1,500 steps.
    Check('d1_bptt_tables', 'the D = 1 BPTT model on the notes encoding, no helper',
          'model=d1_bptt,encoding=tables', steps=1500),
    Check('d1_bptt_multi_q', 'the D = 1 BPTT model with his multi-Q helper sections',
          'model=d1_bptt,encoding=multi_q', steps=1500),
)
_BY_NAME = {c.name: c for c in CHECKS}


def workdir(check: Check, root: str) -> str:
  return os.path.join(root, f'h{HOPS}_{check.name}')


def command(check: Check, root: str, steps: int, extra: tuple = ()) -> list[str]:
  steps = check.steps or steps
  return ['python', '-m', 'ctr_jax.main',
          f'--config=configs/pointer_chasing.py:hops={HOPS},{check.arg},steps={steps}',
          '--config.eval_every=250', f'--workdir={repro_lib.shown(workdir(check, root))}',
          *check.overrides, *extra]


def train(check: Check, root: str, steps: int, extra: tuple = ()) -> None:
  summary = repro_lib.summary_of(workdir(check, root))
  if summary and summary.get('step') == (check.steps or steps):
    return
  code = repro_lib.execute_logged(command(check, root, steps, extra), workdir(check, root))
  if code:
    print(f'pointer_chasing_checks: {check.name} exited with {code}; continuing')


def _first_pass(rows: list[dict], level: str) -> int | None:
  """The first evaluation step at which `level` was above 90%."""
  for r in rows:
    if r.get(f'level_accuracy/{level}', 0) > 0.9:
      return r['step']
  return None


def record(check: Check, root: str) -> dict | None:
  """A finished check's row: final accuracies, per-level pass steps, and its plateau profile."""
  path = workdir(check, root)
  summary = repro_lib.summary_of(path)
  if not summary or 'level_accuracy' not in summary:
    return None
  config = repro_trained.load_config(path)
  encoding = config['data']['encoding']

  def profile():
    model, params, _ = repro_trained.load_trained(path)
    mode = 'sequential' if config['model']['kind'] == 'context_ready' else 'parallel'
    result = task.evaluate(task.model_predictor(model, params, mode=mode), HOPS,
                           num_examples=summary.get('eval_examples', 1024), encoding=encoding)
    return task.plateau_profile(result['position_accuracy'], HOPS, encoding)

  # The final model's profile, evaluated once per trained step count (a resume re-evaluates).
  profile_text = repro_trained.cached(os.path.join(path, f"plateau_profile_{summary['step']}.json"),
                                  profile)
  evals = [r for r in repro_lib.metrics_rows(path)
           if any(k.startswith('level_accuracy/') for k in r)]
  launches = repro_lib.invocations(path)
  return {'name': check.name, 'changed': check.changed, 'against': check.against,
          'model': config['model']['kind'], 'encoding': encoding, 'steps': summary['step'],
          'level_accuracy': summary['level_accuracy'],
          'final_query_accuracy': summary['final_query_accuracy'],
          'table_level_accuracy': summary.get('table_level_accuracy'),
          'levels_solved': summary['levels_solved'], 'train_loss': summary.get('train_loss'),
          'wall_time_seconds': summary.get('wall_time_seconds'),
          'first_pass_step': {l: _first_pass(evals, l) for l in summary['level_accuracy']},
          'profile': profile_text,
          'command': launches[-1]['command'] if launches else None, 'invocations': launches}


def report(records: list[dict], steps: int) -> str:
  lines = ['## One difference at a time (H = 2, generated)', '',
           f'`python -m ctr_jax.projects.pointer_chasing.checks` ({steps} steps each unless the steps column '
           'says otherwise; every row differs from the row named in "vs" by exactly the change '
           'described). Accuracy on 1,024 fresh '
           "examples; 'tables' levels are the table keys of L0, L1 and the final query (L2), "
           "'sections' / 'multi_q' levels the full-resolution query sections. \"passed at\": the "
           'first evaluation (every 250 steps, 256 examples) above 90%.', '',
           '| check | vs | change | encoding | L0 | L1 | L2 / final | solved | passed at (L0, L1, '
           'final) | steps | train loss | wall |', '|' + '---|' * 12]
  for r in records:
    acc = r['level_accuracy']
    levels = sorted(acc, key=lambda l: int(l[1:]))
    cells = [f'{acc[l]:.3f}' for l in levels[:2]]
    final = acc['L2'] if 'L2' in acc else r['final_query_accuracy']
    passed = ', '.join(str(r['first_pass_step'].get(l) or '–') for l in levels[:2])
    passed += ', ' + str(r['first_pass_step'].get('L2') or '–')
    wall = f"{r['wall_time_seconds'] / 60:.0f} min" if r['wall_time_seconds'] else '?'
    lines.append(f"| {r['name']} | {r['against'] or '–'} | {r['changed']} | {r['encoding']} | "
                 f"{' | '.join(cells)} | {final:.3f} | {r['levels_solved']}/{len(acc)} | {passed} | "
                 f"{r['steps']} | {r['train_loss']:.3f} | {wall} |")
  lines += ['', 'Plateau profiles (accuracy at each slot of each scored section, final model):', '']
  for r in records:
    lines += [f"**{r['name']}** (`{r['command']}`)", '', r['profile'], '']
  missing = [c.name for c in CHECKS if c.name not in {r['name'] for r in records}]
  if missing:
    lines += [f"Not run yet: {', '.join(missing)} (`python -m ctr_jax.projects.pointer_chasing.checks "
              f"--only={','.join(missing)}`).", '']
  return '\n'.join(lines)


def main(argv):
  del argv
  extra = tuple(FLAGS.extra.split())
  for name in FLAGS.only:
    if name not in _BY_NAME:
      raise app.UsageError(f'--only={name!r}: allowed {sorted(_BY_NAME)}')
  if FLAGS.list:
    for check in CHECKS:
      print(' '.join(command(check, FLAGS.root, FLAGS.steps, extra)))
    return
  if not FLAGS.report_only:
    for check in CHECKS:
      if not FLAGS.only or check.name in FLAGS.only:
        train(check, FLAGS.root, FLAGS.steps, extra)
  records = [r for r in (record(c, FLAGS.root) for c in CHECKS) if r]
  os.makedirs(FLAGS.docs, exist_ok=True)
  with open(os.path.join(FLAGS.docs, 'pointer_chasing_checks.json'), 'w') as f:
    json.dump({'machine': _machine(), 'runs': records}, f, indent=1)
  doc_sections.replace_between(os.path.join(FLAGS.docs, 'pointer_chasing_checks.md'), BEGIN, END,
                               report(records, FLAGS.steps), new_file=TITLE)
  print(report(records, FLAGS.steps))


def _machine() -> str:
  return machine.summary_line(machine.describe())


if __name__ == '__main__':
  app.run(main)
