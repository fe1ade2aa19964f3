"""Memory and FLOPs of the train step before the run: `--config.job=compile`.

The step the trainer would run (`ctr_jax.training.program`, the config's mesh, its sharding
rules, the largest K) is compiled ahead of time from shapes alone, as MaxText's AOT compile does:
`jax.jit(step).lower(state and batch as ShapeDtypeStructs with their shardings).compile()`. No
dataset is read or built (the task's `abstract` gives the objective and the batch's shape) and
no state is allocated. XLA reports, per device:

  argument_bytes  the step's inputs: this device's share of the train state and of the batch
  output_bytes    its outputs: the new state and the metrics
  alias_bytes     the part of the outputs written into the donated state's buffers
  temp_bytes      everything else alive at the step's peak: the activations the backward pass
                  keeps (what `config.train.remat` trades for recomputation), the gradients,
                  XLA's scratch
  peak_bytes      argument + output - alias + temp: what the device holds while the step runs

and `flops_per_step`, the floating-point operations of one step on one device, the whole
K-unroll included. XLA's cost analysis counts a loop's body once, whatever its trip count, and the
compiled step runs the K iterations as one scan; so the count comes from the same step lowered
with the scan unrolled (`ops.recurrence.unrolled_loops`: the same function as straight-line
code), before XLA's optimisation passes, divided by the number of devices. Recomputation is
counted (remat adds the forward passes it repeats). BPTT's position scan is not unrolled: its
count is left out (None).

The compute dtype is the one a run on the same backend would use (`config.precision`): 'auto'
compiles float32 on a CPU, so `--config.precision=bfloat16` there gives what a GPU or TPU runs.
"""

import functools
import time

import jax

from ctr_jax import tasks
from ctr_jax.ops import recurrence
from ctr_jax.training import checkpointing, metrics, train_step
from ctr_jax.training import program as program_lib
from ctr_jax.training import workdir as workdir_lib

# compile.json's byte and FLOP counts, in the order they are printed.
KEYS = ('argument_bytes', 'output_bytes', 'alias_bytes', 'temp_bytes', 'peak_bytes',
        'flops_per_step')


def measure(config, model_config, mesh: jax.sharding.Mesh) -> dict:
  """Compiles `config`'s train step on `mesh` from shapes (`model_config`: `config.model` with the
  compute dtype resolved, `config_lib.model_config_for`); returns the `KEYS` and what was
  compiled (K, remat, batch, dtype, devices, seconds)."""
  objective, batch_shapes = tasks.abstract(config)
  program = program_lib.build(config, model_config, mesh, objective)
  state = checkpointing.abstract_with_shardings(program.abstract_state, program.state_shardings)
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                      sharding=program.batch_sharding),
                       batch_shapes)
  recipe = train_step.Recipe.from_config(config.train)
  k = config.model.k_unroll  # the largest K a random-depth run draws, so the most memory
  start = time.perf_counter()
  with program.context():
    compiled = program.step(k).lower(state, batch).compile()
    seconds = time.perf_counter() - start
    flops = None
    if recipe.mode == 'unroll':
      with recurrence.unrolled_loops():  # a fresh jit: the loop's trace is not reused
        unrolled = jax.jit(functools.partial(program.step_fn, k_unroll=k),
                           in_shardings=(program.state_shardings, program.batch_sharding),
                           out_shardings=(program.state_shardings, program.replicated),
                           donate_argnums=(0,)).lower(state, batch)
      flops = _flops(unrolled.cost_analysis()) / mesh.size
  memory = compiled.memory_analysis()
  out = {'argument_bytes': int(memory.argument_size_in_bytes),
         'output_bytes': int(memory.output_size_in_bytes),
         'alias_bytes': int(memory.alias_size_in_bytes),
         'temp_bytes': int(memory.temp_size_in_bytes)}
  out['peak_bytes'] = (out['argument_bytes'] + out['output_bytes'] - out['alias_bytes']
                       + out['temp_bytes'])
  out['flops_per_step'] = flops
  device = mesh.devices.flat[0]
  out.update(k_unroll=k, remat=recipe.remat, mode=recipe.mode, batch_size=config.batch_size,
             seq_len=config.data.seq_len, dtype=model_config.dtype,
             param_dtype=model_config.param_dtype, platform=device.platform,
             device_kind=device.device_kind, devices=int(mesh.size),
             mesh={k: int(v) for k, v in mesh.shape.items()},
             compile_seconds=round(seconds, 1))
  return out


def _flops(cost) -> float:
  # A dict, or (in some JAX versions) a list with one dict per program.
  costs = cost if isinstance(cost, (list, tuple)) else [cost]
  return float(sum(c.get('flops', 0.0) for c in costs if c))


def compile_job(config, model_config, mesh: jax.sharding.Mesh, workdir: str,
                is_chief: bool) -> dict:
  """`--config.job=compile`: `measure`, then `<workdir>/compile.json` and one line per number."""
  result = measure(config, model_config, mesh)
  if is_chief:
    metrics.write_json(workdir_lib.resolve(workdir) / 'compile.json', result)
    mesh_text = ' '.join(f'{k}={v}' for k, v in result['mesh'].items())
    print(f"ctr_jax: compiled the train step for {result['devices']} x "
          f"{result['device_kind']} ({result['platform']}), mesh {mesh_text}, batch "
          f"{result['batch_size']} x {result['seq_len']}, K = {result['k_unroll']}, remat "
          f"{result['remat']!r}, {result['dtype']}, in {result['compile_seconds']} s; per device:",
          flush=True)
    for key in KEYS:
      print(f'{key}: {_human(key, result[key])}', flush=True)
  return result


def _human(key: str, value) -> str:
  if value is None:
    return 'not counted (BPTT runs a position scan)'
  if key.endswith('_bytes'):
    return f'{value} ({value / 2**30:.2f} GiB)'
  return f'{value:.4g}'
