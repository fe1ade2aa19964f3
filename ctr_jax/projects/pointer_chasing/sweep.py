"""Runs the pointer-chasing staircase and writes docs/pointer_chasing.{md,json,png}.

  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --steps=5000
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=10 --steps=5000 --models=t1,t5,t9,t11,d1_bptt
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --entry_targets --models=d1_bptt  # helpers
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --equals_targets --models=t3,t4,d1_bptt
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --models=d1_bptt --seeds=3
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=5 --models=d1_bptt --first_seed=2 --seeds=1  # seed 2
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --stop_accuracy=0.99  # stop runs once solved
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --report_only   # re-read finished runs
  bash launch/pointer_chasing_h10.sh   # H = 10 on one GPU within a time budget (--time_budget_s)
  # Beyond the 5,000 steps: continue copies of finished runs to 10,000, in a report of their own.
  python -m ctr_jax.projects.pointer_chasing.sweep --hops=3 --encoding=tables --models=d1_bptt \
      --first_seed=1 --seeds=1 --steps=10000 --stop_accuracy=0.99 \
      --continue_from=workdirs/pointer_chasing \
      --root=workdirs/pointer_chasing_10k --docs=docs/pointer_chasing_10k

Each model is one `python -m ctr_jax.main --config=configs/pointer_chasing.py:...` run in its own
workdir under --root, so an interrupted sweep resumes where it stopped; every launch is appended
to the workdir's `invocations.jsonl`, and each row of docs/pointer_chasing.json carries its last
command and every launch (resumes with the step they resumed from). Results for other hop
counts already in docs/pointer_chasing.json are kept; in docs/pointer_chasing.md only the block
between BEGIN and END is rewritten (the verdict above it and the notes below are hand-written).
"""

import json
import os
import re
import shutil

from absl import app, flags
import matplotlib
from matplotlib.lines import Line2D
import matplotlib.pyplot as plt

from ctr_jax.data import pointer_chasing
from ctr_jax.projects import paths
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.reporting import doc_sections
from ctr_jax.reporting import machine as machine_info

ROOT = paths.REPO_ROOT

FLAGS = flags.FLAGS
flags.DEFINE_integer('hops', 3, 'Table levels H.')
flags.DEFINE_integer('steps', 5000, 'Training steps per model.')
flags.DEFINE_string('models', '', "Comma-separated names ('t2,d1_bptt'); default: the sweep.")
flags.DEFINE_string('root', os.path.join(ROOT, 'workdirs', 'pointer_chasing'), 'Workdirs root.')
flags.DEFINE_string('docs', os.path.join(ROOT, 'docs'), 'Where the report goes.')
flags.DEFINE_bool('report_only', False, 'Only aggregate finished runs.')
flags.DEFINE_string('extra', '', 'Extra flags for every run, e.g. "--config.batch_size=32" '
                    '(recorded in each command).')
flags.DEFINE_enum('encoding', pointer_chasing.ENCODINGS[0], list(pointer_chasing.ENCODINGS),
                  'The task encoding (configs/pointer_chasing.py arg encoding; rows of a '
                  "non-default encoding get their own table in the report and their own workdirs).")
flags.DEFINE_integer('seeds', 1, 'Seeds per model (0, 1, ...); seed 0 keeps the plain workdir.')
flags.DEFINE_integer('first_seed', 0, 'The first seed of --seeds (e.g. --first_seed=2 --seeds=1 '
                     'runs seed 2 only, so two sweeps can share the seeds of one model).')
flags.DEFINE_float('time_budget_s', 0, 'If > 0: measure each model\'s step time with a short '
                   'probe run, then train every model for the same number of steps, at most '
                   '--steps, so that the sweep trains within this many seconds (a warning says '
                   'when --steps is cut). 0: train --steps.')
flags.DEFINE_integer('probe_steps', 20, 'Steps of each --time_budget_s probe run.')
flags.DEFINE_bool('entry_targets', False, 'Train with the helper targets on index-table entries '
                  '(configs/pointer_chasing.py arg entry_targets=1); evaluation is unchanged.')
