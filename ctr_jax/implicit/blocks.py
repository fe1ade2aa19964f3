"""The MLP half of every block family, run with a patch or computing one.

`mlp_half(spec, params, v, z, ...)` returns the block output v + branch(z) for all positions
(the attention half, v = attend(x) and z = mlp_input(x, v), comes from the flax module). Given a
`target` (the full-context record of this layer at the query's last position) it first computes
the layer's patch from the *actual* reduced-pass values at that position, then applies it, so the
next layer sees what the patched layer really produces. Notation: z is the normalised MLP input,
z_C its value with context, v / v_C the residual after attention, a the MLP hidden activation,
f = N(h) Gemma's unscaled post-MLP activation and m = 1 + w its post-norm scale.

Per family (method 'direct'):
  gemma   ΔW_gate, ΔW_up (input side);  Δm = (v_C − v) ⊘ f on the post-MLP norm scale
  llama   ΔW_gate, ΔW_up;  ΔW_down = (v_C − v) a^T / ‖a‖²
  moe     ΔW_router and every expert's ΔW_gate, ΔW_up;  active experts j: ΔW_down^j =
          (v_C − v)/S a_j^T / ‖a_j‖² with S = Σ_active s_j as computed
  falcon  (parallel block, MLP input free of context) ΔW_out = Δy a^T / ‖a‖², Δy = out_C − out
  gpt     ΔW_fc (input side);  Δb_proj = v_C − v
Method 'stable' changes Gemma only (the others have no post-norm): the branch target g = out_C − v
is projected onto what RMSNorm can output (ctr_jax.implicit.stable), realised by a rank-1
ΔW_down, and Δm = (g − m ⊙ f) ⊘ f is the remainder. Exact zeros of f or ‖z‖, ‖a‖ are divided by
one instead (the paper's guard).
"""

from typing import Any

import jax
import jax.numpy as jnp

from ctr_jax.implicit import patches, stable
from ctr_jax.models import layers

METHODS = ('direct', 'stable')


def _last(a):
  return a[:, -1]


def mlp_half(spec, params, v, z, *, mode: str, patch: dict | None = None,
             target: dict | None = None, method: str = 'direct', active=1.0):
  """Block output [B, T, C] and this layer's patch (given, computed from `target`, or None).

  `target` holds the layer's full-context v, z, out (and h) at the query's last position;
  `active` (0 or 1) switches the computed patch off below the first patched layer. Returns
  (out, patch, record) where record holds last-position intermediates (a, h, f, gates) and
  method diagnostics (dm_max and where it sits: dm_channel, dm_f, dm_h, dm_numerator, dm_scale,
  rms_h, min_abs_f; the stable update's constraint, hard_case, mu).
  """
  fn = _FAMILIES[spec.block]
  return fn(_Ctx(spec, params, mode, patch, target, method, active), v, z)


class _Ctx:
  """What one layer's MLP computation needs; `take` reads a patch leaf if a patch is given."""

  def __init__(self, spec, params, mode, patch, target, method, active):
    self.spec, self.p, self.mode = spec, params, mode
    self.given, self.target, self.method, self.active = patch, target, method, active
    self.dtype = layers.compute_dtype(spec)
    self.acc = layers.accumulation_dtype(self.dtype)
    self.act = layers.ACTIVATIONS[layers.activation_name(spec)]
    self.new: dict[str, Any] = {}

  def take(self, *path):
    node = self.given
    for key in path:
      if node is None or key not in node:
        return None
      node = node[key]
    return node

  def matrix(self, *module_path):
    """(patch path, [in, out] view) of the dense layer at `module_path` in these params; the
    path ends with the matrix's own name ('weight' or 'kernel'), as the parameter tree does."""
    node = self.p
    for key in module_path:
      node = node[key]
    return module_path + (layers.matrix_name(node),), layers.dense_matrix(node)

  def put(self, value, *path):
    """Records a computed patch leaf, switched off for layers below first_layer."""
    if isinstance(value, patches.RankOne):
      # The RankOne of an [out, in] 'weight' densifies in the weight's layout.
      value = patches.RankOne(value.left, value.right, transposed=path[-1] == 'weight')
      value = value.scale(jnp.asarray(self.active, value.right.dtype))
    else:
      value = value * jnp.asarray(self.active, value.dtype)
    node = self.new
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
    return value

  def patch_or_none(self):
    return self.new if self.target is not None else self.given

  def linear(self, x, layer, delta=None, delta_bias=None):
    return patches.linear(x, layer, delta, delta_bias, dtype=self.dtype, mode=self.mode)

  def residual_gap(self, v):
    """v_C − v at the last position, in the accumulation dtype."""
    return self.target['v'].astype(self.acc) - _last(v).astype(self.acc)


