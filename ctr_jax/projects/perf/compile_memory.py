"""What each paper config's train step needs per GPU, before any run: `--config.job=compile`'s
measurement (`ctr_jax.training.aot`) for every paper config, remat and compute dtype, at the
paper's batch on one device. Writes docs/compile_memory.json and its section of docs/usage.md.

  python -m ctr_jax.projects.perf.compile_memory                        # everything (about an hour on 2 cores)
  python -m ctr_jax.projects.perf.compile_memory --configs=d5_c1120 --dtypes=float32
  python -m ctr_jax.projects.perf.compile_memory --doc_only             # the section from the json

Each config compiles in a child process with one fake CPU device
(XLA_FLAGS=--xla_force_host_platform_device_count=1), with `config.precision` float32 and
bfloat16 (what 'auto' computes in on a GPU; float32 parameters and optimiser state either way);
rows of configs and dtypes not asked for are kept.

A config fits a GPU of G GiB when its peak bytes (argument + output - alias + temp) are at most
`MEMORY_FRACTION` of G: JAX preallocates that share of a GPU's memory for its arrays by default
(XLA_PYTHON_CLIENT_MEM_FRACTION), which also leaves room for what an XLA:CPU estimate misses (a
GPU's compiler fuses and schedules differently). The remat chosen for a config is the one with
the fewest FLOPs per step (recomputation counts) among those that fit; `config_lib.PAPER_REMAT`
holds the choice for one 80 GB GPU in float32, which also fits in bfloat16 (the test checks).
"""

import datetime
import glob
import json
import os
import subprocess
import sys

from absl import app, flags
import jax

from ctr_jax import config_lib, models
from ctr_jax.ops import recurrence
from ctr_jax.projects import paths
from ctr_jax.reporting import doc_sections, machine
from ctr_jax.training import aot, sharding

JSON = os.path.join(paths.REPO_ROOT, 'docs', 'compile_memory.json')
DOC = os.path.join(paths.REPO_ROOT, 'docs', 'usage.md')
BEGIN, END = '<!-- compile_memory -->', '<!-- /compile_memory -->'
COMMAND = 'python -m ctr_jax.projects.perf.compile_memory'
MEMORY_FRACTION = 0.75          # JAX's default GPU preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION)
GPUS_GIB = (80, 40)             # the A100 / H100 sizes
DTYPES = ('float32', 'bfloat16')
ROW_KEYS = (*aot.KEYS, 'k_unroll', 'batch_size', 'seq_len', 'compile_seconds')

FLAGS = flags.FLAGS
flags.DEFINE_list('configs', [], 'Paper configs to measure (default: every configs/d*_c*.py and '
                  't*_c*.py).')
flags.DEFINE_list('dtypes', list(DTYPES), 'Compute dtypes (config.precision).')
flags.DEFINE_bool('doc_only', False, 'Only rewrite the docs section from the json.')
flags.DEFINE_string('child', '', 'Internal: measure CONFIG:DTYPE in this process.')


def paper_configs() -> list[str]:
  """The names of configs/d*_c*.py and configs/t*_c*.py: the paper's models."""
  found = glob.glob(os.path.join(paths.REPO_ROOT, 'configs', '[dt]*_c*.py'))
  return sorted(os.path.basename(p)[:-3] for p in found)


def load(name: str, dtype: str, remat: str):
  config = paths.load_config_module(f'configs/{name}.py', name).get_config()
  config.precision = dtype
  config.train.remat = remat
  return config


def model_flops(config) -> float:
  """The training FLOPs of one step by the model's formula (`models.training_flops_per_token`:
  3 x the forward's matmul FLOPs, attention included, the unit K times), for the count XLA
  reports."""
  spec = models.spec_of(config.model)
  k = spec.k_unroll if spec.is_context_ready else 1
  tokens = config.batch_size * config.data.seq_len
  return models.training_flops_per_token(spec, config.data.seq_len, k) * tokens


def measure_child(name: str, dtype: str) -> None:
  """One JSON line per remat: the compile job's numbers for `name` in `dtype`, on one device."""
  for remat in recurrence.REMAT:
    config = load(name, dtype, remat)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    result = aot.measure(config, config_lib.model_config_for(config, 'cpu'), mesh)
    row = {'config': name, 'kind': config.model.kind, 'dtype': dtype, 'remat': remat,
           **{k: result[k] for k in ROW_KEYS}, 'model_flops_per_step': model_flops(config)}
    print('ROW ' + json.dumps(row), flush=True)


