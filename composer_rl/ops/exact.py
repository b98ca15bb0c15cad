"""Batch-invariant ("exact") operations: a row's bits never depend on its neighbours.

Measured on XLA:CPU (BUILD_NOTES.md, "Parity design"): a matmul row's result depends on
how many rows the call has once the contraction is >= 512 wide; a single-query attention
lowers to a matrix-vector product with a different summation order than a multi-query one;
softmax normalizers depend on the padded key length. The design that removes all of these:

* `map_row_tiles`: every token-local computation (norms, projections, MLPs, router, the
  output head and the sampling transform) runs on fixed `[tile, ...]` blocks through
  `lax.map`, so each block is the *same* compiled computation whatever the batch, slot,
  padding or program (prefill, decode, or the forward inside `value_and_grad`).
* `attention`: fixed blocks of query positions against a key axis of fixed length (the KV
  cache) taken in fixed key blocks with an online softmax, -inf masking, and a normalizer
  that comes out of the same dot as the values (V carries an extra channel of ones). Key
  blocks past what a call can see are skipped, which is exact (see `attention`).

A backend-specific kernel (a Pallas fixed-tile matmul on GPU) can replace `dense` or
`attention` here without touching the model.
"""
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


def map_row_tiles(fn: Callable[..., Any], rows: Any, tile: Optional[int]) -> Any:
  """Applies `fn` to fixed-size row tiles of `rows` (a pytree of [R, ...] arrays).

  `fn` maps a pytree of [tile, ...] arrays to a pytree of [tile, ...] arrays and must be
  row-local (row i of the output depends only on row i of the input). Rows are padded to a
  multiple of `tile` by repeating the last row (zeros would put e.g. a temperature of 0 into
  the padding, whose NaN partials poison the weight gradient even under a zero cotangent);
  padding rows are computed and dropped. `tile=None` calls `fn` on all rows at once (the
  inexact fast mode).
  """
  if tile is None:
    return fn(rows)
  leaves = jax.tree.leaves(rows)
  num_rows = leaves[0].shape[0]
  num_tiles = -(-num_rows // tile)
  pad = num_tiles * tile - num_rows

  def to_tiles(x):
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), mode="edge")
    return x.reshape((num_tiles, tile) + x.shape[1:])

  out = lax.map(fn, jax.tree.map(to_tiles, rows))
  return jax.tree.map(lambda y: y.reshape((num_tiles * tile,) + y.shape[2:])[:num_rows], out)


