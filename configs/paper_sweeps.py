"""The paper's sweeps (width / depth / K / block size) as lists of runs of the paper configs.

Print the commands of one sweep, one run per line, to paste into a cluster queue:

  python -m ctr_jax.projects.print_sweep configs/paper_sweeps.py table1 --workdir_root=/shared/work

`get_config(arg)` returns the base run (D=5, C=1120), so this file also runs directly:

  python -m ctr_jax.main --config=configs/paper_sweeps.py --workdir=$WORKDIR

and each `sweep_*` function calls
`add(config=..., arg=..., **overrides)` once per run, where `config` names a file in configs/ and
overrides are `--config.` flags.

Sweeps (reference sections 6.2-6.5, 6.9):
  table1      cross-width grid at ~85M block FLOPs (Table 1, small scale): D=1/3/5/6/11 vs
              N=2/4/6/12 transformers.
  k           training K with random depth k_min=2 (K = 2, 3, 5, 10) and fixed K, for D=5 C=1120.
  width       width scaling, block 64: D=2 (converted or from scratch) vs N=2 at C = 256, 512,
              1024 with 4/8/16 heads and Chinchilla-matched steps (reference section 6.4).
  block_size  D=1 C=2048 vs N=2 C=1888 at block 64, 256, 512 and 1024 (section 6.9).
"""

from ctr_jax import config_lib

TABLE1 = ('d1_c2048', 'd3_c1408', 'd5_c1120', 'd6_c1024', 'd11_c768',
          't2_c1888', 't4_c1344', 't6_c1088', 't12_c768')


def get_config(arg=None):
  return config_lib.paper_config('d5_c1120', arg)


def sweep_table1(add):
  for name in TABLE1:
    add(config=f'{name}.py')


def sweep_k(add):
  for k in (2, 3, 5, 10):
    add(config='d5_c1120.py', **{'model.k_unroll': k, 'train.k_min': min(2, k)})
  add(config='d5_c1120.py', **{'model.k_unroll': 5, 'train.k_min': 0})


def sweep_width(add):
  # (width, heads, batch, steps): the reference's recipe (section 6.4), ~20 tokens/parameter at
  # block 64: C = 256 batch 1024 x 7,629 (500M tokens), C = 512 batch 512 x 27,466 (900M),
  # C = 1024 batch 1024 x 18,750 (1,227M).
  for width, heads, batch, steps in ((256, 4, 1024, 7629), (512, 8, 512, 27466),
                                     (1024, 16, 1024, 18750)):
    common_overrides = {'data.seq_len': 64, 'batch_size': batch, 'total_steps': steps,
                        'model.num_heads': heads, 'model.width': width}
    add(config='t2_c1888.py', **common_overrides)
    add(config='d5_c1120.py', **common_overrides, **{'model.depth': 2})


def sweep_block_size(add):
  for block, batch in ((64, 256), (256, 64), (512, 32), (1024, 16)):
    for name in ('d1_c2048_k10.py' if block == 1024 else 'd1_c2048.py', 't2_c1888.py'):
      add(config=name, **{'data.seq_len': block, 'batch_size': batch})


SWEEPS = {'table1': sweep_table1, 'k': sweep_k, 'width': sweep_width,
          'block_size': sweep_block_size}
