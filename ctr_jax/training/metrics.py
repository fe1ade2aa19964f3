"""What a user sees in the workdir: metrics.jsonl, TensorBoard events, curves.png, summary.json,
the throughput and MFU they log (`Throughput`) and profiler traces (`Profiler`).

Only process 0 writes; other processes get a writer whose methods do nothing. Files go through
`etils.epath`, so a `gs://` workdir works like a local one with the `.[gcs]` extra installed
(gcsfs for epath, google-cloud-storage for the TensorBoard events; ctr_jax/training/workdir.py).
"""

import io
import json
import math
import sys
import time

from etils import epath
import jax
from matplotlib.figure import Figure
import numpy as np
from tensorboardX import SummaryWriter

from ctr_jax import models
from ctr_jax.training import workdir as workdir_lib


class MetricWriter:
  """JSON lines plus TensorBoard scalars (tensorboardX: no TensorFlow needed)."""

  def __init__(self, workdir, active: bool = True, tensorboard: bool = True):
    self.workdir = epath.Path(workdir)
    self.active = active
    self._tb = None
    self._path = self.workdir / 'metrics.jsonl'
    # Object stores cannot append: the file is rewritten whole (one atomic upload) per write.
    self._local = workdir_lib.is_local(self.workdir)
    self._lines = None
    if active:
      if tensorboard:
        self._tb = SummaryWriter(str(self.workdir / 'tensorboard'))
      if self._local:
        self._jsonl = open(self._path, 'a')
      else:
        self._lines = self._path.read_text().splitlines(True) if self._path.exists() else []

  def write(self, step: int, scalars: dict) -> None:
    if not self.active:
      return
    clean = {k: _to_float(v) for k, v in scalars.items()}
    line = json.dumps({'step': int(step), **clean}) + '\n'
    if self._local:
      self._jsonl.write(line)
      self._jsonl.flush()
    else:
      self._lines.append(line)
      self._path.write_text(''.join(self._lines))
    if self._tb is not None:
      for k, v in clean.items():
        if v is not None and math.isfinite(v):
          self._tb.add_scalar(k, v, int(step))
      self._tb.flush()

  def write_text(self, step: int, tag: str, text: str) -> None:
    if self.active and self._tb is not None:
      self._tb.add_text(tag, text, int(step))
      self._tb.flush()

  def close(self) -> None:
    if self.active:
      if self._local:
        self._jsonl.close()
      if self._tb is not None:
        self._tb.close()


def _to_float(v):
  if v is None:
    return None
  return float(np.asarray(v))


def write_json(path, payload: dict) -> None:
  """Atomic JSON write (a crash never leaves a half-written file)."""
  workdir_lib.write_json(path, payload)


class MetricsFileError(RuntimeError):
  """A metrics.jsonl line that is not a row, other than a torn last line (exit code 3)."""


def _lines_and_rows(path: epath.Path, raw: bytes) -> tuple[list[str], list[dict | None]]:
  """The lines of metrics.jsonl (`raw`, read from `path`), ends kept, and each line's row (None
  for a blank line).

  A last line that does not parse was cut short by a crash while it was written: it is dropped,
  with a warning naming the file. Any other line that does not parse is an error naming the file
  and the line (a damaged file, not a crash: nothing can tell which rows to trust).
  """
  lines = raw.decode('utf-8', errors='replace').splitlines(True)
  rows = []
  last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
  for number, line in enumerate(lines, 1):
    row, problem = _parse_row(line)
    if problem is None:
      rows.append(row)
    elif number - 1 == last:
      print(f'ctr_jax: warning: {path} line {number}, the last, is cut short ({problem}; a crash '
            'while it was written?): dropped it', file=sys.stderr, flush=True)
      del lines[number - 1:]
      break
    else:
      raise MetricsFileError(f'{path} line {number} is not a metrics row ({problem}); only a '
                             'torn last line is dropped by itself: remove or repair that line')
  return lines, rows


def _parse_row(line: str) -> tuple[dict | None, str | None]:
  """(row, None) for a row or a blank line (None, None); (None, what is wrong) otherwise."""
  if not line.strip():
    return None, None
  try:
    row = json.loads(line)
  except ValueError as e:
    return None, f'{e.msg} at column {e.colno}' if isinstance(e, json.JSONDecodeError) else str(e)
  if not isinstance(row, dict) or not isinstance(row.get('step'), int):
    return None, 'a JSON value without an integer "step"'
  return row, None


def read_metrics(workdir) -> list[dict]:
  path = epath.Path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return []
  return [row for row in _lines_and_rows(path, path.read_bytes())[1] if row is not None]


def drop_rows_after(workdir, step: int) -> int:
  """Drops metrics.jsonl rows past `step` (written after the checkpoint a run resumes from), and
  a torn last line (with a warning; `_lines_and_rows`).

  The kept lines are left byte for byte; the file is replaced atomically. Returns how many rows
  were dropped.
  """
  path = epath.Path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return 0
  original = path.read_bytes()
  lines, rows = _lines_and_rows(path, original)
  kept = [line for line, row in zip(lines, rows) if row is None or row['step'] <= step]
  if kept and not kept[-1].endswith('\n'):  # the next row must start on a line of its own
    kept[-1] += '\n'
  text = ''.join(kept).encode()
  if text != original:
    workdir_lib.write_bytes_atomic(path, text)
  return len(rows) - len(kept)


