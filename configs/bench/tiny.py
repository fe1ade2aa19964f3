"""Every bench section at toy sizes, in about a minute on a CPU: the test suite's smoke run and
the syntax check of launch/bench_gpu.sh. `:runlocal` (accepted by every config) changes nothing.

  python -m ctr_jax.bench --config=configs/bench/tiny.py --output=/tmp/ctr_bench/benchmarks.md
"""

from configs.bench import base
from ctr_jax import config_lib


def get_config(arg=None):
  config_lib.parse_arg(arg, runlocal=False)  # runlocal: already toy sizes, no change
  c = base.get_base('tiny', 'python -m ctr_jax.bench --config=configs/bench/tiny.py')
  c.warmup = 1
  c.repeats = 1
  c.peak_size = 256
  c.bandwidth_mb = 16
  tiny = {'width': 32, 'num_heads': 2, 'vocab_size': 64, 'max_len': 64}
  c.train = [{'label': 't2_c32', 'k': 0, 'seq_len': 16, 'batch': 2,
              'model': {'kind': 'transformer', 'depth': 2, **tiny}},
             {'label': 'd1_c32', 'k': 2, 'seq_len': 16, 'batch': 2,
              'model': {'kind': 'context_ready', 'depth': 1, 'k_unroll': 2, **tiny}},
             {'label': 'd1_c32', 'k': 2, 'm': 1, 'seq_len': 16, 'batch': 2,
              'model': {'kind': 'context_ready', 'depth': 1, 'k_unroll': 2, **tiny}}]
  c.peer.update(width=32, depth=2, heads=2, vocab=64, seq_len=16, batch=2,
                matched_label='t2_c32')
  c.peer.enabled = False
  c.decode.pairs = [['d1_c32_h2', 't2_c32_h2']]
  c.decode.batches = [1, 2]
  c.decode.prompt_len = 4
  c.decode.new_tokens = 4
  c.decode.vocab_size = 64
  c.decode.matched_model = {}
  c.generate.update(model={'kind': 'transformer', 'depth': 2, **tiny}, batches=[1],
                    prompt_len=4, new_tokens=4)
  c.prefill.model = {'kind': 'context_ready', 'depth': 1, **tiny}
  c.prefill.prompt_len = 12
  c.chunked.sizes = ('d1_c32_h2',)
  c.chunked.vocab_size = 64
  c.chunked.prompt_len = 10
  c.chunked.chunks = (3, 4)
  c.chunked.passes = (1, 4)
  c.chunked.tolerance_passes = 4
  c.scaling.train_model = {'kind': 'context_ready', 'depth': 1, **tiny}
  c.scaling.batch = 2
  c.scaling.seq_lens = [8, 16]
  c.scaling.k_values = [1, 2]
  c.scaling.decode_model = {'kind': 'transformer', 'depth': 1, **tiny}
  c.scaling.contexts = [8, 16]
  c.scaling.new_tokens = 4
  return c
