"""The two language models: the baseline transformer and the context-ready transformer.

One `__call__` serves every mode:
  model.apply(v, tokens)                          -> logits [B, T, V]        (training / eval)
  model.apply(v, tokens, return_aux=True)         -> (logits, aux)           (losses, diagnostics)
  model.apply(v, tokens, decode_state=state)      -> (logits, new_state)     (prefill / step decode)
`k_unroll` sets K (the transformer ignores it) and `remat` names what the backward pass of the
parallel forward recomputes instead of storing: 'none', 'iteration' (each fixed-point iteration),
'layer' (each block), 'matmuls' (each block but its weight products); `ctr_jax.ops.recurrence.REMAT`.
True and False mean 'iteration' and 'none'.

The stages are methods, so code outside the forward runs them by name, e.g.
`model.apply(v, c, e, positions, method='iterate')` (ctr_jax.inference.decode.parallel_prefill and
chunked_prefill):
`embed_tokens`, `logits`, and for the context-ready model `iterate` (one fixed-point pass),
`correct` and `feedback`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from ctr_jax.models import blocks, families, layers
from ctr_jax.models.config import ModelSpec
from ctr_jax.ops.recurrence import DecodeState, fixed_point_unroll, remat_name, shift_right


class _LanguageModelBase(nn.Module):
  """Embedding, final norm and head shared by both kinds.

  The block family's traits (class attributes in ctr_jax.models.blocks) decide the final norm,
  the head's bias and the embedding scale; `tie_embeddings` reads the logits off the embedding
  table instead of a head.
  """
  spec: ModelSpec

  def setup_common(self):
    s = self.spec
    table_init = lambda rows: nn.with_logical_partitioning(layers.embedding_init(s),
                                                           (rows, 'embed'))
    self.embed = nn.Embed(s.vocab_size, s.width, embedding_init=table_init('vocab'),
                          dtype=layers.compute_dtype(s), param_dtype=layers.param_dtype(s))
    if s.positions == 'learned':
      self.pos_embed = nn.Embed(s.max_len, s.width, embedding_init=table_init('position'),
                                dtype=layers.compute_dtype(s), param_dtype=layers.param_dtype(s))
    self.blocks = blocks.BlockStack(s)
    self.ln_f = layers.norm(s)
    if not s.tie_embeddings:
      self.head = layers.dense(s, s.vocab_size, ('embed', 'vocab'),
                               use_bias=families.traits(s.block).head_bias,
                               fan_in=s.width)
    self.drop = nn.Dropout(s.dropout)

  def embed_tokens(self, tokens, deterministic, positions=None):
    """Token (and learned position) embeddings; `positions` [T] or [B, T], default 0..T-1."""
    e = self.embed(tokens)
    scale = layers.embed_scale(self.spec)
    if scale != 1.0:
      # Rounded to the compute dtype first, as Gemma's reference code does.
      e = e * jnp.asarray(scale, e.dtype)
    if self.spec.positions == 'learned':
      e = e + self.pos_embed(jnp.arange(tokens.shape[1]) if positions is None else positions)
    return self.drop(e, deterministic=deterministic)

  def logits(self, z):
    h = self.ln_f(z)
    if self.spec.tie_embeddings:
      # The table [V, C] is an [out, in] weight: `layers.linear` gives the tied head the same
      # product paths (few rows, bfloat16) as an untied one, which `nn.Embed.attend` would not.
      out = layers.linear(h, {'weight': self.embed.embedding}, self.embed.dtype)
    else:
      out = self.head(h)
    return out.astype(layers.accumulation_dtype(out.dtype))

  @nn.nowrap
  def init(self, *args, **kwargs):
    """`nn.Module.init` with plain arrays. Every parameter is created with its logical axis
    names (`nn.with_logical_partitioning`); `init_with_output` keeps those boxes, which is what
    `ctr_jax.training.sharding.param_axes` reads, and this unboxes them so the tree holds arrays."""
    return nn.meta.unbox(super().init(*args, **kwargs))

  # ----------------------------------------------------------------------------------------------
  # Stages of one layer, for code that runs the model layer by layer (ctr_jax.implicit):
  # model.apply(variables, layer, ..., method='layer_attend'). Layer i's output is
  # v + mlp_branch(layer_mlp_input(x, v)) with (v, cache) = layer_attend(x, ...).
  # ----------------------------------------------------------------------------------------------

  def layer_attend(self, layer: int, x, positions, cache=None, cache_index=None):
    """(v, new cache): the residual after layer `layer`'s attention sub-layer (no dropout)."""
    return self.blocks.layers[layer].attend(x, positions, cache, cache_index)

  def layer_mlp_input(self, layer: int, x, v):
    """The normalised input of layer `layer`'s MLP, from its input x and its v."""
    return self.blocks.layers[layer].mlp_input(x, v)


