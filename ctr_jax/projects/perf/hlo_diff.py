r"""Whether two commits compile the same programs: the training step and a decode call of the
peer-shape models (C = 512, 6 layers, T = 256, B = 8), after XLA's optimisations.

  python -m ctr_jax.projects.perf.hlo_diff --commits=9d0b22a,HEAD

A refactor that moves code without changing what it computes compiles to the same optimised HLO
(metadata such as source lines and op names aside), so it runs at the same speed on that
backend: a check that needs no quiet machine, unlike timing (`decode_bisect`). Each commit is
checked out in a temporary git worktree and compiled in a fresh process with its own code (the
bench configs' module found where that commit keeps it). Prints one row per program: the
fingerprint at each commit and whether they agree.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

from ctr_jax.projects import paths

ROOT = paths.REPO_ROOT

CHILD = r'''
import json, sys
import jax, jax.numpy as jnp
try:
  from ctr_jax.bench import configs as base
except ImportError:  # commits before the package layout
  from configs.bench import base
try:
  from ctr_jax.inference import decode
except ImportError:
  from ctr_jax import decode
from ctr_jax import models
from ctr_jax.bench import suite
out = {}
step, state, tokens, cfg, k = suite.train_step_and_state(base.peer_shape(), seq_len=256, batch=8,
                                                         k_unroll=0)
out['train step (peer shape, T = 256, B = 8)'] = step.lower(state, tokens).compile().as_text()
for fields, name in ((base.peer_shape(), 'generate, transformer'),
                     (base.peer_shape(kind='context_ready', depth=2, k_unroll=4),
                      'generate, context-ready D = 2')):
  model = models.build(suite.model_config(fields))
  variables = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  prompt = jnp.zeros((1, 16), jnp.int32)
  fn = jax.jit(lambda v, p: decode.generate(model, v, p, 8, jax.random.key(0)))
  out[name + ' (B = 1)'] = fn.lower(variables, prompt).compile().as_text()
json.dump(out, sys.stdout)
'''


def fingerprint(hlo: str) -> str:
  """A hash of the optimised HLO without what a move changes: metadata (op names carry function
  names, source files and lines) and the module's name."""
  text = re.sub(r', metadata=\{[^{}]*\}', '', hlo)
  text = re.sub(r'^HloModule \S+', 'HloModule', text, flags=re.M)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def compile_at(tree: str) -> dict[str, str]:
  out = subprocess.run([sys.executable, '-c', CHILD], cwd=tree,
                       env={**os.environ, 'PYTHONPATH': tree}, check=True, capture_output=True,
                       text=True)
  return {name: fingerprint(hlo) for name, hlo in json.loads(out.stdout).items()}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--commits', default='HEAD~1,HEAD')
  args = parser.parse_args(argv)
  commits = args.commits.split(',')
  prints = {}
  with tempfile.TemporaryDirectory() as scratch:
    for c in commits:
      tree = os.path.join(scratch, c.replace('/', '_').replace('~', '_'))
      subprocess.run(['git', 'worktree', 'add', '--detach', '-f', tree, c], cwd=ROOT, check=True,
                     capture_output=True)
      try:
        prints[c] = compile_at(tree)
      finally:
        subprocess.run(['git', 'worktree', 'remove', '--force', tree], cwd=ROOT,
                       capture_output=True)
  names = list(prints[commits[0]])
  print('| program | ' + ' | '.join(commits) + ' | same |\n|---|' + '---|' * (len(commits) + 1))
  for name in names:
    values = [prints[c].get(name, '-') for c in commits]
    print(f"| {name} | {' | '.join(values)} | {'yes' if len(set(values)) == 1 else 'NO'} |")


if __name__ == '__main__':
  main()
