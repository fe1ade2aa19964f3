"""What a user sees in the workdir: metrics.jsonl, TensorBoard events, curves.png, summary.json.

Only process 0 writes; other processes get a writer whose methods do nothing.
"""

import json
import math
import os

import numpy as np


class MetricWriter:
  """JSON lines plus TensorBoard scalars (tensorboardX: no TensorFlow needed)."""

  def __init__(self, workdir: str, active: bool = True):
    self.workdir = workdir
    self.active = active
    self._tb = None
    if active:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'))
      self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a')

  def write(self, step: int, scalars: dict) -> None:
    if not self.active:
      return
    clean = {k: _to_float(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({'step': int(step), **clean}) + '\n')
    self._jsonl.flush()
    for k, v in clean.items():
      if v is not None and math.isfinite(v):
        self._tb.add_scalar(k, v, int(step))
    self._tb.flush()

  def write_text(self, step: int, tag: str, text: str) -> None:
    if self.active:
      self._tb.add_text(tag, text, int(step))
      self._tb.flush()

  def close(self) -> None:
    if self.active:
      self._jsonl.close()
      self._tb.close()


def _to_float(v):
  if v is None:
    return None
  return float(np.asarray(v))


def write_json(path: str, payload: dict) -> None:
  """Atomic JSON write (a crash never leaves a half-written file)."""
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    json.dump(payload, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


def read_metrics(workdir: str) -> list[dict]:
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_curves(workdir: str) -> str | None:
  """curves.png: training and validation loss against steps."""
  rows = read_metrics(workdir)
  train = [(r['step'], r['train_loss']) for r in rows if r.get('train_loss') is not None]
  val = [(r['step'], r['val_loss']) for r in rows if r.get('val_loss') is not None]
  val_seq = [(r['step'], r['val_loss_sequential']) for r in rows
             if r.get('val_loss_sequential') is not None]
  if not train and not val:
    return None
  # A bare Figure (no pyplot) draws off-screen without switching a notebook's backend.
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
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
  path = os.path.join(workdir, 'curves.png')
  fig.savefig(path, dpi=100)
  return path
