"""GPU benchmark, one device call: the paper's decode pairs at batch 1, training throughput and
MFU of d5_c1120, t12_c768 and t6_c1088 at the paper's batch (64 x 256, K = 5), and the time to
the first token after 512- and 2,048-token prompts (the exact scan, the chunked fixed point and
a transformer's parallel prefill). bfloat16 products with float32 parameters: what
`config.precision='auto'` trains in on a GPU.

  bash launch/bench_gpu.sh                                  # what a GPU machine runs
  python -m ctr_jax.bench --config=configs/bench/gpu.py     # the same without the checks
  bash launch/bench_gpu.sh --smoke                          # every section at toy sizes, CPU

Writes the 'gpu' section of docs/benchmarks.md and docs/benchmarks_gpu.json after every row.
Budgets (seconds, `budget`): the whole run 400 (with the script's checks, Python's start-up and
its `timeout`, under 8 minutes), decode 90, train 130, ttft 180; an item that would overrun its
section is skipped with a note. How the budgets and the priors in `estimates` were derived:
launch/README.md, "The GPU benchmark". `:smoke` (or `:runlocal`) gives toy sizes, no budgets.
"""

from ctr_jax import config_lib
from ctr_jax.bench import configs as bench_configs


def get_config(arg=None):
  args = config_lib.parse_arg(arg, runlocal=False, smoke=False)
  c = bench_configs.get_base('gpu', 'python -m ctr_jax.bench --config=configs/bench/gpu.py')
  c.output = 'docs/benchmarks.md'
  c.sections = 'decode,train,ttft'  # the paper's decode claim first, then the MFU goal
  c.dtype = 'bfloat16'
  c.warmup = 2  # the first includes compilation
  c.repeats = 5
  c.peak_size = 8192
  c.bandwidth_mb = 2048
  c.peer.enabled = False  # the `bench` extra pins the CPU build of torch
  c.goals = {'mfu': 0.45, 'mfu_model': 'd5_c1120', 'decode_vs_paper': ('d5_c1120', 'd1_c2048')}
  c.decode.batches = [1]
  c.decode.prompt_len = 16
  c.decode.new_tokens = 128
  c.decode.matched_model = {}
  c.train = [{'label': name, 'k': k, 'seq_len': 256, 'batch': 64,
              'model': {'name': name, 'vocab_size': 32000, 'max_len': 1024,
                        **({'k_unroll': k} if k else {})}}
             for name, k in (('d5_c1120', 5), ('t12_c768', 0), ('t6_c1088', 0))]
  c.budget.total_s = 400.0
  c.budget.sections.update(decode=90.0, train=130.0, ttft=180.0)
  c.write_partial = True
  if args.runlocal or args.smoke:
    _smoke(c)
  return c


def _smoke(c) -> None:
  """Every section of the GPU run at toy sizes, in seconds on a CPU, no budgets, printed only
  unless --output is given (launch/bench_gpu.sh --smoke writes to a temporary folder)."""
  c.smoke = True
  c.output = ''
  c.warmup = 1
  c.repeats = 1
  c.peak_size = 256
  c.bandwidth_mb = 16
  c.goals.mfu_model = 'd1_c32_h2'
  c.goals.decode_vs_paper = ('d1_c32_h2',)
  toy = {'vocab_size': 64, 'max_len': 64}
  c.decode.pairs = [['d1_c32_h2', 't2_c32_h2']]
  c.decode.prompt_len = 4
  c.decode.new_tokens = 4
  c.decode.vocab_size = 64
  # One training row and one prompt length: on a CPU each compilation, not the toy sizes, is
  # what takes the time.
  c.train = [{'label': 'd1_c32_h2', 'k': 2, 'seq_len': 16, 'batch': 2,
              'model': {'name': 'd1_c32_h2', 'k_unroll': 2, **toy}}]
  c.ttft.update(models=('d1_c32_h2', 't2_c32_h2'), prompt_lens=(12,), vocab_size=64, chunk=8,
                passes=4, warmup=1, repeats=1)
  c.budget.total_s = 0.0
  c.budget.sections.update(decode=0.0, train=0.0, ttft=0.0)
