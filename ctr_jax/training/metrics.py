"""What a user sees in the workdir: metrics.jsonl, TensorBoard events, curves.png, summary.json.

Only process 0 writes; other processes get a writer whose methods do nothing. Files go through
`etils.epath`, so a `gs://` workdir works like a local one with the `.[gcs]` extra installed
(gcsfs for epath, google-cloud-storage for the TensorBoard events; ctr_jax/training/workdir.py).
"""

import io
import json
import math

from etils import epath
from matplotlib.figure import Figure
import numpy as np
from tensorboardX import SummaryWriter

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


def read_metrics(workdir) -> list[dict]:
  path = epath.Path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def drop_rows_after(workdir, step: int) -> int:
  """Drops metrics.jsonl rows past `step` (written after the checkpoint a run resumes from).

  The kept lines are left byte for byte; the file is replaced atomically. Returns how many rows
  were dropped.
  """
  path = epath.Path(workdir) / 'metrics.jsonl'
  if not path.exists():
    return 0
  lines = path.read_text().splitlines(True)
  kept = [l for l in lines if not l.strip() or json.loads(l)['step'] <= step]
  if len(kept) != len(lines):
    workdir_lib.write_bytes_atomic(path, ''.join(kept).encode())
  return len(lines) - len(kept)


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
