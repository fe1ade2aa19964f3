"""Every study of ctr_jax.projects.reproduce by name, and the driver that trains a study's runs and
writes its json and its section of docs/reproduction.md.
"""

import dataclasses
import os

from ctr_jax.projects.reproduce import evaluated as repro_evaluated
from ctr_jax.projects.reproduce import jobs as repro_jobs
from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce import studies as repro_studies
from ctr_jax.projects.reproduce import table1 as repro_table1
from ctr_jax.projects.reproduce import trained as repro_trained
from ctr_jax.projects.reproduce.studies import SCALES, Scale
from ctr_jax.reporting import machine


@dataclasses.dataclass(frozen=True)
class Study:
  title: str
  claims: str
  runs: object     # (scale, seeds) -> list[Run]
  report: object   # (records, scale, figure path or '') -> (markdown lines, verdict lines)
  figure: bool = False
  evaluate: object = None  # (record, run, root, scale) -> dict, cached in the run's workdir


STUDIES = {
    'table1': Study('Table 1 at CPU scale: CRT vs FLOP-matched transformers', 'claims 1, 9, 10',
                    repro_table1.table1_runs, repro_table1.table1_report, figure=True),
    'k_min': Study('Random depth (k_min) against fixed K', 'claim 7', repro_studies.k_min_runs,
                   repro_studies.k_min_report),
    'ablations': Study('Correction ablations (reference section 8)', 'section 8',
                       repro_studies.ablation_runs, repro_studies.ablation_report),
    'width': Study('Width scaling and context length', 'claims 8, 11', repro_studies.width_runs,
                   repro_studies.width_report),
    'seq_vs_parallel': Study('Exact scan against the parallel unroll on trained weights',
                             'claims 4, 16, 17', repro_evaluated.seq_vs_parallel_runs,
                             repro_evaluated.seq_vs_parallel_report,
                             evaluate=repro_evaluated.seq_vs_parallel_eval),
    'k_eval': Study('A K = 5-trained model evaluated at other K', 'claim 18',
                    repro_evaluated.k_eval_runs, repro_evaluated.k_eval_report, figure=True,
                    evaluate=repro_evaluated.k_eval_eval),
    'conversion': Study('Converting a trained transformer (zero-initialised correction)',
                        'claims 6, 15', repro_evaluated.conversion_runs,
                        repro_evaluated.conversion_report, evaluate=repro_evaluated.conversion_eval),
    'grad_iterations': Study('Backpropagating through the last m of K iterations (beyond the '
                             'paper)', 'training cost', repro_studies.grad_iterations_runs,
                             repro_studies.grad_iterations_report),
}


