"""Fields every bench config has (`get_base`) and the toy sizes (`tiny`); the files in
configs/bench/ override them.

Sections (`sections`, comma-separated): train, decode, prefill, scaling.
  train:   one row per entry of `train` ({label, model: model-config fields, k, seq_len, batch});
           the PyTorch peer (`peer`) runs beside the entry labelled `peer.matched_label`.
  decode:  each model of each `decode.pairs` pair at each batch size, paper sizes by name; then
           `decode.matched_model` against the peer's `generate` (marginal ms per token).
  generate: `decode.generate` whole calls at `generate.model` against the peer's whole calls,
           with the marginal figure beside them.
  prefill: `prefill.model` on a `prefill.prompt_len` prompt, sequential vs parallel fixed point.
  chunked: each `chunked.sizes` model (random weights), then the trained run in
           `chunked.checkpoint` (a workdir, '' = none): the scan vs chunked prefill per chunk
           size and pass count, plus the tolerance mode, at most `chunked.tolerance_passes`
           passes (configs/bench/prefill_cpu.py).
  ttft:    time to the first token of each `ttft.models` model (random weights) after a random
           prompt of each `ttft.prompt_lens` length, by each of its kind's `ttft.methods`
           (configs/bench/gpu.py).
  scaling: training step time against K and T (`scaling.train_model`) and batch-1 decode time
           against the context length (`scaling.decode_model`).
"""

import ml_collections

# The paper's A100 bf16 batch-1 decode latencies (reference section 6).
PAPER_DECODE_MS = {'d5_c1120': 2.86, 't12_c768': 4.96, 'd1_c2048': 1.09, 't6_c1088': 2.85}
PAPER_PAIRS = [['d5_c1120', 't12_c768'], ['d1_c2048', 't6_c1088']]


def get_base(name: str, command: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = name
  c.command = command
  c.output = ''
  # Issue 20's goals; the report prints one met / not met line for each goal it measured.
  c.goals = ml_collections.ConfigDict({'train_vs_peer': 1.05, 'generate_vs_peer': 3.0,
                                       'chunked_vs_scan': 3.0, 'chunked_size': 'd5_c1120',
                                       'chunked_max_logit_diff': 1e-3})
  c.sections = 'train,decode,generate,prefill,scaling'
  c.dtype = 'float32'
  c.warmup = 2
  c.repeats = 5
  c.peak_size = 2048
  c.bandwidth_mb = 512
  c.train = []
  c.peer = ml_collections.ConfigDict({
      'enabled': True, 'width': 512, 'depth': 6, 'heads': 8, 'vocab': 4096, 'seq_len': 256,
      'batch': 8, 'matched_label': 't6_c512 (peer shape)', 'rounds': 7})
  c.decode = ml_collections.ConfigDict({
      'pairs': PAPER_PAIRS, 'batches': [1, 8], 'prompt_len': 16, 'new_tokens': 64,
      'vocab_size': 32000, 'paper_ms': PAPER_DECODE_MS, 'matched_model': peer_shape()})
  # decode.generate(model, variables, prompt[:B, :8], 128, rng) at the peer's shape.
  c.generate = ml_collections.ConfigDict({'model': peer_shape(), 'batches': [1, 8],
                                          'prompt_len': 8, 'new_tokens': 128})
  c.prefill = ml_collections.ConfigDict({
      'model': {'kind': 'context_ready', 'width': 256, 'depth': 2, 'num_heads': 4,
                'vocab_size': 4096, 'max_len': 1024},
      'prompt_len': 512, 'tolerance': 1e-4})
  c.chunked = ml_collections.ConfigDict({
      # Tuples, so that a command line can override them: --config.chunked.chunks='(32, 64)'.
      'sizes': ('d2_c256', 'd5_c1120', 'd1_c2048'), 'vocab_size': 32000, 'prompt_len': 512,
      'chunks': (16, 32, 64, 128, 256), 'passes': (1, 2, 3, 4, 8), 'tolerance': 1e-4,
      'tolerance_passes': 16, 'checkpoint': ''})
  c.ttft = ml_collections.ConfigDict({
      'models': ('d5_c1120', 't12_c768', 'd1_c2048', 't6_c1088'), 'prompt_lens': (512, 2048),
      'vocab_size': 32000, 'chunk': 256, 'passes': 16, 'tolerance': 1e-4, 'warmup': 1,
      'repeats': 3,
      'methods': {'context_ready': ('scan', 'chunked'), 'transformer': ('parallel',)}})
  # Seconds for the whole run and for each section, from its start (0 = no limit): an item whose
  # estimate would overrun is skipped with a note (runner, `budget`). The estimates' priors are
  # `estimates`; after the first item of a kind they are scaled by what it took.
  c.budget = ml_collections.ConfigDict({
      'total_s': 0.0,
      'sections': {name: 0.0 for name in ('train', 'decode', 'generate', 'prefill', 'chunked',
                                          'ttft', 'scaling')}})
  c.estimates = ml_collections.ConfigDict({
      'train_compile_s': 45.0, 'decode_compile_s': 20.0, 'ttft_compile_s': 15.0,
      'decode_step_ms': 5.0, 'mfu': 0.3})
  # Write the section and the json after every row (a run stopped from outside keeps them).
  c.write_partial = False
  c.smoke = False  # toy sizes of a config meant for an accelerator: the report says so
  c.scaling = ml_collections.ConfigDict({
      'train_model': {'kind': 'context_ready', 'width': 256, 'depth': 2, 'num_heads': 4,
                      'vocab_size': 4096, 'max_len': 1024},
      'batch': 8, 'seq_lens': [64, 128, 256, 512], 'k_values': [1, 2, 4, 8],
      'decode_model': {'kind': 'transformer', 'width': 512, 'depth': 6, 'num_heads': 8,
                       'vocab_size': 4096, 'max_len': 4200},
      'contexts': [256, 512, 1024, 2048, 4096], 'new_tokens': 32})
  return c


def peer_shape(**overrides) -> dict:
  """Our baseline at the peer's shape: C=512, N=6, 8 heads, V=4096; tanh-GELU as GPT-2's."""
  return {'kind': 'transformer', 'width': 512, 'depth': 6, 'num_heads': 8, 'vocab_size': 4096,
          'max_len': 1024, 'activation': 'gelu_tanh', **overrides}


def tiny() -> ml_collections.ConfigDict:
  """Every bench section at toy sizes, in about a minute on a CPU (configs/bench/tiny.py)."""
  c = get_base('tiny', 'python -m ctr_jax.bench --config=configs/bench/tiny.py')
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
