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
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from composer_rl.model import kv_cache as kvc
from composer_rl.model.config import ModelConfig
from composer_rl.ops import exact, grouped

F32 = jnp.float32
# ModelConfig.remat -> what `jax.checkpoint` keeps of a block for the backward.
_REMAT = {"dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
          "full": jax.checkpoint_policies.nothing_saveable}


def _param(rngs: nnx.Rngs, shape, axes, scale: Optional[float] = None, ones=False,
           dtype=F32) -> nnx.Param:
  if ones:
    value = jnp.ones(shape, dtype)
  else:
    std = scale if scale is not None else shape[-2] ** -0.5
    value = (jax.random.truncated_normal(rngs.params(), -2.0, 2.0, shape, F32) * std
             ).astype(dtype)
  return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class Attention(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    dt = c.param_jnp_dtype
    self.norm = _param(rngs, (c.d_model,), ("embed",), ones=True, dtype=dt)
    self.wq = _param(rngs, (c.d_model, c.num_heads * c.head_dim), ("embed", "q_heads"), dtype=dt)
    self.wk = _param(rngs, (c.d_model, c.num_kv_heads * c.head_dim), ("embed", "kv_heads"),
                     dtype=dt)
    self.wv = _param(rngs, (c.d_model, c.num_kv_heads * c.head_dim), ("embed", "kv_heads"),
                     dtype=dt)
    self.wo = _param(rngs, (c.num_heads * c.head_dim, c.d_model), ("q_heads", "embed"), dtype=dt)
    if c.qk_norm:
      self.q_norm = _param(rngs, (c.head_dim,), ("head_dim",), ones=True, dtype=dt)
      self.k_norm = _param(rngs, (c.head_dim,), ("head_dim",), ones=True, dtype=dt)


class MLP(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    dt = c.param_jnp_dtype
    self.norm = _param(rngs, (c.d_model,), ("embed",), ones=True, dtype=dt)
    self.w_gate = _param(rngs, (c.d_model, c.d_ff), ("embed", "mlp"), dtype=dt)
    self.w_up = _param(rngs, (c.d_model, c.d_ff), ("embed", "mlp"), dtype=dt)
    self.w_down = _param(rngs, (c.d_ff, c.d_model), ("mlp", "embed"), dtype=dt)


class MoE(nnx.Module):

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    dt = c.param_jnp_dtype
    e, d, f = c.num_experts, c.d_model, c.moe_d_ff
    self.norm = _param(rngs, (d,), ("embed",), ones=True, dtype=dt)
    self.router = _param(rngs, (d, e), ("embed", "expert_logits"), dtype=dt)
    self.w_gate = _param(rngs, (e, d, f), ("expert", "embed", "moe_mlp"), d ** -0.5, dtype=dt)
    self.w_up = _param(rngs, (e, d, f), ("expert", "embed", "moe_mlp"), d ** -0.5, dtype=dt)
    self.w_down = _param(rngs, (e, f, d), ("expert", "moe_mlp", "embed"), f ** -0.5, dtype=dt)


class Block(nnx.Module):

  def __init__(self, c: ModelConfig, layer: int, rngs: nnx.Rngs):
    self.attn = Attention(c, rngs)
    self.ffn = MoE(c, rngs) if c.is_moe_layer(layer) else MLP(c, rngs)


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
    self.embed = _param(rngs, (c.vocab_size, c.d_model), ("vocab", "embed"), 1.0, dtype=dt)
    self.blocks = nnx.List([Block(c, i, rngs) for i in range(c.num_layers)])
    self.final_norm = _param(rngs, (c.d_model,), ("embed",), ones=True, dtype=dt)
    if not c.tie_embeddings:
      self.lm_head = _param(rngs, (c.d_model, c.vocab_size), ("embed", "vocab"), dtype=dt)

  def _w(self, param: nnx.Param) -> jax.Array:
    """A parameter as the forward consumes it: rounded to the compute dtype.

    Every parameter but the router passes through here or through `exact.dense` (which
    casts to the compute dtype too), so the forward on `inference_copy(state)` is the
    forward on the fp32 master weights, bit for bit, and the inference copy that weight
    sync ships is all compute-dtype except the (small) fp32 router.
    """
    return param[...].astype(self.config.compute_jnp_dtype)

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

  def _qkv(self, attn: Attention, x, positions):
    c, dt = self.config, self.config.compute_jnp_dtype
    h = exact.rms_norm(x, self._w(attn.norm), c.norm_eps)
    t = x.shape[0]
    # One dot for q, k and v (a column's bits do not depend on the others: ops.exact).
    qkv = self._dense(h, jnp.concatenate([attn.wq[...], attn.wk[...], attn.wv[...]], 1))
    nq, nkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    q = qkv[:, :nq].reshape(t, c.num_heads, c.head_dim)
    k = qkv[:, nq:nq + nkv].reshape(t, c.num_kv_heads, c.head_dim)
    v = qkv[:, nq + nkv:].reshape(t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
      q = exact.rms_norm(q, self._w(attn.q_norm), c.norm_eps)
      k = exact.rms_norm(k, self._w(attn.k_norm), c.norm_eps)
    q = exact.rope(q, positions, c.rope_theta) * (c.head_dim ** -0.5)
    k = exact.rope(k, positions, c.rope_theta)
    return q.astype(dt), k.astype(dt), v.astype(dt)

  def _post_attention(self, block: Block, x, attn_out):
    """Output projection + residual, then the dense MLP or the MoE router (row-local)."""
    c = self.config
    x = x + self._dense(attn_out, block.attn.wo[...])
    ffn = block.ffn
    h = exact.rms_norm(x, self._w(ffn.norm), c.norm_eps)
    if isinstance(ffn, MLP):
      gate_up = self._dense(h, jnp.concatenate([ffn.w_gate[...], ffn.w_up[...]], 1))
      act = jax.nn.silu(gate_up[:, :c.d_ff]) * gate_up[:, c.d_ff:]
      return x + self._dense(act, ffn.w_down[...]), None, None, None
    # Router in fp32: a flipped expert choice is the costliest mismatch there is.
    probs = exact.softmax(self._dense(h, ffn.router[...], F32))
    top_p, top_i = jax.lax.top_k(probs, c.experts_per_token)
    if c.norm_topk_prob:
      top_p = top_p / exact.row_sum(top_p)[:, None]
    return x, h, top_i.astype(jnp.int32), (top_p, probs)

  def _layer(self, block: Block, x, k_cache, v_cache, *, pos_rows, slots, segments,
             segment_ids, key_len):
    """One block on the padded rows x: (x, its k and v caches with this call's tokens
    written, and for an MoE block the experts chosen and the router distribution)."""
    c = self.config
    b, s = slots.shape
    n = b * s
    q, k, v = (a[:n] for a in self._qkv(block.attn, x, pos_rows))
    k_cache = kvc.write_slots(k_cache, k.reshape(b, s, *k.shape[1:]), slots)
    v_cache = kvc.write_slots(v_cache, v.reshape(b, s, *v.shape[1:]), slots)
    attn = exact.attention(q.reshape(b, s, c.num_heads, c.head_dim), k_cache, v_cache,
                           segments, slots, segment_ids, c.exact_numerics, c.key_block, key_len)
    attn_rows = exact.pad_rows(attn.reshape(n, c.num_heads * c.head_dim))
    x, h, ids, extra = self._post_attention(block, x, attn_rows)
    if ids is None:
      return x, k_cache, v_cache, None, None
    gates, probs = extra
    ffn = block.ffn
    x = x + grouped.grouped_swiglu(h, ids, gates, ffn.w_gate[...], ffn.w_up[...],
                                   ffn.w_down[...], c.row_tile, c.compute_jnp_dtype,
                                   exact_numerics=c.exact_numerics)
    return x, k_cache, v_cache, ids, probs

  # ---- the one forward ----------------------------------------------------------------
  def forward(self, tokens: jax.Array, positions: jax.Array, cache: kvc.KVCache,
              cache_index: jax.Array, segment_ids: Optional[jax.Array] = None,
              key_len: Optional[int] = None) -> ForwardOutput:
    """Runs `tokens` through the model, writing their keys/values into `cache`.

    Args:
      tokens: [B, S] int32 token ids.
      positions: [B, S] int32 RoPE positions.
      cache: KV cache with B sequences and `max_seq_len` slots.
      cache_index: [B] int32 slot of each sequence's first token in this call; token s goes
        to slot cache_index + s and attends to slots <= its own in the same segment.
      segment_ids: [B, S] int32, >0 for real tokens (packed documents get distinct ids),
        0 for padding; default all ones.
      key_len: static count of leading cache slots that covers every key this call can see
        (see `composer_rl.ops.exact.attention`); None picks it on device. Any valid value
        gives the same bits.
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
    new_k, new_v, all_ids, all_probs = [], [], [], []
    for i, block in enumerate(self.blocks):
      layer = functools.partial(self._layer, block, pos_rows=pos_rows, slots=slots,
                                segments=segments, segment_ids=segment_ids, key_len=key_len)
      if c.remat != "none":
        layer = jax.checkpoint(layer, policy=_REMAT[c.remat])
      x, k_cache, v_cache, ids, probs = layer(x, cache.k[i], cache.v[i])
      new_k.append(k_cache)
      new_v.append(v_cache)
      if ids is not None:
        all_ids.append(ids[:n])
        all_probs.append(probs[:n])
    if all_ids:
      expert_ids = jnp.stack(all_ids, 1).reshape(b, s, len(all_ids), c.experts_per_token)
      router_probs = jnp.stack(all_probs, 1).reshape(b, s, len(all_ids), c.num_experts)
    else:
      expert_ids = jnp.zeros((b, s, 0, 0), jnp.int32)
      router_probs = jnp.zeros((b, s, 0, 0), F32)
    return ForwardOutput(
        hidden=x[:n].reshape(b, s, c.d_model),
        cache=kvc.KVCache(k=tuple(new_k), v=tuple(new_v), segments=segments),
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