def run_study(name: str, scale: Scale, seeds: int, root: str, docs: str, extra=(),
              train: bool = True, only: tuple = (), jobs: int = 1) -> str:
  """Trains the study's missing runs (unless `train` is False), then writes its json and its
  section of docs/reproduction.md; returns the section.

  Training goes seed by seed (every group's seed 0 first), so a study stopped early still has
  one run of each group to compare. `only`: train just the groups whose name contains one of
  these strings (the report still reads every finished run). `jobs`: runs trained at once
  (repro_jobs.run_all)."""
  study = STUDIES[name]
  # Workdirs do not outlive a session, the json does: a run without a finished workdir whose
  # record there is the same run (repro_lib.committed_record) is finished, kept, not retrained.
  committed = repro_lib.committed_records(name, docs)
  # `seeds` says what to train; the report keeps every seed the json already has.
  to_train = {run.name for run in study.runs(scale, seeds)}
  seeds = max([seeds] + [r['seed'] + 1 for r in committed.values()
                         if isinstance(r.get('seed'), int)])
  runs = study.runs(scale, seeds)
  kept = {}
  for run in runs:
    if not repro_lib.finished(run, root):
      record = repro_lib.committed_record(run, root, extra, committed)
      if record is not None and (study.evaluate is None or 'post' in record):
        kept[run.name] = {**record, 'rerun': ' '.join(run.command(root))}
  if train:
    chosen = [r for r in runs if selected(r.group, only)
              and r.name in to_train and r.name not in kept]
    # Seed by seed (stable: a run stays after the one it is initialised from).
    repro_jobs.run_all(sorted(chosen, key=lambda r: r.seed), root, extra, jobs)
  if kept:
    print(f'reproduce: {len(kept)} run(s) finished in docs/reproduction/{name}.json without a '
          f'finished workdir, kept and not retrained: {", ".join(sorted(kept))}')
  records = []
  for run in runs:
    record = repro_lib.collect(run, root)
    if record is None:
      if run.name in kept:
        records.append(kept[run.name])
      continue
    if study.evaluate is not None:
      record['post'] = repro_trained.cached(os.path.join(run.workdir(root), f'post_{name}.json'),
                                        lambda: study.evaluate(record, run, root, scale))
    records.append(record)
  figure = os.path.join(docs, 'reproduction', f'{name}.png') if study.figure and records else ''
  if figure:
    os.makedirs(os.path.dirname(figure), exist_ok=True)
  lines, verdicts = study.report(records, scale, figure)
  scale_text = (f'V = {scale.vocab}, T = {scale.seq_len}, batch {scale.batch}, '
                f'{scale.steps} steps unless stated; {len(records)}/{len(runs)} runs finished.')
  machines = {}
  for record in records:
    machine = repro_lib.run_machine(record) or 'not recorded'
    machines[machine] = machines.get(machine, 0) + 1
  machine_text = ('Machines (each run\'s ledger, or the json\'s machine field for runs recorded '
                  'before the ledger named it): ' + '; '.join(
                      f'{m} ({n} run{"s" if n > 1 else ""})' for m, n in machines.items()) + '.'
                  if machines else '')
  body = [f'## {name}: {study.title} ({study.claims})', '',
          f'`python -m ctr_jax.projects.reproduce --study={name} --seeds={seeds}`'
          + ('' if scale is SCALES['cpu'] else f' (scale {next(k for k, v in SCALES.items() if v is scale)})')
          + f'. Scale: {scale_text}' + (f' {machine_text}' if machine_text else ''), '', *lines, '',
          '**Verdict:** ' + ('; '.join(verdicts) if verdicts else 'no finished comparison yet.')]
  driver = f'python -m ctr_jax.projects.reproduce --study={name} --seeds={seeds}'
  repro_lib.write_results(name, records, docs, {'machine': _machine(), 'rerun': driver})
  repro_lib.replace_section(name, '\n'.join(body), docs)
  return '\n'.join(body)


def run_states(name: str, scale: Scale, seeds: int, root: str, docs: str, extra: tuple = (),
               only: tuple = ()) -> list[tuple[repro_lib.Run, str]]:
  """Where each run of the study (`seeds` seeds, the groups `only` picks) stands, as run_study
  would see it: 'finished', 'finished (kept from the json)' (a committed record of the same
  run, repro_lib.committed_record), 'at step S of N' (its latest checkpoint; the next launch
  resumes there), 'started' (a workdir, no checkpoint yet) or 'not started'."""
  committed = repro_lib.committed_records(name, docs)
  states = []
  for run in STUDIES[name].runs(scale, seeds):
    if not selected(run.group, only):
      continue
    workdir = run.workdir(root)
    if repro_lib.finished(run, root):
      state = 'finished'
    elif repro_lib.committed_record(run, root, extra, committed) is not None:
      state = 'finished (kept from the json)'
    elif (step := repro_lib.latest_checkpoint(workdir)) is not None:
      total = (repro_trained.load_config(workdir) or {}).get('total_steps', '?')
      state = f'at step {step} of {total}'
    else:
      state = 'started' if os.path.isdir(workdir) else 'not started'
    states.append((run, state))
  return states


def selected(group: str, only: tuple) -> bool:
  """Whether `--only` picks `group`: every group when empty, else a group containing one of the
  strings, or named exactly by one ending in '$' ('~4M D=1 C=408$' leaves out '... m=2')."""
  return not only or any(group == o[:-1] if o.endswith('$') else o in group for o in only)


def _machine() -> str:
  return machine.summary_line(machine.describe())