flags.DEFINE_float('stop_accuracy', 0.0, 'If > 0: each run stops at the first periodic '
                   'evaluation where every level and the final query reach this accuracy '
                   '(configs/pointer_chasing.py arg stop_accuracy; the same workdir, so a run '
                   'may resume with or without it). 0: every run trains --steps.')
flags.DEFINE_string('hop_curriculum', '', 'If set, e.g. "1:500/2:1500": train on examples with '
                    'fewer table levels first (configs/pointer_chasing.py arg hop_curriculum, our '
                    'schedule); such runs get their own workdirs and rows.')
flags.DEFINE_string('continue_from', '', 'A root of shorter runs (e.g. workdirs/pointer_chasing): '
                    'a model whose workdir under --root does not exist yet starts as a copy of '
                    'its workdir there (checkpoints, data iterator, metrics, ledger) and resumes '
                    'to --steps (constant learning rate: the same as one longer run). The copy '
                    'is a line of the ledger. Use another --root and --docs than the source\'s.')
flags.DEFINE_bool('equals_targets', False, "Train with the helper targets on every entry's '=' "
                  '(configs/pointer_chasing.py arg equals_targets=1); evaluation is unchanged.')

# Short helper names ('entry', 'equals'): name and workdir suffixes; run records hold the
# switches themselves (f'{helper}_targets').
HELPERS = tuple(h.removesuffix('_targets') for h in pointer_chasing.HELPER_TARGETS)

DEFAULT_ENCODING = pointer_chasing.ENCODINGS[0]
# The sweep writes its tables between these markers; the verdict above and the notes below are
# hand-written and kept.
BEGIN = '<!-- BEGIN generated: pointer_chasing/sweep (ctr_jax.projects.pointer_chasing.sweep) -->'
END = '<!-- END generated: pointer_chasing/sweep -->'
TITLE = '# Pointer chasing: the depth staircase'


def machine() -> str:
  return machine_info.summary_line(machine_info.describe())


def sweep_models(hops: int) -> list[str]:
  names = []
  configs = paths.load_config_module('configs/pointer_chasing.py')
  configs.sweep(lambda arg: names.append(re.search(r'model=(\w+)', arg)[1]), hops)
  return names


def helpers(r: dict) -> tuple[str, ...]:
  """The helper targets a run record was trained with, e.g. ('entry',)."""
  return tuple(h for h in HELPERS if r.get(f'{h}_targets', False))


def workdir_for(name: str, hops: int, root: str, used: tuple[str, ...] = (), seed: int = 0,
                encoding: str = DEFAULT_ENCODING, hop_curriculum: str = '') -> str:
  suffix = (''.join(f'_{h}' for h in used) + (f'_s{seed}' if seed else '')
            + ('' if encoding == DEFAULT_ENCODING else f'_{encoding}')
            + (f"_hops{hop_curriculum.replace(':', '-').replace('/', '_')}"
               if hop_curriculum else ''))
  return os.path.join(root, f'h{hops}_{name}{suffix}')


def command_for(name: str, hops: int, steps: int, workdir: str, used: tuple[str, ...] = (),
                seed: int = 0, extra: tuple[str, ...] = (),
                encoding: str = DEFAULT_ENCODING, stop_accuracy: float = 0.0,
                hop_curriculum: str = '') -> list[str]:
  arg = (f'hops={hops},model={name},steps={steps}' + ''.join(f',{h}_targets=1' for h in used)
         + (f',seed={seed}' if seed else '')
         + ('' if encoding == DEFAULT_ENCODING else f',encoding={encoding}')
         + (f',hop_curriculum={hop_curriculum}' if hop_curriculum else '')
         + (f',stop_accuracy={stop_accuracy:g}' if stop_accuracy > 0 else ''))
  return ['python', '-m', 'ctr_jax.main', f'--config=configs/pointer_chasing.py:{arg}',
          f'--workdir={repro_lib.shown(workdir)}', *extra]


