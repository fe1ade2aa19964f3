"""Trains a study's runs `jobs` at a time (`--jobs`): on a CPU each run pinned to its share of the
cores, on a GPU all of them sharing it, each with its share of the GPU's memory.

Order and dependencies: runs start in the order given (seed by seed), and a run initialised
from another (`Run.init_from`) waits until that one has ended. With one job this is the plain
loop: each run's output on this process's, one after another. With more, each run's output goes
to `<root>/<study>/<run>.log` and a line says when each run ends.
"""

import concurrent.futures
import os

from ctr_jax.projects.reproduce import lib as repro_lib
from ctr_jax.projects.reproduce.lib import Run

# XLA's GPU client takes 75% of the memory at start unless told; N runs sharing one GPU must each
# take less than 1/N of it.
GPU_MEMORY_SHARE = 0.9


def cpu_shares(jobs: int, cpus=None) -> list[tuple[int, ...]]:
  """This process's CPUs in `jobs` contiguous shares (as even as can be), or `jobs` empty
  shares (no pinning) when there are fewer CPUs than jobs or the platform cannot pin."""
  if cpus is None:
    cpus = os.sched_getaffinity(0) if hasattr(os, 'sched_getaffinity') else ()
  cpus = sorted(cpus)
  if len(cpus) < jobs:
    return [()] * jobs
  size, extra = divmod(len(cpus), jobs)
  shares, at = [], 0
  for j in range(jobs):
    n = size + (j < extra)
    shares.append(tuple(cpus[at:at + n]))
    at += n
  return shares


def launch_options(slot: int, jobs: int, shares: list[tuple[int, ...]], run: Run,
                   root: str) -> dict:
  """What execute_logged needs to run `run` in `slot` of `jobs`: nothing for one job."""
  if jobs == 1:
    return {}
  env = {}
  if 'XLA_PYTHON_CLIENT_MEM_FRACTION' not in os.environ:
    env['XLA_PYTHON_CLIENT_MEM_FRACTION'] = f'{GPU_MEMORY_SHARE / jobs:.3f}'
  return {'cpus': shares[slot], 'log': run.workdir(root) + '.log', 'env': env}


def run_all(runs: list[Run], root: str, extra: tuple = (), jobs: int = 1) -> dict[str, int]:
  """Trains (or resumes, or skips when finished) every run, `jobs` at a time; returns each
  run's exit code by name. A failed run does not stop the others."""
  if jobs < 1:
    raise ValueError(f'jobs: got {jobs}, allowed >= 1')
  shares = cpu_shares(jobs)
  pending, active, codes = list(runs), {}, {}

  def next_ready() -> Run | None:
    """The first pending run whose source (if any) has ended, taken off `pending`; a finished
    run on the way is taken off too, with nothing to launch."""
    unended = {r.workdir(root) for r in pending} | {r.workdir(root) for r, _ in active.values()}
    for run in list(pending):
      if run.init_from is not None and run.init_from.workdir(root) in unended:
        continue
      pending.remove(run)
      if not repro_lib.finished(run, root):
        return run
      codes[run.name] = 0
      unended.discard(run.workdir(root))
    return None

  with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    while pending or active:
      for slot in (s for s in range(jobs) if s not in active):
        ready = next_ready()
        if ready is None:
          break
        options = launch_options(slot, jobs, shares, ready, root)
        active[slot] = (ready, pool.submit(repro_lib.execute, ready, root, extra, **options))
      if not active:
        if pending:  # every pending run waits on one that is neither pending nor running
          raise RuntimeError(f'reproduce: runs wait on runs that never start: {pending}')
        break
      done, _ = concurrent.futures.wait([f for _, f in active.values()],
                                        return_when=concurrent.futures.FIRST_COMPLETED)
      for slot, (run, future) in list(active.items()):
        if future in done:
          del active[slot]
          codes[run.name] = future.result()
          if codes[run.name]:
            print(f'reproduce: {run.name} exited with {codes[run.name]}; continuing with the '
                  'others', flush=True)
          elif jobs > 1:
            print(f'reproduce: {run.name} done', flush=True)
  return codes
