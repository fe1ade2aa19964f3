r"""An independent PyTorch trainer for pointer chasing: is the plateau in our task or in our stack?

Every transformer we trained in JAX stops at the same place (docs/pointer_chasing.md): the
level-0 keys right, the level-1 keys at chance, although two layers can represent them. This
script trains the author's baseline as his code describes it (reference 7.3: an N-layer pre-LN
RoPE transformer, PyTorch's default initialisation, Adam 1e-3, clipping 1.0, batch 64, width
128, 4 heads, cross-entropy on the target positions) written from scratch in PyTorch, on the very
same examples (`ctr_jax.data.pointer_chasing.batch`). If it learns what ours does not, the
difference is in our model or trainer; if it stops where ours stops, it is in the task.

  python -m ctr_jax.projects.pointer_chasing.torch_check --hops=2 --layers=2 --encoding=tables --steps=3000

Prints the per-level accuracy at every evaluation (256 fresh examples from the evaluation
stream) and, with --out, writes a json with the command and the curve. Needs torch (the
`bench` extra).
"""

import argparse
import json
import math
import os
import shlex
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

from ctr_jax.data import pointer_chasing as pc


def rope_tables(seq_len: int, head_dim: int, base: float = 10000.0):
  inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
  angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv_freq[None]
  return torch.cos(angles), torch.sin(angles)


def rotate(x, cos, sin):
  """Rotates the (first half, second half) pairs of the last axis by the position's angles."""
  half = x.shape[-1] // 2
  x1, x2 = x[..., :half], x[..., half:]
  return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):

  def __init__(self, width: int, heads: int, use_rope: bool):
    super().__init__()
    self.heads, self.use_rope = heads, use_rope
    self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
    self.qkv = nn.Linear(width, 3 * width)
    self.proj = nn.Linear(width, width)
    self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

  def forward(self, x, cos, sin):
    b, t, c = x.shape
    q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
    q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
    if self.use_rope:
      q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
    return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):

  def __init__(self, vocab: int, seq_len: int, width: int, heads: int, layers: int,
               use_rope: bool):
    super().__init__()
    self.embed = nn.Embedding(vocab, width)
    self.blocks = nn.ModuleList(Block(width, heads, use_rope) for _ in range(layers))
    self.ln_f = nn.LayerNorm(width)
    self.head = nn.Linear(width, vocab)
    cos, sin = rope_tables(seq_len, width // heads)
    self.register_buffer('cos', cos, persistent=False)
    self.register_buffer('sin', sin, persistent=False)

  def forward(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x, self.cos, self.sin)
    return self.head(self.ln_f(x))


def level_accuracy(model, hops: int, encoding: str, examples: int) -> dict[str, float]:
  tokens, targets = pc.batch(hops, examples, pc.EVAL_SEED, encoding=encoding)
  labels = pc.position_labels(hops, encoding)
  with torch.no_grad():
    pred = model(torch.from_numpy(tokens).long()).argmax(-1).numpy()
  right = pred == targets
  scored = pc.QUERY_KEY if encoding != 'tables' else pc.TABLE_KEY
  out = {}
  for lvl in range(hops):
    cols = (labels.kind == scored) & (labels.level == lvl)
    out[f'L{lvl}'] = float(right[:, cols].mean())
  out['final'] = float(right[:, labels.kind == pc.FINAL_QUERY].mean())
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--hops', type=int, default=2)
  parser.add_argument('--layers', type=int, default=2)
  parser.add_argument('--encoding', default='tables', choices=pc.ENCODINGS)
  parser.add_argument('--steps', type=int, default=3000)
  parser.add_argument('--width', type=int, default=128)
  parser.add_argument('--heads', type=int, default=4)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--lr', type=float, default=1e-3)
  parser.add_argument('--no_rope', action='store_true')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--eval_every', type=int, default=250)
  parser.add_argument('--eval_examples', type=int, default=256)
  parser.add_argument('--threads', type=int, default=1)
  parser.add_argument('--out', default='')
  args = parser.parse_args(argv)
  torch.manual_seed(args.seed)
  torch.set_num_threads(args.threads)
  seq_len = pc.seq_len(args.hops, args.encoding)
  model = Transformer(pc.vocab_size(args.hops), seq_len, args.width, args.heads, args.layers,
                      not args.no_rope)
  opt = torch.optim.Adam(model.parameters(), lr=args.lr)
  curve, start = [], time.time()
  for step in range(1, args.steps + 1):
    tokens, targets = pc.batch(args.hops, args.batch, args.seed, start=(step - 1) * args.batch,
                               encoding=args.encoding)
    logits = model(torch.from_numpy(tokens).long())
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           torch.from_numpy(targets).long().reshape(-1), ignore_index=pc.IGNORE)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % args.eval_every == 0 or step == args.steps:
      acc = level_accuracy(model, args.hops, args.encoding, args.eval_examples)
      row = dict(step=step, loss=round(loss.item(), 4), minutes=round((time.time() - start) / 60, 2),
                 **{k: round(v, 3) for k, v in acc.items()})
      curve.append(row)
      print(json.dumps(row), flush=True)
      if not math.isfinite(loss.item()):
        break
  final = level_accuracy(model, args.hops, args.encoding, 1024)
  print('final (1,024 examples):', json.dumps({k: round(v, 3) for k, v in final.items()}))
  if args.out:
    tmp = args.out + '.tmp'
    with open(tmp, 'w') as f:
      shown = sys.argv[1:] if argv is None else argv
      command = 'python ' + shlex.join(['-m', 'ctr_jax.projects.pointer_chasing.torch_check', *shown])
      json.dump(dict(command=command, torch=torch.__version__,
                     final=final, curve=curve), f, indent=1)
    os.replace(tmp, args.out)


if __name__ == '__main__':
  main()
