"""Experiment configs: the shared defaults (`get_base`), the paper's recipe (`paper_config`),
`file.py:k=v,...` args, validation and the CPU shrink.

Every field is listed in `get_base` once, with a comment; the files in configs/ call it (or
`paper_config`) and override. Fields the paper does not report (optimizer details, schedule,
warmup) are our choices and are marked as such.
"""

import ast
import difflib
import json
import math
import re
import sys

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections

from ctr_jax import models, tasks
from ctr_jax.training import checkpointing, compat, metrics, optim, preemption, sharding, train_step

JOBS = ('train', 'evaluate', 'generate', 'prepare', 'compile')
PRECISIONS = ('auto', 'float32', 'bfloat16')


def get_base() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.job = 'train'                # 'train' (train and evaluate) | 'evaluate' | 'generate' |
                                 # 'prepare' (only build the dataset, tokenizer and token cache) |
                                 # 'compile' (the train step's memory and FLOPs per device from
                                 # shapes, into compile.json; no data, no training)
  c.seed = 0
  c.precision = 'auto'           # the model's compute dtype (resolve_precision): 'auto' = bfloat16
                                 # on GPU/TPU, float32 on CPU | 'float32' | 'bfloat16'; parameters,
                                 # optimiser state, softmax, norms and loss stay float32
  c.model = models.model_config()  # see ctr_jax/models/config.py for the model fields

  # The training recipe (ctr_jax/training/train_step.py): how batches are trained, not what the model is,
  # so a resumed run may change it.
  c.train = ml_collections.ConfigDict()
  c.train.mode = 'unroll'        # 'unroll' (parallel K-step forward) | 'bptt' (backpropagation
                                 # through the exact sequential forward; context-ready only)
  c.train.k_min = 0              # >0: K ~ Uniform{k_min..model.k_unroll} per batch; 0 = fixed K
  c.train.convergence_weight = 0.1  # lambda of MSE(e + c^(K), stopgrad(e + c^(K-1))) (unroll)
  # What the backward pass recomputes instead of storing (unroll): 'none' | 'iteration' (each
  # fixed-point iteration) | 'layer' (each block) | 'matmuls' (each block, its weight products
  # kept); True / False (older configs) = 'iteration' / 'none'. --config.job=compile measures it.
  c.train.remat = ml_collections.FieldReference('none', field_type=object)
  c.train.grad_iterations = 0    # >0: backpropagate through the last m of the K iterations only

  c.data = ml_collections.ConfigDict()
  c.data.name = 'kjv_bible'      # 'kjv_bible' | 'openwebtext' | 'wikipedia' | 'pointer_chasing'
  c.data.data_dir = ''           # '' = $TFDS_DATA_DIR or ~/tensorflow_datasets
  c.data.manual_dir = ''         # raw archives for openwebtext / wikipedia
  c.data.num_workers = 0         # processes that read and tokenise openwebtext / wikipedia when
                                 # they are prepared; 0 = every core this process may use
  c.data.seq_len = 256           # T, the paper's "block size"
                                 # (configs/pointer_chasing.py adds the pointer task's fields)

  c.batch_size = 64              # global batch (split over processes and data/fsdp devices)
  c.total_steps = 100_000

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 2e-4              # the paper's learning rate
  c.optim.warmup_steps = 2000    # our choice (not reported by the paper)
  c.optim.min_lr_ratio = 0.1     # cosine decay to lr * min_lr_ratio (our choice)
  c.optim.weight_decay = 0.1     # AdamW, on matrices only (our choice)
  c.optim.b1 = 0.9
  c.optim.b2 = 0.95
  c.optim.eps = 1e-8
  c.optim.grad_clip = 1.0        # global-norm clipping; 0 = off

  c.log_every = 100              # metrics.jsonl rows: losses, tokens/s (per device too), MFU
  c.profile_steps = ''           # a jax.profiler trace in <workdir>/tensorboard: '' off, 'N' N
                                 # steps after the first (which compiles), 'A,B' steps A+1..B
  c.eval_every = 5000            # the author's evaluation interval
  c.eval_batches = 20            # validation batches per evaluation (0 = the whole split)
  c.eval_sequential = True       # also evaluate a context-ready model with the exact scan
  c.checkpoint_every = 5000
  c.keep_checkpoints = 3           # newest checkpoints kept (>= 1)
  c.async_checkpoints = 'auto'   # orbax's async save: 'auto' (GPU/TPU: on, CPU: off) | 'on' |
                                 # 'off' (docs/reliability.md)
  c.strict_resume = False        # False: a damaged newest checkpoint is moved aside with a warning
                                 # and the run resumes from the newest complete older one;
                                 # True: refuse (docs/reliability.md)
  c.exit_at_step = -1            # save and exit at this step (time-sliced clusters, tests)
  c.init_from = ''               # workdir of a transformer run to convert (zero-init correction);
                                 # for a transformer run: continue its weights (fresh optimiser)

  c.sample = ml_collections.ConfigDict()
  c.sample.prompt = 'And God said'
  c.sample.num_tokens = 64
  c.sample.temperature = 0.8
  c.sample.top_k = 40

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1               # -1 = all remaining devices
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  c.sharding_rules = [list(r) for r in sharding.DEFAULT_RULES]

  c.distributed = ml_collections.ConfigDict()
  c.distributed.auto = True      # initialise through JAX's own cluster detection (SLURM srun,
                                 # Open MPI, TPU pod slices on GCE and GKE) when the cluster has
                                 # more than one process (ctr_jax/training/distributed.py)
  c.distributed.coordinator_address = ''  # e.g. '10.0.0.1:1234' to initialise explicitly
  c.distributed.num_processes = -1  # -1: from the detected cluster; >= 1 overrides it
  c.distributed.process_id = -1     # -1: from the detected cluster; >= 0 overrides it
  c.distributed.peer_timeout_seconds = 60  # a process silent this long is lost: the others end
                                           # with one line, status 3 (training/preemption.py)
  return c