class TransformerLM(_LanguageModelBase):
  """Token embedding, N pre-LN RoPE blocks, final LayerNorm, untied head with bias."""

  def setup(self):
    self.setup_common()

  def __call__(self, tokens, *, k_unroll=None, remat: str | bool = 'none',
               decode_state: DecodeState | None = None, deterministic: bool = True,
               return_aux: bool = False, positions=None):
    """`positions` ([T] or [B, T], default 0..T-1) runs `tokens` alone at those absolute
    positions (e.g. a query without its context); decode states bring their own. A
    transformer has no unroll: 'iteration' remat changes nothing, 'layer' and 'matmuls' apply
    to its blocks."""
    del k_unroll
    remat = remat_name(remat)
    t = tokens.shape[1]
    if decode_state is not None:
      positions = decode_state.index + jnp.arange(t)
      e = self.embed_tokens(tokens, deterministic, positions)
      z, caches = self.blocks(e, positions, decode_state.caches, decode_state.index,
                              deterministic)
      new_state = decode_state.replace(caches=caches, index=decode_state.index + t)
      return self.logits(z), new_state
    positions = jnp.arange(t) if positions is None else positions
    e = self.embed_tokens(tokens, deterministic, positions)
    z, _ = self.blocks(e, positions, deterministic=deterministic, remat=remat)
    logits = self.logits(z)
    if return_aux:
      return logits, {'convergence_loss': jnp.zeros((), jnp.float32)}
    return logits


class Correction(nn.Module):
  """The correction network and its ablations; input: feedback of position t-1 and e_t.

  add         c = CorrFFN(LN_c(z_{t-1} + e_t))      (the paper)
  token_blind c = CorrFFN(LN_c(z_{t-1}))
  concat      c = CorrFFN(LN_c([z_{t-1}; e_t]))     (first layer reads 2C: 12C^2, as the author's
                                                     36C^2-at-D=2 accounting implies)
  tied        c = FFN_last_block(LN_c(z_{t-1} + e_t))
  none        c = z_{t-1} - u_{t-1}                 (block delta: weight sharing only, no FFN)
  """
  spec: ModelSpec

  def setup(self):
    kind = self.spec.correction
    if kind != 'none':
      self.ln = layers.layer_norm(self.spec)
    if kind in ('add', 'token_blind', 'concat'):
      self.ffn = layers.Mlp(self.spec)

  def ffn_input(self, feedback, e):
    """The normalised input of CorrFFN (variants 'add', 'token_blind', 'concat')."""
    kind = self.spec.correction
    if kind == 'token_blind':
      return self.ln(feedback)
    if kind == 'concat':
      return self.ln(jnp.concatenate([feedback, e], axis=-1))
    return self.ln(feedback + e)

  def __call__(self, feedback, e, tied_mlp=None):
    kind = self.spec.correction
    if kind == 'none':
      return feedback
    if kind == 'tied':
      return tied_mlp(self.ln(feedback + e))
    return self.ffn(self.ffn_input(feedback, e))