def finished(summary: dict, steps: int) -> bool:
  """A run's summary.json reports `steps`, or that it stopped early with the task solved."""
  return summary.get('step') == steps or 'stopped_early_at_step' in summary


def run(name: str, hops: int, steps: int, root: str, used: tuple[str, ...] = (), seed: int = 0,
        extra: tuple[str, ...] = (), train: bool = True,
        encoding: str = DEFAULT_ENCODING, stop_accuracy: float = 0.0,
        hop_curriculum: str = '', continue_from: str = '') -> dict | None:
  """Trains (or resumes) one model unless its summary says it finished; its record."""
  workdir = workdir_for(name, hops, root, used, seed, encoding, hop_curriculum)
  summary_path = os.path.join(workdir, 'summary.json')
  if train:
    if continue_from and not os.path.exists(workdir):
      copy_run(workdir_for(name, hops, continue_from, used, seed, encoding, hop_curriculum),
               workdir)
    done = False
    if os.path.exists(summary_path):
      with open(summary_path) as f:
        done = finished(json.load(f), steps)
    if not done:
      repro_lib.execute_logged(
          command_for(name, hops, steps, workdir, used, seed, extra, encoding, stop_accuracy,
                      hop_curriculum),
          workdir)
  if not os.path.exists(summary_path):
    return None
  with open(summary_path) as f:
    s = json.load(f)
  launches = repro_lib.invocations(workdir)
  depth = int(re.search(r'\d+', name)[0])
  return {'model': name, 'hops': hops, **{f'{h}_targets': h in used for h in HELPERS},
          'seed': seed, 'encoding': encoding, 'steps': s['step'], 'depth': depth,
          **({'hop_curriculum': hop_curriculum} if hop_curriculum else {}),
          'stopped_early_at_step': s.get('stopped_early_at_step'),
          'kind': 'transformer' if name.startswith('t') else 'context_ready',
          'level_accuracy': s['level_accuracy'], 'final_query_accuracy': s['final_query_accuracy'],
          'table_key_accuracy': s['table_key_accuracy'], 'levels_solved': s['levels_solved'],
          'train_loss': s.get('train_loss'), 'wall_time_seconds': s.get('wall_time_seconds'),
          'eval_examples': s.get('eval_examples'),
          # The last launch; a resume is listed in `invocations` with the step it resumed from.
          'command': launches[-1]['command'] if launches else None,
          'invocations': launches,
          # Ledgers before 2026-12-02 did not record the machine: those rows have none.
          'machines': sorted({l['machine'] for l in launches if l.get('machine')})}


def copy_run(source: str, workdir: str) -> None:
  """Starts `workdir` as a copy of the run in `source` (without its lock), the copy recorded as
  a ledger line; written under a temporary name first, so no half copy is ever a workdir."""
  step = repro_lib.latest_checkpoint(source)
  if step is None:
    raise app.UsageError(f'--continue_from: {repro_lib.shown(source)!r} holds no checkpoint of '
                         'this model (allowed: a root whose runs of these models have trained)')
  partial = workdir + '.copying'
  shutil.rmtree(partial, ignore_errors=True)
  shutil.copytree(source, partial, ignore=shutil.ignore_patterns('.ctr_jax.lock'))
  entry = {'command': f'cp -r {repro_lib.shown(source)} {repro_lib.shown(workdir)}',
           'resumed_from_step': None, 'copied_at_step': step, 'exit_code': 0, 'seconds': 0.0,
           'machine': repro_lib.host()}
  with open(os.path.join(partial, 'invocations.jsonl'), 'a') as f:
    f.write(json.dumps(entry) + '\n')
  os.rename(partial, workdir)


def check_continue_from(continue_from: str, root: str) -> None:
  """Config-time check: continuing in place would overwrite the shorter runs it starts from."""
  if continue_from and os.path.abspath(continue_from) == os.path.abspath(root):
    raise app.UsageError(f'--continue_from: {continue_from!r} is --root itself; allowed: the '
                         'root of the shorter runs, with another --root (and --docs)')