# The remat each paper config (configs/<name>.py) trains with: the fewest FLOPs per step among
# the choices whose train step fits one 80 GB GPU at its batch in float32, as
# --config.job=compile estimates it (docs/compile_memory.json, written by
# `python -m ctr_jax.projects.perf.compile_memory`; tests/test_compile_memory.py checks both agree).
PAPER_REMAT = {
    'd11_c768': 'matmuls', 'd1_c2048': 'none', 'd1_c2048_k10': 'matmuls', 'd3_c1408': 'none',
    'd5_c1120': 'matmuls', 'd6_c1024': 'matmuls',
    't12_c768': 'none', 't2_c1888': 'none', 't4_c1344': 'none', 't6_c1088': 'none',
}


def paper_config(size: str, arg: str | None, *, k_min: int = 2, remat: str | None = None,
                 **model_overrides) -> ml_collections.ConfigDict:
  """The author's OpenWebText recipe for one size name (reference section 6.1).

  Vocabulary 32,000, block 256, batch 64, 100K steps, lr 2e-4, K = 5 with k_min = 2, lambda = 0.1,
  16 heads; `config.train.remat` from `PAPER_REMAT[size]` unless `remat` is given. Args:
  `runlocal` shrinks it to a CPU run of a few minutes on the embedded corpus.
  """
  args = parse_arg(arg, runlocal=False)
  c = get_base()
  fields = dict(vocab_size=32000, max_len=1024, k_unroll=5)
  c.model = models.model_config(name=size, **{**fields, **model_overrides})
  c.train.k_min = k_min
  c.train.convergence_weight = 0.1
  c.train.remat = PAPER_REMAT.get(size, 'none') if remat is None else remat
  c.data.name = 'openwebtext'
  c.data.seq_len = 256
  c.batch_size = 64
  c.total_steps = 100_000
  c.optim.lr = 2e-4
  if args.runlocal:
    shrink_for_cpu(c)
  return c