class ContextReadyLM(_LanguageModelBase):
  """The context-ready transformer: a D-layer unit fed with e_t + CorrFFN(LN(z_{t-1} + e_t))."""

  def setup(self):
    self.setup_common()
    self.correction = Correction(self.spec)

  def correct(self, feedback, e):
    tied = self.blocks.layers[-1].mlp if self.spec.correction == 'tied' else None
    return self.correction(feedback, e, tied)

  def correction_input(self, feedback, e):
    """The normalised input of the correction FFN (a stage for ctr_jax.implicit)."""
    return self.correction.ffn_input(feedback, e)

  def feedback(self, z, u):
    """What position t hands to t+1: z_t (or the block delta for correction='none')."""
    return z - u if self.spec.correction == 'none' else z

  def __call__(self, tokens, *, k_unroll=None, remat: str | bool = 'none',
               decode_state: DecodeState | None = None, deterministic: bool = True,
               return_aux: bool = False, initial_correction=None):
    """`initial_correction` [B, T, C] starts the unroll from c^(0) = it instead of 0 (the
    truncated-gradient recipe runs the first iterations without gradients, then these)."""
    if decode_state is not None:
      return self._step(tokens, decode_state, deterministic)
    return self._parallel(tokens, k_unroll or self.spec.k_unroll, remat_name(remat),
                          deterministic, return_aux, initial_correction)

  def correction_after(self, tokens, k_unroll: int, deterministic: bool = True):
    """c^(k_unroll) [B, T, C], the correction after `k_unroll` fixed-point iterations."""
    return self._unroll(tokens, k_unroll, 'none', deterministic, None)[0][0]

  def iterate(self, c, e, positions, *, u_prev=None, caches=None, cache_index=None,
              first_feedback=None, deterministic=True, remat: str = 'none'):
    """One fixed-point pass over all positions: u = e + c, z = Unit(u), c' = Correct(shift(z), e).

    c, e [B, T, C]: the current correction and the embeddings; `u_prev` (the last pass's block
    input) makes it the cumulative ablation's u = u_prev + c. With `caches` the unit writes
    every position's keys and values from slot `cache_index` (default 0: the parallel prefill)
    and its queries also read the slots before it (the chunked prefill). `first_feedback` [B, C]
    is the feedback position 0 reads (default 0: the sequence starts here; a later chunk passes
    the previous chunk's last one). `remat` 'layer' / 'matmuls' recomputes each block in the
    backward pass. Returns (c' [B, T, C], u, z, the written caches or None).
    """
    u = (e if u_prev is None else u_prev) + c
    if caches is not None and cache_index is None:
      cache_index = jnp.zeros((), jnp.int32)
    z, caches = self.blocks(u, positions, caches, cache_index, deterministic, remat)
    feedback = shift_right(self.feedback(z, u), first_feedback)
    return self.correct(feedback, e), u, z, caches

  def _unroll(self, tokens, k_unroll, remat, deterministic, initial_correction):
    """K fixed-point iterations over all positions: c^(0) = 0 (or given), u^(k) = e + c^(k-1).
    Returns ((c^(K), u^(K), z^(K)), per-iteration change statistics, e)."""
    e = self.embed_tokens(tokens, deterministic)
    positions = jnp.arange(tokens.shape[1])
    cumulative = self.spec.cumulative

    def iteration(mdl, carry):
      c, u_prev, _ = carry
      c_next, u, z, _ = mdl.iterate(c, e, positions, u_prev=u_prev if cumulative else None,
                                    deterministic=deterministic, remat=remat)
      change = (c_next - c).astype(jnp.float32)
      stats = {'change_max': jnp.max(jnp.abs(change)),
               'change_rms': jnp.sqrt(jnp.mean(jnp.square(change)))}
      return (c_next, u, z), stats

    zeros = jnp.zeros_like(e)
    c0 = zeros if initial_correction is None else initial_correction.astype(e.dtype)
    carry, stats = fixed_point_unroll(self, iteration, (c0, e, zeros), k_unroll,
                                      remat=remat == 'iteration')
    return carry, stats, e

  def _parallel(self, tokens, k_unroll, remat, deterministic, return_aux, initial_correction):
    (c, u, z), stats, e = self._unroll(tokens, k_unroll, remat, deterministic,
                                       initial_correction)
    cumulative = self.spec.cumulative
    logits = self.logits(z)
    if not return_aux:
      return logits
    # Convergence term: the block input the next iteration would see vs the last one (detached).
    u_next = (u if cumulative else e) + c
    diff = (u_next - jax.lax.stop_gradient(u)).astype(jnp.float32)
    aux = {'convergence_loss': jnp.mean(jnp.square(diff)),
           'change_max': stats['change_max'], 'change_rms': stats['change_rms']}
    return logits, aux

  def _step(self, tokens, state: DecodeState, deterministic):
    """One exact streaming step for a single new token per sequence: tokens [B, 1]."""
    if tokens.shape[1] != 1:
      raise ValueError('the context-ready model decodes one position at a time; use '
                       'ctr_jax.inference.decode.prefill for a prompt')
    if self.spec.cumulative:
      raise ValueError('model.cumulative=True has no exact sequential form (it is the ablation '
                       'that breaks streaming equivalence); evaluate it in parallel mode')
    e = self.embed_tokens(tokens, deterministic, state.index[None])
    u = e + self.correct(state.feedback[:, None].astype(e.dtype), e)
    z, caches = self.blocks(u, state.index[None], state.caches, state.index, deterministic)
    new_state = state.replace(caches=caches, feedback=self.feedback(z, u)[:, 0],
                              index=state.index + 1)
    return self.logits(z), new_state