def run_child(name: str, dtype: str) -> list[dict]:
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=1',
         'JAX_PLATFORMS': 'cpu'}
  proc = subprocess.run([sys.executable, '-m', 'ctr_jax.projects.perf.compile_memory',
                         f'--child={name}:{dtype}'], env=env, capture_output=True, text=True,
                        check=False)
  if proc.returncode:
    raise RuntimeError(f'{name} in {dtype}: the child failed:\n{proc.stderr[-3000:]}')
  return [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith('ROW ')]


def fits(row: dict, gib: int) -> bool:
  return row['peak_bytes'] <= MEMORY_FRACTION * gib * 2**30


def choose(rows: list[dict], name: str, dtype: str, gib: int) -> str | None:
  """The remat with the fewest FLOPs per step among those whose step fits a `gib` GPU (ties:
  the smaller peak); None when none fits."""
  fitting = [r for r in rows if r['config'] == name and r['dtype'] == dtype and fits(r, gib)]
  if not fitting:
    return None
  return min(fitting, key=lambda r: (r['flops_per_step'], r['peak_bytes']))['remat']


def choices(rows: list[dict]) -> dict:
  """{config: {'80': {'float32': remat or None, 'bfloat16': ...}, '40': {...}}}."""
  out = {}
  for name in sorted({r['config'] for r in rows}):
    dtypes = sorted({r['dtype'] for r in rows if r['config'] == name}, key=DTYPES.index)
    out[name] = {str(g): {d: choose(rows, name, d, g) for d in dtypes} for g in GPUS_GIB}
  return out


def _gib(value: float) -> str:
  return f'{value / 2**30:.1f}'


def section(report: dict) -> str:
  """The markdown of docs/usage.md's section, every number from the json."""
  rows = report['rows']
  by = {(r['config'], r['dtype'], r['remat']): r for r in rows}
  dtypes = [d for d in DTYPES if any(r['dtype'] == d for r in rows)]
  share = f'{MEMORY_FRACTION:.0%}'
  lines = [
      f"Peak GiB per device of one training step at each config's own batch (B x T, K: its "
      f"largest), by `--config.job=compile` on {report['machine']} ({report['date']}; "
      f"`{COMMAND}`, [compile_memory.json](compile_memory.json)), one cell per remat: "
      + ' / '.join(dtypes) + ' compute. Peak = argument + output - alias + temp bytes, '
      "XLA:CPU's estimate for one device; a GPU compiles differently, so check on it with "
      '`--config.job=compile`. A step fits a G GB GPU when its peak is at most '
      f'{share} of G (JAX preallocates {share} by default; `XLA_PYTHON_CLIENT_MEM_FRACTION` '
      'changes it). Default: `config.train.remat` as shipped (the fewest FLOPs that fit 80 GB '
      "in float32; they fit in bfloat16 too, what `config.precision='auto'` computes in on a "
      'GPU).',
      '',
      '| config | B x T, K | ' + ' | '.join(recurrence.REMAT) + ' | default | 40 GB needs |',
      '|---|---|' + '---|' * (len(recurrence.REMAT) + 2),
  ]
  for name, choice in report['choices'].items():
    first = by[(name, dtypes[0], 'none')]
    k = first['k_unroll'] if first['kind'] == 'context_ready' else '-'
    shape = f"{first['batch_size']} x {first['seq_len']}, {k}"
    cells = [' / '.join(_gib(by[(name, d, r)]['peak_bytes']) for d in dtypes
                        if (name, d, r) in by) for r in recurrence.REMAT]
    needs = ' / '.join(f'`{c}`' if c else 'none fits' for c in choice['40'].values())
    default = config_lib.PAPER_REMAT.get(name, 'none')
    lines.append(f'| {name} | {shape} | ' + ' | '.join(cells) + f' | `{default}` | {needs} |')
  lines += ['', _forty_gb_sentence(report)]
  same = [d for d in dtypes if all(
      abs(by[(n, d, 'matmuls')]['flops_per_step'] / by[(n, d, 'layer')]['flops_per_step'] - 1)
      < 1e-3 for n in report['choices'])]
  if same:
    lines += ['', f"In {' and '.join(same)}, `matmuls` recomputes as much as `layer`: the "
              'policy saves the outputs of `dot_general`s, and these products run inside a '
              'custom VJP (`ctr_jax.ops.kernels.bf16_product`) that it cannot see into.']
  transformers = [n for n in report['choices']
                  if by[(n, dtypes[0], 'none')]['kind'] != 'context_ready']
  if transformers and all(
      by[(n, d, r)]['peak_bytes'] >= 0.99 * by[(n, d, 'none')]['peak_bytes']
      for n in transformers for d in dtypes for r in ('layer', 'matmuls')):
    lines += ['', "For the transformers, XLA:CPU's estimate with `layer` or `matmuls` is above "
              'or within 1% of the one without remat: in its buffer assignment the '
              "recomputed activations of many blocks are alive at once (the context-ready unit's "
              "scan keeps one iteration's). That says nothing about a GPU's schedule; they fit "
              'without remat.']
  return '\n'.join(lines)