def probe_step_seconds(name: str, hops: int, root: str, probe_steps: int,
                       extra: tuple[str, ...] = (), encoding: str = DEFAULT_ENCODING) -> float:
  """Seconds per training step of one model, from a short run of the trainer itself (the rate
  logged over the second half of the probe, after compilation)."""
  workdir = os.path.join(root, 'probes', f'h{hops}_{name}')
  half = max(1, probe_steps // 2)
  command = command_for(name, hops, probe_steps, workdir, extra=(
      *extra, f'--config.log_every={half}', f'--config.eval_every={10 * probe_steps}',
      f'--config.checkpoint_every={10 * probe_steps}'), encoding=encoding)
  if os.path.isdir(workdir):
    shutil.rmtree(workdir)  # a probe is timed from scratch, never resumed
  if repro_lib.execute_logged(command, workdir):
    raise RuntimeError(f'the step-time probe of {name} failed: {" ".join(command)}')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f if 'tokens_per_second' in line]
  with open(os.path.join(workdir, 'config.json')) as f:
    config = json.load(f)
  tokens_per_step = config['batch_size'] * config['data']['seq_len']
  return tokens_per_step / rows[-1]['tokens_per_second']


def steps_within(budget_s: float, step_seconds: dict[str, float], steps: int) -> int:
  """The step count every model gets so that the whole sweep trains within `budget_s`
  (training only: start-up and compilation come on top), at most `steps`."""
  fitting = int(budget_s / sum(step_seconds.values()))
  return max(1, min(steps, fitting))


def _key(r):
  return (r['model'], r['hops'], helpers(r), r.get('seed', 0), r.get('encoding', DEFAULT_ENCODING),
          r.get('hop_curriculum', ''))


def _encoding(r) -> str:
  return r.get('encoding') or DEFAULT_ENCODING


def _name(r):
  """The row's model and helpers (its encoding is its table's title), with a non-zero seed."""
  seed = f" (seed {r['seed']})" if r.get('seed') else ''
  seed += f" + hop curriculum {r['hop_curriculum']}" if r.get('hop_curriculum') else ''
  used = helpers(r)
  if set(used) == set(HELPERS):  # both: every entry position, our reading of "dense targets"
    return f"{r['model']} + dense (entry + equals){seed}"
  return ' + '.join((r['model'],) + used) + seed


def short_machine(text: str) -> str:
  """'Intel(R) Xeon(R) Processor, 2 logical cores' -> 'Intel Xeon, 2 cores', and a GPU after
  them ('..., 16 logical cores, 1 x NVIDIA H200' -> '1 x NVIDIA H200 (AMD EPYC, 16 cores)'):
  a table cell."""
  cpu, _, rest = text.partition(', ')
  cores, _, gpus = rest.partition(', ')
  words = [w for w in re.sub(r'\(R\)|\(TM\)|CPU|Processor|@.*', '', cpu).split() if w]
  host = ' '.join(words[:3]) + (f", {cores.split()[0]} cores" if cores else '')
  return f'{gpus} ({host})' if gpus else host