def parse_arg(arg: str | None, **spec) -> ml_collections.ConfigDict:
  """Parses 'a=1,b=x,flag' against typed defaults in `spec`; a bare name sets a bool to True.

  >>> parse_arg('runlocal,k=8', runlocal=False, k=5)  # -> {'runlocal': True, 'k': 8}
  """
  values = ml_collections.ConfigDict(dict(spec))
  for item in filter(None, (arg or '').split(',')):
    key, _, raw = item.partition('=')
    key = key.strip()
    if key not in spec:
      raise ValueError(f'config arg {key!r} is unknown; allowed: {sorted(spec)}')
    default = spec[key]
    if not _:
      if not isinstance(default, bool):
        raise ValueError(f'config arg {key!r} needs a value ({key}=...)')
      values[key] = True
      continue
    if isinstance(default, bool):
      values[key] = raw.lower() in ('1', 'true', 'yes', 'on')
    elif isinstance(default, (int, float)):
      try:
        values[key] = type(default)(ast.literal_eval(raw))
      except (ValueError, SyntaxError):
        raise ValueError(f'config arg {key}={raw!r} is not a {type(default).__name__}') from None
    else:
      values[key] = raw
  return values


def _check(ok, field, message):
  if not ok:
    raise ValueError(f'config.{field}: {message}')


def validate(config, devices=None) -> None:
  """Checks a whole experiment config before anything touches the workdir; with the `devices`
  the run will use, also that the mesh fits them and the batch splits evenly over them."""
  _check(config.job in JOBS, 'job', f'got {config.job!r}, allowed {list(JOBS)}')
  _check(config.get('precision', 'auto') in PRECISIONS, 'precision',
         f"got {config.get('precision')!r}, allowed {list(PRECISIONS)}")
  models.validate(config.model)
  train_step.validate(config.train, config.model)
  tasks.validate_config(config)  # data.name, and the fields of that task
  for field in ('total_steps', 'batch_size', 'log_every', 'eval_every', 'checkpoint_every'):
    _check(int(config[field]) >= 1, field, f'must be >= 1, got {config[field]!r}')
  _check(config.data.seq_len >= 1, 'data.seq_len', 'must be >= 1')
  _check(config.data.seq_len <= config.model.max_len, 'data.seq_len',
         f'{config.data.seq_len} exceeds model.max_len={config.model.max_len}')
  _check(config.optim.lr > 0, 'optim.lr', 'must be > 0')
  _check(0 <= config.optim.warmup_steps, 'optim.warmup_steps', 'must be >= 0')
  _check(0 <= config.optim.min_lr_ratio <= 1, 'optim.min_lr_ratio', 'must be in [0, 1]')
  _check(config.optim.grad_clip >= 0, 'optim.grad_clip', 'must be >= 0 (0 = off)')
  for axis in ('data', 'fsdp', 'tensor'):
    size = config.mesh[axis]
    _check(size == -1 or size >= 1, f'mesh.{axis}', 'must be -1 (all remaining) or >= 1')
  _check([config.mesh[a] for a in ('data', 'fsdp', 'tensor')].count(-1) <= 1, 'mesh',
         'at most one axis may be -1')
  _check(isinstance(config.eval_batches, int) and config.eval_batches >= 0, 'eval_batches',
         f'must be an integer >= 0 (0 = the whole validation split), got '
         f'{config.eval_batches!r}')
  _validate_sample(config.sample, config.model)
  # Workdir safety (docs/reliability.md): 0 would delete every checkpoint after saving it.
  _check(isinstance(config.keep_checkpoints, int) and config.keep_checkpoints >= 1,
         'keep_checkpoints', f'must be an integer >= 1, got {config.keep_checkpoints!r}')
  _check(config.get('strict_resume', False) in (True, False), 'strict_resume',
         f"got {config.get('strict_resume')!r}, allowed [True, False]")
  if devices is not None:
    _validate_batch_split(config, len(devices))
  dist = config.distributed
  _check(isinstance(dist.num_processes, int) and (dist.num_processes == -1
                                                 or dist.num_processes >= 1),
         'distributed.num_processes', f'must be -1 (from the cluster) or >= 1, got '
         f'{dist.num_processes!r}')
  _check(isinstance(dist.process_id, int) and dist.process_id >= -1
         and (dist.num_processes == -1 or dist.process_id < dist.num_processes),
         'distributed.process_id', f'must be -1 (from the cluster) or in [0, num_processes), got '
         f'{dist.process_id!r}')
  metrics.profile_range(config.get('profile_steps', ''), 0)  # raises naming the field
  checkpointing.use_async(config.get('async_checkpoints', 'auto'))  # the same
  preemption.peer_timeout(dist)  # its own one-line error: maybe_initialize checks it first