def _input_side(ctx, z, *path_and_kernels):
  """ΔW = W δz z^T/‖z‖² for every matrix reading z ((patch path, [in, out] matrix) pairs);
  returns the deltas (given or computed)."""
  deltas = []
  for path, kernel in path_and_kernels:
    if ctx.target is not None:
      deltas.append(ctx.put(patches.input_patch(_last(z), ctx.target['z'], kernel), *path))
    else:
      deltas.append(ctx.take(*path))
  return deltas


def _gated_hidden(ctx, z, mlp):
  gate_d, up_d = _input_side(ctx, z, ctx.matrix('mlp', 'gate'), ctx.matrix('mlp', 'up'))
  return ctx.act(ctx.linear(z, mlp['gate'], gate_d)) * ctx.linear(z, mlp['up'], up_d)


def _gemma(ctx, v, z):
  s, p, acc = ctx.spec, ctx.p, ctx.acc
  mlp, w = p['mlp'], p['post_mlp_norm']['scale']
  a = _gated_hidden(ctx, z, mlp)
  record = {'a': _last(a)}
  m = 1 + w.astype(acc)
  down_path, _ = ctx.matrix('mlp', 'down')
  down_d = ctx.take(*down_path)
  if ctx.target is not None and ctx.method == 'stable':
    h0 = ctx.linear(a, mlp['down'])
    g = ctx.target['out'].astype(acc) - _last(v).astype(acc)
    y, constraint, hard, mu = stable.rms_inversion(jnp.broadcast_to(m, g.shape), g)
    h_c = ctx.target['h'].astype(acc)
    h_target = jnp.sqrt(jnp.mean(h_c * h_c, axis=-1, keepdims=True)) * y
    down_d = ctx.put(patches.output_patch(_last(a), h_target - _last(h0).astype(acc)),
                     *down_path)
    record.update(constraint=constraint, hard_case=hard, mu=mu)
  h = ctx.linear(a, mlp['down'], down_d)
  f = layers.rms_normalize(h, s.layer_norm_eps)
  record.update(h=_last(h), f=_last(f))
  dm = ctx.take('post_mlp_norm', 'scale')
  if ctx.target is not None:
    f_last = patches.safe_divisor(_last(f))
    if ctx.method == 'stable':
      numerator = g - m * _last(f)
    else:
      numerator = ctx.residual_gap(v)
    dm = ctx.put(numerator / f_last, 'post_mlp_norm', 'scale')
    record.update(_where_dm_peaks(dm, numerator, f_last, _last(h).astype(acc), m))
  if dm is None:
    scale = m
  elif ctx.mode == 'materialise':
    scale = 1 + (w.astype(acc) + dm).astype(w.dtype).astype(acc)[:, None]
  else:
    scale = m + dm[:, None]
  out = v + (f * scale).astype(ctx.dtype)
  if dm is not None:
    record['dm_max'] = jnp.max(jnp.abs(dm), axis=-1)
  return out, ctx.patch_or_none(), record


def _where_dm_peaks(dm, numerator, f, h, m):
  """Per example: the channel of max |Δm| and the numerator, denominator f = N(h), h and the
  scale m there (why a scale patch grows: a small f, or for the stable update a small m)."""
  channel = jnp.argmax(jnp.abs(dm), axis=-1)
  at = lambda a: jnp.take_along_axis(jnp.broadcast_to(a, dm.shape), channel[:, None], -1)[:, 0]
  return {'dm_channel': channel, 'dm_numerator': at(numerator), 'dm_f': at(f), 'dm_h': at(h),
          'dm_scale': at(m), 'rms_h': jnp.sqrt(jnp.mean(h * h, axis=-1)),
          'min_abs_f': jnp.min(jnp.abs(f), axis=-1)}


