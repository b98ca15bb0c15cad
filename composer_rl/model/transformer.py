"""Decoder-only transformer (Qwen3 layout, dense or MoE) with one forward for everything.

`Transformer.forward` is the only forward: prefill (any chunk of a prompt), decode (one token
per sequence) and the training step all call it, with a `KVCache` of fixed length. It returns
hidden states; `Transformer.logits` is the row-local output projection that the sampling
head (`composer_rl.sampling.head`) applies inside its fixed row tiles.

Numerics (see `composer_rl.ops.exact`): fp32 master parameters, matmul inputs cast to
`compute_dtype` with fp32 accumulation, fp32 residual stream, norms, softmax and logits.
Parameters carry logical axis names (`out_sharding` metadata) that
`composer_rl.model.sharding` maps onto a device mesh.
"""
import functools
from typing import Callable, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
from flax import nnx

from composer_rl.model import kv_cache as kvc
from composer_rl.model.config import ModelConfig
from composer_rl.ops import exact, grouped

F32 = jnp.float32
LayerGather = Callable[[str, Dict[str, jax.Array]], Dict[str, jax.Array]]
# ModelConfig.remat -> what `jax.checkpoint` keeps of a block for the backward.
_REMAT = {"dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
          "full": jax.checkpoint_policies.nothing_saveable}


def _init(rngs: nnx.Rngs, shape, scale: Optional[float], ones: bool, dtype) -> jax.Array:
  if ones:
    return jnp.ones(shape, dtype)
  std = scale if scale is not None else shape[-2] ** -0.5
  return (jax.random.truncated_normal(rngs.params(), -2.0, 2.0, shape, F32) * std).astype(dtype)


def _param(value: jax.Array, axes) -> nnx.Param:
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def block_params(c: ModelConfig, kind: str):
  """(name, shape, logical axes, init scale, ones) of one layer's attention ('attn'),
  dense feed-forward ('mlp') or mixture of experts ('moe'), in initialization order."""
  d, hd = c.d_model, c.head_dim
  qd, kvd, e, f = c.num_heads * hd, c.num_kv_heads * hd, c.num_experts, c.moe_d_ff
  norm = ("norm", (d,), ("embed",), None, True)
  if kind == "attn":
    return [norm, ("wq", (d, qd), ("embed", "q_heads"), None, False),
            ("wk", (d, kvd), ("embed", "kv_heads"), None, False),
            ("wv", (d, kvd), ("embed", "kv_heads"), None, False),
            ("wo", (qd, d), ("q_heads", "embed"), None, False)] + (
                [("q_norm", (hd,), ("head_dim",), None, True),
                 ("k_norm", (hd,), ("head_dim",), None, True)] if c.qk_norm else [])
  if kind == "mlp":
    return [norm, ("w_gate", (d, c.d_ff), ("embed", "mlp"), None, False),
            ("w_up", (d, c.d_ff), ("embed", "mlp"), None, False),
            ("w_down", (c.d_ff, d), ("mlp", "embed"), None, False)]
  return [norm, ("router", (d, e), ("embed", "expert_logits"), None, False),
          ("w_gate", (e, d, f), ("expert", "embed", "moe_mlp"), d ** -0.5, False),
          ("w_up", (e, d, f), ("expert", "embed", "moe_mlp"), d ** -0.5, False),
          ("w_down", (e, f, d), ("expert", "moe_mlp", "embed"), f ** -0.5, False)]


def layer_runs(c: ModelConfig) -> Tuple[Tuple[str, int, int, int], ...]:
  """Maximal runs of consecutive layers of one feed-forward kind: (kind, first layer, end
  layer, first index in that kind's stack). One run (one scan) for a uniform model."""
  runs = []
  count = {"mlp": 0, "moe": 0}
  for i in range(c.num_layers):
    kind = "moe" if c.is_moe_layer(i) else "mlp"
    if runs and runs[-1][0] == kind:
      runs[-1][2] = i + 1
    else:
      runs.append([kind, i, i + 1, count[kind]])
    count[kind] += 1
  return tuple(tuple(r) for r in runs)


class Stacked(nnx.Module):
  """Parameters of several layers, each with a leading layer axis (logical name `layers`)."""

  def __init__(self, values: Dict[str, jax.Array], axes: Dict[str, Tuple[str, ...]]):
    for name, value in values.items():
      setattr(self, name, _param(value, ("layers",) + axes[name]))

  def arrays(self, lo: int, hi: int) -> Dict[str, jax.Array]:
    """Layers [lo, hi) of every parameter (no copy when that is the whole stack)."""
    out = {}
    for name, var in vars(self).items():
      if isinstance(var, nnx.Param):
        a = var[...]
        out[name] = a if (lo, hi) == (0, a.shape[0]) else jax.lax.slice_in_dim(a, lo, hi)
    return out