def plot_curves(workdir) -> str | None:
  """curves.png: training and validation loss against steps."""
  rows = read_metrics(workdir)
  train = [(r['step'], r['train_loss']) for r in rows if r.get('train_loss') is not None]
  val = [(r['step'], r['val_loss']) for r in rows if r.get('val_loss') is not None]
  val_seq = [(r['step'], r['val_loss_sequential']) for r in rows
             if r.get('val_loss_sequential') is not None]
  if not train and not val:
    return None
  # A bare Figure (no pyplot) draws off-screen without switching a notebook's backend.
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for points, label, style in ((train, 'train', '-'), (val, 'validation (parallel K)', 'o-'),
                               (val_seq, 'validation (sequential)', 's--')):
    if points:
      ax.plot(*zip(*points), style, label=label)
  ax.set_xlabel('step')
  ax.set_ylabel('cross-entropy (nats/token)')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  path = epath.Path(workdir) / 'curves.png'
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=100)
  workdir_lib.write_bytes_atomic(path, buffer.getvalue())
  return str(path)


# ------------------------------------------------------------------------------------------------
# Throughput and MFU of the training steps.
# ------------------------------------------------------------------------------------------------


def flops_per_step(config, k_unroll: int) -> float:
  """Model FLOPs of one training step of `config` at K = `k_unroll` (docs/benchmarks.md:
  3 x forward, the unit and its correction K times; BPTT's exact scan counts as K = 1)."""
  k = 1 if config.train.get('mode', 'unroll') == 'bptt' else k_unroll
  per_token = models.training_flops_per_token(config.model, config.data.seq_len, k,
                                              config.train.get('grad_iterations', 0))
  return per_token * config.batch_size * config.data.seq_len


class Throughput:
  """Tokens/s (in all and per device) and MFU of the steps this process ran since the last
  `read`, evaluation time left out (`exclude`).

  MFU = model FLOPs of those steps / (seconds x `peak_flops`, the peak of all `devices`
  together); no `mfu` without a peak. The first window includes compiling the step, so it reads
  low.
  """

  def __init__(self, tokens_per_step: int, devices: int, peak_flops: float | None):
    self.tokens_per_step, self.devices, self.peak_flops = tokens_per_step, devices, peak_flops
    self._reset()

  def _reset(self):
    self._start, self._steps, self._flops = time.perf_counter(), 0, 0.0

  def step(self, flops: float) -> None:
    self._steps += 1
    self._flops += flops

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` (an evaluation between two steps) out of the current window."""
    self._start += seconds

  def read(self) -> dict:
    """{'tokens_per_second', 'tokens_per_second_per_device'[, 'mfu']}; starts a new window."""
    seconds = max(time.perf_counter() - self._start, 1e-9)
    rate = self._steps * self.tokens_per_step / seconds
    out = {'tokens_per_second': rate, 'tokens_per_second_per_device': rate / self.devices}
    if self.peak_flops:
      out['mfu'] = self._flops / (seconds * self.peak_flops)
    self._reset()
    return out


# ------------------------------------------------------------------------------------------------
# Profiler traces (config.profile_steps) in the workdir's TensorBoard directory.
# ------------------------------------------------------------------------------------------------


def profile_range(profile_steps, first_step: int) -> tuple[int, int] | None:
  """`config.profile_steps` as (a, b): trace from after step a to after step b (steps a+1..b).

  '' or '0': no trace. 'A,B' (0 <= A < B): those steps, e.g. '10,20' traces steps 11 to 20.
  'N': N steps from the second step this run takes (the first one compiles), whatever step
  the run starts or resumes at. Raises ValueError naming the field for anything else.
  """
  text = str(profile_steps).strip()
  parts = [p.strip() for p in text.split(',')] if text else []
  try:
    numbers = [int(p) for p in parts]
  except ValueError:
    numbers = None
  if numbers is None or len(numbers) > 2 or any(n < 0 for n in numbers) or (
      len(numbers) == 2 and numbers[0] >= numbers[1]):
    raise ValueError(f"config.profile_steps: got {profile_steps!r}; use '' (off), 'N' (N steps "
                     "after the first) or 'A,B' with 0 <= A < B (steps A+1 to B)")
  if not numbers or numbers == [0]:
    return None
  if len(numbers) == 1:
    return first_step + 1, first_step + 1 + numbers[0]
  return numbers[0], numbers[1]


class Profiler:
  """A jax.profiler trace of the steps `profile_range` names, written to
  `<workdir>/tensorboard/plugins/profile/<time>/` (TensorBoard's profile tab reads it)."""

  def __init__(self, workdir, steps: tuple[int, int] | None, active: bool = True):
    self.directory = str(epath.Path(workdir) / 'tensorboard')
    self.steps = steps if active else None
    self.tracing = False

  def before_step(self, done: int) -> None:
    """Called with the number of steps done before the next one runs."""
    if self.steps and done == self.steps[0] and not self.tracing:
      jax.profiler.start_trace(self.directory)
      self.tracing = True

  def after_step(self, done: int, outputs) -> None:
    if self.tracing and done >= self.steps[1]:
      self.stop(outputs)

  def stop(self, outputs=None) -> None:
    if self.tracing:
      jax.block_until_ready(outputs)  # the traced steps' device work ends inside the trace
      jax.profiler.stop_trace()
      self.tracing = False