def write_report(runs: list[dict], docs: str, machine_text: str) -> None:
  runs = sorted(runs, key=lambda r: (r['hops'], helpers(r), r['kind'] != 'transformer',
                                     r['depth'], r['model']))
  with open(os.path.join(docs, 'pointer_chasing.json'), 'w') as f:
    json.dump(runs, f, indent=2)
  lines = ['## The staircase, run by run', '',
           'Generated by `ctr_jax.projects.pointer_chasing.sweep` (see its docstring for the commands);',
           'accuracy on the query section of each level (L0 needs one base lookup, Lk needs k',
           'index lookups more), on the final query and on table keys, measured on 1,024 fresh',
           'examples (chance 1/16). A level counts as solved above 90%. CRT models are evaluated',
           'with the exact sequential scan. Rows marked "+ entry" were trained with the helper',
           'targets on index-table entries (`entry_targets=1`), rows marked "+ equals" with those',
           "on every entry's '=' (`equals_targets=1`), rows marked \"+ dense (entry + equals)\"",
           "with both: targets on every position of every entry, our reading of the author's",
           '"dense targets" (see the notes below); their evaluation is the same.',
           'Steps marked "(solved, stopped)": the run had `stop_accuracy` set and stopped at the',
           'first periodic evaluation (256 examples) with every level and the final query at or',
           'above it; the columns are its final evaluation at that step.', '',
           'The machine column is what each run trained on (the CPU, and the GPU where there was',
           'one), from its launches\' ledger ("not recorded": a run from before 2026-12-02, when',
           'the ledger did not record it).',
           '', f'This report was written on: {machine_text}', '']
  for hops, encoding in sorted({(r['hops'], _encoding(r)) for r in runs},
                              key=lambda k: (k[0], k[1] != DEFAULT_ENCODING, k[1])):
    rows = [r for r in runs if r['hops'] == hops and _encoding(r) == encoding]
    # 'tables' rows have one level more (L<H>, the final query) than 'sections' rows.
    levels = sorted({l for r in rows for l in r['level_accuracy']}, key=lambda l: int(l[1:]))
    title = f'## H = {hops}'
    if encoding == 'tables':
      title += (", the author's notes encoding (`encoding=tables`)\n\nNo query sections: "
                f'L0..L{hops - 1} are the table keys of each level and L{hops} the final query '
                f'(the "final query" column repeats it), {hops + 1} levels.')
    elif encoding != DEFAULT_ENCODING:
      title += f' (`encoding={encoding}`)'
    lines += [title, '',
              '| model | ' + ' | '.join(levels) + ' | final query | table keys | solved | steps '
              '| train loss | wall time | machine |',
              '|' + '---|' * (len(levels) + 8)]
    for r in rows:
      acc = ' | '.join(f"{r['level_accuracy'][l]:.3f}" if l in r['level_accuracy'] else '–'
                       for l in levels)
      wall = f"{r['wall_time_seconds'] / 60:.1f} min" if r['wall_time_seconds'] else '?'
      name = _name(r)
      loss = f"{r['train_loss']:.3f}" if r.get('train_loss') is not None else '?'
      machines = ' + '.join(map(short_machine, r.get('machines') or ())) or 'not recorded'
      lines.append(f"| {name} | {acc} | {r['final_query_accuracy']:.3f} | "
                   f"{r['table_key_accuracy']:.3f} | {r['levels_solved']}/{len(r['level_accuracy'])} "
                   f"| {r['steps']}{' (solved, stopped)' if r.get('stopped_early_at_step') else ''}"
                   f" | {loss} | {wall} | {machines} |")
    lines.append('')
  lines += ['![staircase](pointer_chasing.png)']
  doc_sections.replace_between(os.path.join(docs, 'pointer_chasing.md'), BEGIN, END,
                               '\n'.join(lines), new_file=TITLE)
  _plot(runs, os.path.join(docs, 'pointer_chasing.png'))


def _group_label(used: tuple[str, ...], encoding: str) -> str:
  """'tables, entry + equals targets': a legend entry for one encoding and helper set."""
  return f"{encoding}, " + (' + '.join(used) + ' targets' if used else 'no helpers')