def _validate_sample(sample, model) -> None:
  # Checked here, not when the sample is drawn after training (docs/reliability.md, row 22).
  max_tokens = model.max_len - 1  # the prompt takes at least one of the max_len positions
  _check(isinstance(sample.num_tokens, int) and 0 <= sample.num_tokens <= max_tokens,
         'sample.num_tokens', f'must be an integer in [0, model.max_len - 1 = {max_tokens}] '
         f'(prompt and sample share model.max_len={model.max_len} positions), got '
         f'{sample.num_tokens!r}')
  _check(math.isfinite(sample.temperature) and sample.temperature >= 0, 'sample.temperature',
         f'must be a finite number >= 0 (0 = greedy), got {sample.temperature!r}')
  if sample.num_tokens > 0:  # top_k only matters when a sample is drawn
    _check(isinstance(sample.top_k, int) and 0 <= sample.top_k <= model.vocab_size,
           'sample.top_k', f'must be an integer in [0, model.vocab_size={model.vocab_size}] '
           f'(0 = no cut), got {sample.top_k!r}')


def _validate_batch_split(config, num_devices: int) -> None:
  """The mesh fits `num_devices` and config.batch_size splits evenly over its batch axes."""
  shape = sharding.mesh_shape(config.mesh, num_devices)
  if config.job not in ('train', 'evaluate'):
    return  # no batches: 'prepare' stops before them, 'generate' only samples
  axes = sharding.batch_axes([tuple(r) for r in config.sharding_rules])
  split = math.prod(shape.get(a, 1) for a in axes)
  over = ' x '.join(f'{a}={shape.get(a, 1)}' for a in axes)
  _check(config.batch_size % split == 0, 'batch_size',
         f'{config.batch_size} is not divisible by the {split} devices each batch is split over '
         f'(mesh {over}, of {num_devices} devices); use a multiple of {split} or set config.mesh')


def resolve_precision(config, platform: str) -> str:
  """The model's compute dtype for `config.precision` on a device `platform` ('cpu', 'gpu',
  'tpu', as `jax.Device.platform`): the one place the precision is decided.

  'auto' is bfloat16 on an accelerator and float32 on a CPU (so every CPU number stays as it
  was); 'float32' and 'bfloat16' are that everywhere. Only the compute dtype (`model.dtype`)
  changes: parameters keep `model.param_dtype` (float32), and so do the gradients and AdamW's
  state. In bfloat16 the numerically delicate parts already run in float32: attention scores
  and softmax (`ops.kernels.attention`, `models.attention`: float32 accumulation), LayerNorm
  and RMSNorm statistics (`models.layer_norm`, `layers.rms_normalize`), the log-softmax and
  cross-entropy (`lm.logits` casts the head's output to float32, and
  `tasks.losses.next_token_loss` computes in float32) and the convergence term's mean square
  (`lm`). The matrix products take bfloat16 operands and accumulate in float32
  (`ops.kernels.bf16_product`); their outputs, the residual stream included, are bfloat16.

  A `model.dtype` other than its default 'float32' (a config asking for bfloat16, float16 or
  float64 itself) wins over `config.precision`; with 'float32' there, the precision decides.
  """
  if config.model.dtype != 'float32':
    return config.model.dtype
  precision = config.get('precision', 'auto')
  if precision == 'auto':
    return 'float32' if platform == 'cpu' else 'bfloat16'
  return precision