class Layers(nnx.Module):
  """Every block's parameters stacked over layers: `attn` for all layers, `mlp` for the
  dense layers and `moe` for the MoE layers (each in layer order, present when used). The
  forward runs one compiled block body per run of layers (`layer_runs`) in a `lax.scan`."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    dt = c.param_jnp_dtype
    kinds = {k: block_params(c, k) for k in ("attn", "mlp", "moe")}
    values: Dict[str, Dict[str, list]] = {k: {} for k in kinds}
    for i in range(c.num_layers):  # per layer, in the order the layers' draws were made
      for kind in ("attn", "moe" if c.is_moe_layer(i) else "mlp"):
        for name, shape, _, scale, ones in kinds[kind]:
          values[kind].setdefault(name, []).append(_init(rngs, shape, scale, ones, dt))
    for kind, spec in kinds.items():
      if values[kind]:
        setattr(self, kind, Stacked({n: jnp.stack(v) for n, v in values[kind].items()},
                                    {s[0]: s[2] for s in spec}))


class ForwardOutput(NamedTuple):
  """What the one forward returns.

  hidden: [B, S, d_model] fp32 final residual stream (before the final norm).
  cache: the KV cache with this call's tokens written.
  expert_ids: [B, S, num_moe_layers, k] int32 experts chosen per token (k=0 if dense).
  router_probs: [B, S, num_moe_layers, E] fp32 full router distribution (aux loss).
  """
  hidden: jax.Array
  cache: kvc.KVCache
  expert_ids: jax.Array
  router_probs: jax.Array


class Transformer(nnx.Module):
  """Token embedding -> blocks (GQA attention + SwiGLU MLP or MoE) -> final norm -> logits."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = self.config = config
    dt = c.param_jnp_dtype
    self.embed = _param(_init(rngs, (c.vocab_size, c.d_model), 1.0, False, dt),
                        ("vocab", "embed"))
    self.layers = Layers(c, rngs)
    self.final_norm = _param(jnp.ones((c.d_model,), dt), ("embed",))
    if not c.tie_embeddings:
      self.lm_head = _param(_init(rngs, (c.d_model, c.vocab_size), None, False, dt),
                            ("embed", "vocab"))

  def _w(self, w: jax.Array) -> jax.Array:
    """A parameter as the forward consumes it: rounded to the compute dtype.

    Every parameter but the router passes through here or through `exact.dense` (which
    casts to the compute dtype too), so the forward on `inference_copy(state)` is the
    forward on the fp32 master weights, bit for bit, and the inference copy that weight
    sync ships is all compute-dtype except the (small) fp32 router.
    """
    return w[...].astype(self.config.compute_jnp_dtype)

  # ---- row-local pieces ----------------------------------------------------------------
  def _dense(self, x, w, dtype=None):
    c = self.config
    return exact.dense(x, w, c.compute_jnp_dtype if dtype is None else dtype, c.exact_numerics)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [T, d] -> fp32 logits [T, vocab] (final norm + output projection)."""
    c = self.config
    h = exact.rms_norm(exact.pad_rows(hidden), self._w(self.final_norm), c.norm_eps)
    w = self.embed[...].T if c.tie_embeddings else self.lm_head[...]
    out = self._dense(h, w)[:hidden.shape[0]]
    if 0 < c.token_count < c.vocab_size:  # ids past the tokenizer: never sampled or scored
      out = jnp.where(jnp.arange(c.vocab_size) < c.token_count, out, -jnp.inf)
    return out

  def _qkv(self, attn: Dict[str, jax.Array], x, positions):
    c, dt = self.config, self.config.compute_jnp_dtype
    h = exact.rms_norm(x, self._w(attn["norm"]), c.norm_eps)
    t = x.shape[0]
    # One dot for q, k and v (a column's bits do not depend on the others: ops.exact).
    qkv = self._dense(h, jnp.concatenate([attn["wq"], attn["wk"], attn["wv"]], 1))
    nq, nkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    q = qkv[:, :nq].reshape(t, c.num_heads, c.head_dim)
    k = qkv[:, nq:nq + nkv].reshape(t, c.num_kv_heads, c.head_dim)
    v = qkv[:, nq + nkv:].reshape(t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
      q = exact.rms_norm(q, self._w(attn["q_norm"]), c.norm_eps)
      k = exact.rms_norm(k, self._w(attn["k_norm"]), c.norm_eps)
    q = exact.rope(q, positions, c.rope_theta) * (c.head_dim ** -0.5)
    k = exact.rope(k, positions, c.rope_theta)
    return q.astype(dt), k.astype(dt), v.astype(dt)

  def _ffn(self, kind: str, ffn: Dict[str, jax.Array], x, sampling: bool):
    """The dense MLP or the MoE, with its residual; for MoE also (experts, router probs).
    `sampling`: a forward no one differentiates (the MoE then runs only its live tiles;
    the same bits)."""
    c = self.config
    h = exact.rms_norm(x, self._w(ffn["norm"]), c.norm_eps)
    if kind == "mlp":
      gate_up = self._dense(h, jnp.concatenate([ffn["w_gate"], ffn["w_up"]], 1))
      act = jax.nn.silu(gate_up[:, :c.d_ff]) * gate_up[:, c.d_ff:]
      return x + self._dense(act, ffn["w_down"]), None
    # Router in fp32: a flipped expert choice is the costliest mismatch there is.
    probs = exact.softmax(self._dense(h, ffn["router"], F32))
    top_p, top_i = jax.lax.top_k(probs, c.experts_per_token)
    if c.norm_topk_prob:
      top_p = top_p / exact.row_sum(top_p)[:, None]
    ids = top_i.astype(jnp.int32)
    x = x + grouped.grouped_swiglu(h, ids, top_p, ffn["w_gate"], ffn["w_up"], ffn["w_down"],
                                   c.row_tile, c.compute_jnp_dtype,
                                   exact_numerics=c.exact_numerics, live_only=sampling)
    return x, (ids, probs)

  def _block(self, kind, x, attn, ffn, layer, k, v, *, in_place, pos_rows, slots, segments,
             segment_ids, key_len):
    """Layer `layer` on the padded rows x. In place: k, v are the whole [B, L, ...] cache
    and come back with this call's keys written; otherwise they are read-only and the
    layer's written [B, G, S, D] caches come back. Returns (x, k, v, MoE routing or None)."""
    c = self.config
    b, s = slots.shape
    n = b * s
    q, k_new, v_new = (a[:n] for a in self._qkv(attn, x, pos_rows))
    k_new, v_new = (a.reshape(b, s, *a.shape[1:]) for a in (k_new, v_new))
    if in_place:
      k, v, at = (kvc.write_slots(k, k_new, slots, layer), kvc.write_slots(v, v_new, slots, layer),
                  layer)
    else:
      read = lambda a: kvc.values(jax.lax.dynamic_index_in_dim(a, layer, 1, keepdims=False))
      k, v, at = kvc.write_slots(read(k), k_new, slots), kvc.write_slots(read(v), v_new, slots), None
    out = exact.attention(q.reshape(b, s, c.num_heads, c.head_dim), k, v, segments, slots,
                          segment_ids, c.exact_numerics, c.key_block, key_len, layer=at)
    x = x + self._dense(exact.pad_rows(out.reshape(n, c.num_heads * c.head_dim)), attn["wo"])
    x, routing = self._ffn(kind, ffn, x, sampling=in_place)
    return x, k, v, routing

  # ---- the one forward ----------------------------------------------------------------
  def forward(self, tokens: jax.Array, positions: jax.Array, cache: kvc.KVCache,
              cache_index: jax.Array, segment_ids: Optional[jax.Array] = None,
              key_len: Optional[int] = None, for_grad: bool = False,
              layer_gather: Optional[LayerGather] = None) -> ForwardOutput:
    """Runs `tokens` through the model, writing their keys/values into `cache`.

    Args:
      tokens: [B, S] int32 token ids.
      positions: [B, S] int32 RoPE positions.
      cache: KV cache with B sequences.
      cache_index: [B] int32 slot of each sequence's first token in this call; token s goes
        to slot cache_index + s and attends to slots <= its own in the same segment.
      segment_ids: [B, S] int32, >0 for real tokens (packed documents get distinct ids),
        0 for padding; default all ones.
      key_len: static count of leading cache slots that covers every key this call can see
        (see `composer_rl.ops.exact.attention`); None picks it on device. Any valid value
        gives the same bits.
      for_grad: how the cache travels through the layer loop, not what is computed (the
        bits are the same): False (sampling) carries the whole cache and writes each
        layer's keys in place; True (a differentiated call: the training forward) reads it
        as a constant and returns each layer's cache as a loop output, so the backward
        does not keep a copy of the whole cache per layer.
      layer_gather: fn(kind, {name: array}) -> {name: array}, applied to one layer's
        parameters ('attn', 'mlp' or 'moe') as stored at the top of the layer loop's body:
        the train step's FSDP gathers a layer's shards here, so one layer is whole at a
        time. With `remat` 'dots' or 'full' the backward gathers again; with 'none' it
        keeps what it keeps of every layer, the weights the dots read included.
    """
    c = self.config
    b, s = tokens.shape
    if segment_ids is None:
      segment_ids = jnp.ones((b, s), jnp.int32)
    slots = cache_index.astype(jnp.int32)[:, None] + jnp.arange(s, dtype=jnp.int32)[None]
    segments = kvc.write_segments(cache.segments, segment_ids.astype(jnp.int32), slots)
    n = b * s
    # Row-local stages see >= MIN_ROWS rows (see `exact.pad_rows`); padding rows are dropped.
    x = self._w(self.embed)[tokens].astype(F32).reshape(n, c.d_model)
    pos_rows = positions.reshape(n).astype(jnp.int32)
    x, pos_rows = exact.pad_rows((x, pos_rows))
    k, v = cache.k, cache.v
    layer_kv, routing = [], []
    for kind, lo, hi, first in layer_runs(c):
      block = functools.partial(self._block, kind, in_place=not for_grad, pos_rows=pos_rows,
                                slots=slots, segments=segments, segment_ids=segment_ids,
                                key_len=key_len)

      def body(carry, xs, block=block, kind=kind):
        attn, ffn, layer = xs
        if layer_gather is not None:
          attn, ffn = layer_gather("attn", attn), layer_gather(kind, ffn)
        if for_grad:
          x, k_l, v_l, r = block(carry, attn, ffn, layer, k, v)
          return x, (k_l, v_l, r)
        x, k_all, v_all, r = block(*carry[:1], attn, ffn, layer, *carry[1:])
        return (x, k_all, v_all), r

      if c.remat != "none":
        body = jax.checkpoint(body, policy=_REMAT[c.remat])
      unroll = min(c.layer_unroll, hi - lo)
      xs = (self.layers.attn.arrays(lo, hi), getattr(self.layers, kind).arrays(
          first, first + hi - lo), jnp.arange(lo, hi, dtype=jnp.int32))
      if for_grad:
        x, (k_l, v_l, r) = jax.lax.scan(body, x, xs, unroll=unroll)
        layer_kv.append((k_l, v_l))
      else:
        (x, k, v), r = jax.lax.scan(body, (x, k, v), xs, unroll=unroll)
      if r is not None:
        routing.append((r[0][:, :n], r[1][:, :n]))  # [layers, n, ...]
    if for_grad:  # [L, B, ...] loop outputs (values) -> stored [B, L, ...]
      k, v = (kvc.stored(jnp.moveaxis(jnp.concatenate([kv[i] for kv in layer_kv]), 0, 1),
                            cache.k) for i in (0, 1))
    m = c.num_moe_layers
    if routing:
      expert_ids = jnp.moveaxis(jnp.concatenate([r[0] for r in routing]), 0, 1)
      router_probs = jnp.moveaxis(jnp.concatenate([r[1] for r in routing]), 0, 1)
      expert_ids = expert_ids.reshape(b, s, m, c.experts_per_token)
      router_probs = router_probs.reshape(b, s, m, c.num_experts)
    else:
      expert_ids = jnp.zeros((b, s, 0, 0), jnp.int32)
      router_probs = jnp.zeros((b, s, 0, 0), F32)
    return ForwardOutput(hidden=x[:n].reshape(b, s, c.d_model),
                         cache=kvc.KVCache(k=k, v=v, segments=segments),
                         expert_ids=expert_ids, router_probs=router_probs)