def _llama(ctx, v, z):
  mlp = ctx.p['mlp']
  a = _gated_hidden(ctx, z, mlp)
  down_path, _ = ctx.matrix('mlp', 'down')
  down_d = ctx.take(*down_path)
  if ctx.target is not None:
    down_d = ctx.put(patches.output_patch(_last(a), ctx.residual_gap(v)), *down_path)
  out = v + ctx.linear(a, mlp['down'], down_d)
  return out, ctx.patch_or_none(), {'a': _last(a)}


def _moe(ctx, v, z):
  s, mlp, acc = ctx.spec, ctx.p['mlp'], ctx.acc
  router_d, gate_d, up_d = _input_side(  # the stacked experts have one layout: [E, in, out]
      ctx, z, ctx.matrix('mlp', 'router'), (('mlp', 'gate'), mlp['gate']),
      (('mlp', 'up'), mlp['up']))
  gates = layers.moe_gates(ctx.linear(z, mlp['router'], router_d), s.experts_per_token)
  lin = lambda inputs, kernel, delta: patches.expert_linear(inputs, kernel, delta,
                                                            dtype=ctx.dtype, mode=ctx.mode)
  a = ctx.act(lin(z, mlp['gate'], gate_d)) * lin(z, mlp['up'], up_d)  # [B, T, E, F]
  down_d = ctx.take('mlp', 'down')
  record = {'a': _last(a), 'gates': _last(gates)}
  if ctx.target is not None:
    g_last = _last(gates)
    total = jnp.sum(g_last, axis=-1, keepdims=True)  # S: 1 only up to rounding
    on = (g_last > 0).astype(acc)[..., None]
    per_expert = (ctx.residual_gap(v) / total)[:, None, :] * on  # [B, E, C]
    down_d = ctx.put(patches.output_patch(_last(a), per_expert), 'mlp', 'down')
  y = lin(a, mlp['down'], down_d)  # [B, T, E, C]
  out = v + jnp.einsum('bte,btec->btc', gates.astype(y.dtype), y)
  return out, ctx.patch_or_none(), record


def _falcon(ctx, v, z):
  mlp = ctx.p['mlp']
  a = ctx.act(ctx.linear(z, mlp['fc_in']))
  out_path, _ = ctx.matrix('mlp', 'fc_out')
  out_d = ctx.take(*out_path)
  if ctx.target is not None:
    # The MLP input never sees the context, so the whole difference goes through W_out; taking
    # it from the actual output also absorbs whatever earlier layers left over.
    unpatched = _last(v).astype(ctx.acc) + _last(ctx.linear(a, mlp['fc_out'])).astype(ctx.acc)
    delta_y = ctx.target['out'].astype(ctx.acc) - unpatched
    out_d = ctx.put(patches.output_patch(_last(a), delta_y), *out_path)
  out = v + ctx.linear(a, mlp['fc_out'], out_d)
  return out, ctx.patch_or_none(), {'a': _last(a)}


def _gpt(ctx, v, z):
  mlp = ctx.p['mlp']
  (in_d,) = _input_side(ctx, z, ctx.matrix('mlp', 'fc_in'))
  a = ctx.act(ctx.linear(z, mlp['fc_in'], in_d))
  db = ctx.take('mlp', 'fc_out', 'bias')
  if ctx.target is not None:
    db = ctx.put(ctx.residual_gap(v), 'mlp', 'fc_out', 'bias')
  out = v + ctx.linear(a, mlp['fc_out'], delta_bias=db)
  return out, ctx.patch_or_none(), {'a': _last(a)}


_FAMILIES = {'gemma': _gemma, 'llama': _llama, 'moe': _moe, 'falcon': _falcon, 'gpt': _gpt}


def correction_ffn(spec, params, z, *, mode, patch=None, target_z=None):
  """The context-ready model's correction FFN (fc_in, GELU, fc_out) on its normalised input z.

  With `target_z` (z_C, the input it had with context) fc_in gets the rank-1 input patch, so
  the correction equals the with-context one. Returns (c [B, T, C], patch or None).
  """
  ctx = _Ctx(spec, params, mode, patch, {'z': target_z} if target_z is not None else None,
             'direct', 1.0)
  ffn = params['ffn']
  (in_d,) = _input_side(ctx, z, ctx.matrix('ffn', 'fc_in'))
  a = jax.nn.gelu(ctx.linear(z, ffn['fc_in'], in_d), approximate=False)
  return ctx.linear(a, ffn['fc_out']), ctx.patch_or_none()