def model_config_for(config, platform: str) -> ml_collections.ConfigDict:
  """A copy of `config.model` whose `dtype` is `resolve_precision(config, platform)`; the config
  itself (what checkpoints record and resumes compare) is left as given."""
  model = config.model.copy_and_resolve_references()
  model.dtype = resolve_precision(config, platform)
  return model


def check_moved_overrides(argv) -> None:
  """`--config.model.k_min=...` and the other recipe fields now live in `config.train`."""
  for arg in argv:
    name = arg.lstrip('-').split('=', 1)[0]
    if name.startswith('config.model.'):
      compat.check_not_moved([name[len('config.model.'):]])


def shrink_for_cpu(config) -> None:
  """The `:runlocal` arg: a few hundred steps of a small model that runs in minutes on a CPU."""
  keep = {k: config.model[k] for k in ('kind', 'correction', 'cumulative', 'k_unroll', 'block')}
  config.model = models.model_config(
      **keep, width=128, depth=min(config.model.depth, 2) if keep['kind'] == 'context_ready'
      else min(config.model.depth, 4), num_heads=4, vocab_size=2048, max_len=128)
  config.model.k_unroll = min(config.model.k_unroll, 5)
  config.train.k_min = min(config.train.k_min, config.model.k_unroll)
  config.train.remat = 'none'  # a CPU-sized step needs no recomputation
  config.data.name = 'kjv_bible'
  config.data.seq_len = 64
  config.batch_size = 16
  config.total_steps = 200
  config.optim.warmup_steps = 20
  config.optim.lr = 1e-3
  config.log_every = 20
  config.eval_every = 100
  config.checkpoint_every = 100
  config.eval_batches = 4
  config.sample.num_tokens = 32


def parse_flags_one_line_errors(flag_values, argv, program: str):
  """Parses absl flags; a bad config file, arg or override ends as one line and exit code 2."""
  try:
    argv = flag_values(argv)
    flag_values.config.get('name')  # a config file that failed to load raises here
    return argv
  except (flags.Error, KeyError, OSError, ValueError, TypeError, AttributeError) as e:
    print(f'{program}: error: {_one_line(e, flag_values, argv)}', file=sys.stderr)
    sys.exit(2)


def _one_line(error: BaseException, flag_values=None, argv=()) -> str:
  error = error.__cause__ or error
  if isinstance(error, AttributeError) and error.args and isinstance(error.args[0], KeyError):
    error = error.args[0]  # ml_collections wraps an unknown override's KeyError
  if isinstance(error, KeyError) and error.args:
    return _unknown_field_message(error, flag_values, argv)
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  if any(l.startswith('Traceback') for l in lines):
    lines = lines[-1:]  # a config file that raised: its last line is the actual message
  return ' '.join(l for l in lines if not l.startswith('Pass --helpshort'))


def field_paths(config, prefix: str = '') -> list[str]:
  """Every dotted field path of a ConfigDict ('model.width', 'optim.lr', ...), nodes included."""
  paths = []
  for key, value in config.items():
    path = f'{prefix}{key}'
    paths.append(path)
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      paths.extend(field_paths(value, path + '.'))
  return paths