def inference_copy(state: nnx.State, config: ModelConfig) -> nnx.State:
  """The weights a sampler needs: every leaf in the compute dtype, routers in fp32.

  The forward gives identical bits on this copy and on the fp32 master (see
  `Transformer._w`); weight sync publishes and diffs exactly this tree. Every leaf is a new
  buffer, so the copy stays valid when the train step donates the master's buffers.
  """
  def cast(path, x):
    keep_fp32 = any(getattr(k, "key", None) == "router" for k in path)
    return jnp.array(x, dtype=x.dtype if keep_fp32 else config.compute_jnp_dtype, copy=True)
  return jax.tree_util.tree_map_with_path(cast, state)


def load_balancing_loss(expert_ids: jax.Array, router_probs: jax.Array,
                        mask: jax.Array) -> jax.Array:
  """Switch-style auxiliary loss E * sum_e f_e * P_e averaged over MoE layers.

  f_e is the fraction of (valid token, choice) assignments sent to expert e and P_e the mean
  router probability of e over valid tokens; the loss is 1.0 for perfectly uniform routing.
  Args: expert_ids [B, S, M, k], router_probs [B, S, M, E], mask [B, S] (1 = real token).
  """
  if router_probs.shape[2] == 0:
    return jnp.zeros((), F32)
  num_experts = router_probs.shape[-1]
  m = mask.astype(F32)[..., None]
  denom = jnp.maximum(jnp.sum(m), 1.0)
  onehot = jax.nn.one_hot(expert_ids, num_experts, dtype=F32).mean(-2)  # [B,S,M,E]
  frac = jnp.sum(onehot * m[..., None], axis=(0, 1)) / denom
  prob = jnp.sum(router_probs * m[..., None], axis=(0, 1)) / denom
  return num_experts * jnp.mean(jnp.sum(frac * prob, axis=-1))