def _plot(runs, path):
  """One panel per H: levels solved against depth, one colour per encoding and helper set
  (transformers a line over N, context-ready models a star per seed), one legend below the
  panels."""
  matplotlib.use('Agg')
  groups = sorted({(helpers(r), _encoding(r)) for r in runs})
  color = {g: f'C{i % 10}' for i, g in enumerate(groups)}
  hops_list = sorted({r['hops'] for r in runs})
  fig, axes = plt.subplots(1, len(hops_list), figsize=(1.5 + 3 * len(hops_list), 4.2),
                           squeeze=False)
  for ax, hops in zip(axes[0], hops_list):
    here = [r for r in runs if r['hops'] == hops]
    for i, g in enumerate(groups):
      mine = [r for r in here if (helpers(r), _encoding(r)) == g]
      shift = 0.08 * (i - (len(groups) - 1) / 2)  # keep the groups' markers apart
      ts = sorted((r['depth'] + shift, r['levels_solved']) for r in mine
                  if r['kind'] == 'transformer' and not r.get('seed')
                  and not r.get('hop_curriculum'))
      if ts:
        ax.plot(*zip(*ts), 'o-', color=color[g], markersize=4)
      crt = [r for r in mine if r['kind'] == 'context_ready']
      if crt:
        ax.scatter([r['depth'] + shift for r in crt], [r['levels_solved'] for r in crt],
                   marker='*', s=140, color=color[g], edgecolors='black', linewidths=0.4,
                   zorder=3)
    top = max(len(r['level_accuracy']) for r in here)  # H, or H + 1 levels for 'tables'
    ax.axhline(top, color='gray', linestyle=':', linewidth=1)
    ax.set_ylim(-0.3, top + 0.5)
    ax.set_xlim(0.5, max(2, max(r['depth'] for r in here)) + 0.5)
    ax.set_title(f'H = {hops} ({top} levels at most)', fontsize=9)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set_xlabel('layers (N, or D for the context-ready model)', fontsize=8)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel('levels solved (> 90%)')
  handles = [Line2D([], [], color='gray', marker='o', markersize=4, label='transformer, N layers'),
             Line2D([], [], color='gray', marker='*', markersize=11, linestyle='',
                    label='context-ready model, one star per seed')]
  handles += [Line2D([], [], color=color[g], linewidth=6, label=_group_label(*g)) for g in groups]
  rows = -(-len(handles) // 2)
  fig.legend(handles=handles, loc='lower center', ncol=2, fontsize=7, frameon=False)
  fig.tight_layout(rect=(0, 0.045 * rows + 0.02, 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv):
  del argv
  names = FLAGS.models.split(',') if FLAGS.models else sweep_models(FLAGS.hops)
  used = tuple(h for h in HELPERS if FLAGS[f'{h}_targets'].value)
  extra = tuple(FLAGS.extra.split())
  check_continue_from(FLAGS.continue_from, FLAGS.root)
  steps = FLAGS.steps
  if FLAGS.time_budget_s > 0 and not FLAGS.report_only:
    seconds = {n: probe_step_seconds(n, FLAGS.hops, FLAGS.root, FLAGS.probe_steps, extra,
                                     FLAGS.encoding)
               for n in names}
    steps = steps_within(FLAGS.time_budget_s, seconds, FLAGS.steps)
    print('step times: ' + ', '.join(f'{n} {1e3 * t:.1f} ms' for n, t in seconds.items()))
    if steps < FLAGS.steps:
      print(f'WARNING: --steps={FLAGS.steps} does not fit --time_budget_s='
            f'{FLAGS.time_budget_s:g}; every model trains {steps} steps instead', flush=True)
  results = [r for r in (run(n, FLAGS.hops, steps, FLAGS.root, used, seed, extra,
                             train=not FLAGS.report_only, encoding=FLAGS.encoding,
                             stop_accuracy=FLAGS.stop_accuracy,
                             hop_curriculum=FLAGS.hop_curriculum,
                             continue_from=FLAGS.continue_from)
                         for seed in range(FLAGS.first_seed, FLAGS.first_seed + FLAGS.seeds)
                         for n in names) if r]
  report = os.path.join(FLAGS.docs, 'pointer_chasing.json')
  previous = []
  if os.path.exists(report):
    with open(report) as f:
      previous = json.load(f)
  keep = [r for r in previous if _key(r) not in {_key(x) for x in results}]
  os.makedirs(FLAGS.docs, exist_ok=True)
  write_report(keep + results, FLAGS.docs, machine())
  print(f'wrote {FLAGS.docs}/pointer_chasing.md ({len(keep + results)} runs)')


if __name__ == '__main__':
  app.run(main)
