"""Prints one command per run of a sweep declared in a config file (e.g. configs/paper_sweeps.py).

  python -m ctr_jax.projects.print_sweep configs/paper_sweeps.py table1 --workdir_root=/shared/work
"""

import argparse

from ctr_jax.projects import paths

ROOT = paths.REPO_ROOT



def sweep_commands(config_file: str, sweep: str, workdir_root: str) -> list[str]:
  module = paths.load_config_module(config_file, 'sweep_config')
  if sweep not in module.SWEEPS:
    raise SystemExit(f'unknown sweep {sweep!r}; available: {sorted(module.SWEEPS)}')
  commands = []

  def add(config, arg=None, **overrides):
    name = config[:-3] + (f'_{arg}' if arg else '') + ''.join(
        f'_{k.split(".")[-1]}{v}' for k, v in overrides.items())
    flags = ' '.join(f'--config.{k}={v}' for k, v in overrides.items())
    target = f'configs/{config}' + (f':{arg}' if arg else '')
    commands.append(f'python -m ctr_jax.main --config={target} '
                    f'--workdir={workdir_root}/{sweep}/{name} {flags}'.rstrip())
  module.SWEEPS[sweep](add)
  return commands


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('config_file')
  parser.add_argument('sweep')
  parser.add_argument('--workdir_root', default='workdirs')
  args = parser.parse_args()
  print('\n'.join(sweep_commands(args.config_file, args.sweep, args.workdir_root)))


if __name__ == '__main__':
  main()