def _forty_gb_sentence(report: dict) -> str:
  none_fit = sorted(name for name, c in report['choices'].items()
                    if all(v is None for v in c['40'].values()))
  float32 = {name: c['40'].get('float32') for name, c in report['choices'].items()}
  changed = sorted(name for name, remat in float32.items()
                   if remat and remat != config_lib.PAPER_REMAT.get(name, 'none'))
  text = ('**On a 40 GB GPU** (an A100 40GB): the configs fit with the remat of the last column '
          '(per compute dtype): `--config.train.remat=NAME`')
  if changed:
    text += ' (' + ', '.join(f'{n}: `{float32[n]}`' for n in changed) + ' in float32)'
  text += '.'
  if none_fit:
    text += (' ' + ', '.join(none_fit) + ' fit no remat at its batch on one 40 GB GPU: halve '
             '`--config.batch_size` (fewer tokens per step) or shard over two GPUs '
             '(`--config.mesh.fsdp=2`, batch and state split in two).')
  return text


def main(argv):
  del argv
  if FLAGS.child:
    name, dtype = FLAGS.child.split(':')
    measure_child(name, dtype)
    return
  names = FLAGS.configs or paper_configs()
  unknown = sorted(set(names) - set(paper_configs()))
  if unknown:
    sys.exit(f'--configs: unknown {unknown}; allowed {paper_configs()}')
  bad = sorted(set(FLAGS.dtypes) - set(DTYPES))
  if bad:
    sys.exit(f'--dtypes: unknown {bad}; allowed {list(DTYPES)}')
  report = {'rows': []}
  if os.path.exists(JSON):
    with open(JSON) as f:
      report = json.load(f)
  for name in [] if FLAGS.doc_only else names:
    for dtype in FLAGS.dtypes:
      rows = run_child(name, dtype)
      for row in rows:
        print(f"{name} {dtype} {row['remat']}: peak {_gib(row['peak_bytes'])} GiB, temp "
              f"{_gib(row['temp_bytes'])} GiB, {row['flops_per_step']:.3g} FLOPs "
              f"({row['flops_per_step'] / row['model_flops_per_step']:.3f} x the formula), "
              f"compiled in {row['compile_seconds']} s", flush=True)
      report['rows'] = [r for r in report['rows'] if (r['config'], r['dtype']) != (name, dtype)]
      report['rows'] = sorted(report['rows'] + rows, key=lambda r: (
          r['config'], DTYPES.index(r['dtype']), recurrence.REMAT.index(r['remat'])))
      report.update(command=COMMAND, machine=machine.summary_line(machine.describe()),
                    date=datetime.date.today().isoformat(), memory_fraction=MEMORY_FRACTION,
                    gpus_gib=list(GPUS_GIB), choices=choices(report['rows']))
      with open(JSON, 'w') as f:  # after every config: an interrupted run keeps what it measured
        json.dump(report, f, indent=1)
        f.write('\n')
  doc_sections.replace_between(DOC, BEGIN, END, section(report))
  print(f'wrote {JSON} and its section of {DOC}')


if __name__ == '__main__':
  app.run(main)