def unknown_field_error(path: str, config) -> str:
  """"unknown config field 'model.widht'; did you mean 'model.width'?" (difflib's nearest)."""
  parts = path.split('.')
  node, depth = config, 0
  while depth < len(parts) and isinstance(node, (ml_collections.ConfigDict, dict)) \
      and parts[depth] in node:
    node, depth = node[parts[depth]], depth + 1
  parent = '.'.join(parts[:depth])
  prefix = parent + '.' if parent else ''
  known = field_paths(config)
  siblings = list(node) if isinstance(node, (ml_collections.ConfigDict, dict)) else []
  # First the misspelt component among its siblings, then the name anywhere ('grad_clip').
  nearest = [prefix + '.'.join([n, *parts[depth + 1:]])
             for n in difflib.get_close_matches(parts[depth], siblings, n=3, cutoff=0.6)]
  nearest = [n for n in nearest if n in known] or [
      k for k in known if k.rpartition('.')[2] == parts[-1] and k != path]
  if nearest:
    hint = f"; did you mean {' or '.join(repr(n) for n in nearest[:3])}?"
  elif not isinstance(node, (ml_collections.ConfigDict, dict)):
    hint = f'; {parent!r} is a value, not a section'
  else:
    hint = f"; the fields {'of ' + repr(parent) if parent else 'at the top'} are {sorted(siblings)}"
  return f'unknown config field {path!r}{hint}'


def _unknown_field_message(error: KeyError, flag_values, argv) -> str:
  # The KeyError names only the last component ('widht'); the override in argv has the path.
  name = str(error.args[0]).splitlines()[0].strip('\'"')
  config = _load_config_for_hint(flag_values, argv)
  if config is not None:
    known = field_paths(config)
    for path in _override_paths(argv):
      if path not in known:
        return unknown_field_error(path, config)
  said = re.search(r'Did you mean "([^"]+)"', str(error.args[0]))
  return f"unknown config field {name!r}" + (f"; did you mean {said[1]!r}?" if said else '')


def _override_paths(argv) -> list[str]:
  paths = []
  for arg in argv or ():
    if arg.startswith('--config.'):
      paths.append(arg[len('--config.'):].split('=', 1)[0])
  return paths


def _load_config_for_hint(flag_values, argv):
  """The config the overrides apply to, loaded again (the failed parse left no value)."""
  if flag_values is None:
    return None
  try:
    flag = flag_values['config']
    specs = [a.split('=', 1)[1] for a in argv or () if a.startswith('--config=')]
    spec = specs[-1] if specs else flag.default_as_str or flag.default
    return flag.parser.parse(spec.strip("'\"")) if isinstance(spec, str) else None
  except Exception:  # pylint: disable=broad-except  (only a hint: never mask the real error)
    return None


def state_structure_changes(saved_config: dict, config) -> list[tuple[str, object, object]]:
  """(field, saved, current) for each optimizer field whose change alters the state's tree.

  Such a change (e.g. optim.grad_clip 0 <-> > 0 adds or drops optax's clipping state) makes the
  checkpoint's optimizer state unreadable; compared on a two-leaf stand-in for the parameters.
  """
  saved = dict(saved_config.get('optim') or {})
  current = json.loads(config.optim.to_json())
  params = {'kernel': jnp.zeros((2, 2)), 'bias': jnp.zeros((2,))}

  def structure(fields):
    tx = optim.make_optimizer(ml_collections.ConfigDict(fields), max(int(config.total_steps), 1))
    return jax.tree.structure(jax.eval_shape(tx.init, params))

  if not saved or set(saved) != set(current):
    saved = {**current, **{k: v for k, v in saved.items() if k in current}}
  reference = structure(saved)
  changes = []
  for field in sorted(current):
    if saved[field] != current[field] and structure({**saved, field: current[field]}) != reference:
      changes.append((f'optim.{field}', saved[field], current[field]))
  return changes


def check_resumable(saved_config: dict, config, workdir: str) -> None:
  """Raises a one-line ValueError when the checkpoint's train state cannot take this config."""
  changes = state_structure_changes(saved_config, config)
  if changes:
    fields = ', '.join(f'config.{f}={c!r} (the checkpoint has {s!r})' for f, s, c in changes)
    flags = ' '.join(f'--config.{f}={s!r}' for f, s, _ in changes)
    raise ValueError(f'{fields}: this changes the optimizer state saved in {workdir}, so it '
                     f'cannot resume; pass {flags} to resume, or use a new --workdir')
