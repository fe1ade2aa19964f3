"""Where a project finds the repository: configs/ to run, docs/ to write, workdirs/ to train in.

Projects run from a checkout (`pip install -e .`), so the repository is two levels above this
package.
"""

import importlib.util
import os
import types

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config_module(path: str, name: str = 'config_module') -> types.ModuleType:
  """The module of a config file (e.g. 'configs/pointer_chasing.py', relative to the repository).

  Config files import only ctr_jax, so they load from any working directory.
  """
  full = path if os.path.isabs(path) else os.path.join(REPO_ROOT, path)
  spec = importlib.util.spec_from_file_location(name, full)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