def dense(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
  """x [T, K] @ w [K, N] in `dtype` with fp32 accumulation; call inside a row tile."""
  return jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=F32)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis in fp32; call inside a row tile."""
  x = x.astype(F32)
  var = jnp.mean(x * x, axis=-1, keepdims=True)
  return x * lax.rsqrt(var + eps) * scale.astype(F32)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotate-half RoPE. x [T, heads, head_dim], positions [T]; fp32 math."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=F32) * (2.0 / x.shape[-1])))
  angles = positions.astype(F32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
  x = x.astype(F32)
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q: jax.Array, k_cache: jax.Array, v1_cache: jax.Array, key_segments: jax.Array,
              query_slots: jax.Array, query_segments: jax.Array, exact: bool = True,
              query_block: int = 1, key_block: int = 0) -> jax.Array:
  """Causal grouped-query attention over a fixed-length KV cache, in fixed blocks.

  Args:
    q: [B, S, H, D] queries, already scaled by 1/sqrt(D) and rotated.
    k_cache: [B, G, L, D] keys for every cache slot (G kv heads, L = max_seq_len).
    v1_cache: [B, G, L, D + 1] values with a trailing channel of ones on written slots, so
      the softmax normalizer is computed by the same dot as the weighted values.
    key_segments: [B, L] int32 segment id of each slot; 0 = never written.
    query_slots: [B, S] cache slot of each query token (a query sees slots <= its own).
    query_segments: [B, S] segment id of each query (a query sees only its own segment).
    exact: False computes all queries in one batched dot (the inexact fast mode).
    query_block: query positions per attention dot. Every call, decode included, pads its
      queries to a multiple of this, so each dot has the same [block * heads_per_kv, Kb]
      shape: larger blocks cut the sequential loop in prefill/training and cost decode
      block-fold attention FLOPs.
    key_block: key slots per block of the online softmax (0 = all L in one block); must
      divide L. Key blocks run in order 0, 1, ... and a block past the last slot any query
      of the call can see is skipped: for such a block the online-softmax update is an
      exact identity (its probabilities are exactly 0, the running max and the rescale
      factor exp(0) = 1 are unchanged), so a query's bits do not depend on how many blocks
      its call ran. That is what lets decode (one query per sequence, each sequence at its
      own length) and training (causal: query block i needs key blocks <= i) read only the
      keys they need and still agree bit for bit. Decode (one query block) runs each
      sequence separately so each reads only its own length.

  Returns:
    [B, S, H, D] attention outputs in fp32 (zeros for queries that see no key).
  """
  b, s, h, d = q.shape
  g, length = k_cache.shape[1], k_cache.shape[2]
  kb = key_block or length
  if length % kb:
    raise ValueError(f"key_block={key_block} must divide the KV cache length {length}")
  rep = h // g
  q = q.reshape(b, s, g, rep, d).astype(k_cache.dtype)
  v1_dtype = v1_cache.dtype

  def one_block(args):
    q_b, slot_b, seg_b, k_all, v_all, kseg_all = args
    # q_b [B', G, Qb*R, D] (query-major rows); slot_b, seg_b [B', Qb]; caches of B' rows.
    last = jnp.max(jnp.where(seg_b != 0, slot_b, -1))  # last slot any query here sees
    steps = jnp.where(last < 0, 0, last // kb + 1)

    def update(carry, blk):
      peak, acc = carry  # [B', G, Qb*R, 1] running max, [B', G, Qb*R, D+1] sums
      k_j, v_j, kseg, j = blk
      key_ids = j * kb + jnp.arange(kb, dtype=jnp.int32)
      scores = jnp.einsum("bgrd,bgld->bgrl", q_b, k_j, preferred_element_type=F32)
      visible = ((key_ids[None, None, :] <= slot_b[:, :, None])
                 & (kseg[:, None, :] == seg_b[:, :, None])
                 & (kseg[:, None, :] != 0))  # [B', Qb, Kb]
      visible = jnp.repeat(visible, rep, axis=1)[:, None]  # [B', 1, Qb*R, Kb]
      scores = jnp.where(visible, scores, -jnp.inf)
      new_peak = jnp.maximum(peak, jnp.max(scores, axis=-1, keepdims=True))  # exact
      shift = jnp.where(jnp.isfinite(new_peak), new_peak, 0.0)
      probs = jnp.exp(scores - shift).astype(v1_dtype)
      acc = acc * jnp.exp(peak - shift) + jnp.einsum(
          "bgrl,bgld->bgrd", probs, v_j, preferred_element_type=F32)
      return new_peak, acc

    rows = q_b.shape[:3]
    init = (jnp.full(rows + (1,), -jnp.inf, F32), jnp.zeros(rows + (d + 1,), F32))
    if kb == length:  # one block: no loop
      _, acc = update(init, (k_all, v_all, kseg_all, jnp.int32(0)))
    else:
      nk = length // kb
      # Key blocks as scan inputs (not slices of a captured cache), so the backward pass
      # stacks their cotangents instead of adding a full-cache one per block.
      split = lambda x, axis: jnp.moveaxis(
          x.reshape(x.shape[:axis] + (nk, kb) + x.shape[axis + 1:]), axis, 0)
      blocks = (split(k_all, 2), split(v_all, 2), split(kseg_all, 1),
                jnp.arange(nk, dtype=jnp.int32))
      key_step = lambda c, blk: (lax.cond(blk[3] < steps, update, lambda c, _: c, c, blk),
                                 None)
      (_, acc), _ = lax.scan(key_step, init, blocks)
    norm = acc[..., d:]
    return jnp.where(norm > 0, acc[..., :d] / jnp.where(norm > 0, norm, 1.0), 0.0)

  if not exact:
    rows = jnp.moveaxis(q, 1, 2).reshape(b, g, s * rep, d)
    out = one_block((rows, query_slots, query_segments, k_cache, v1_cache, key_segments))
    return jnp.moveaxis(out.reshape(b, g, s, rep, d), 2, 1).reshape(b, s, h, d)
  qb = query_block
  nb = -(-s // qb)
  pad = nb * qb - s
  # Padding queries get segment 0: they see no key and produce zeros (dropped below).
  q = jnp.pad(q, [(0, 0), (0, pad), (0, 0), (0, 0), (0, 0)])
  slots = jnp.pad(query_slots, [(0, 0), (0, pad)])
  segs = jnp.pad(query_segments, [(0, 0), (0, pad)])
  q_blocks = q.reshape(b, nb, qb, g, rep, d).transpose(1, 0, 3, 2, 4, 5).reshape(
      nb, b, g, qb * rep, d)
  slot_blocks = slots.reshape(b, nb, qb).transpose(1, 0, 2)
  seg_blocks = segs.reshape(b, nb, qb).transpose(1, 0, 2)
  if nb == 1 and kb < length:
    # Decode: each sequence on its own, so each reads only the key blocks of its length.
    one = lambda x: x[:, None]
    out = lax.map(one_block, (one(q_blocks[0]), one(slot_blocks[0]), one(seg_blocks[0]),
                              one(k_cache), one(v1_cache), one(key_segments)))
    out = out[:, 0][None]
  else:
    out = lax.map(lambda a: one_block(a + (k_cache, v1_cache, key_segments)),
                  (q_blocks, slot_blocks, seg_blocks))
  out = out.reshape(nb, b, g, qb, rep, d).transpose(1, 0, 3, 2, 4, 5)
  return out.reshape(b, nb * qb, h, d)[:, :s]
