"""Batch-invariant ("exact") operations: a row's bits never depend on its neighbours.

Measured on XLA:CPU (BUILD_NOTES.md, "Parity design"): a matmul row's result depends on
how many rows the call has once the contraction is >= 512 wide; a single-query attention
lowers to a matrix-vector product with a different summation order than a multi-query one;
softmax normalizers depend on the padded key length. The design that removes all of these:

* `map_row_tiles`: every token-local computation (norms, projections, MLPs, router, the
  output head and the sampling transform) runs on fixed `[tile, ...]` blocks through
  `lax.map`, so each block is the *same* compiled computation whatever the batch, slot,
  padding or program (prefill, decode, or the forward inside `value_and_grad`).
* `attention`: one query position at a time against a key axis of fixed length (the KV
  cache), -inf masking, and a softmax whose normalizer comes out of the same dot as the
  values (V carries an extra channel of ones).

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
              query_slots: jax.Array, query_segments: jax.Array, exact: bool = True
              ) -> jax.Array:
  """Causal grouped-query attention over a fixed-length KV cache, one query at a time.

  Args:
    q: [B, S, H, D] queries, already scaled by 1/sqrt(D) and rotated.
    k_cache: [B, G, L, D] keys for every cache slot (G kv heads, L = max_seq_len).
    v1_cache: [B, G, L, D + 1] values with a trailing channel of ones on written slots, so
      the softmax normalizer is computed by the same dot as the weighted values.
    key_segments: [B, L] int32 segment id of each slot; 0 = never written.
    query_slots: [B, S] cache slot of each query token (a query sees slots <= its own).
    query_segments: [B, S] segment id of each query (a query sees only its own segment).
    exact: False computes all queries in one batched dot (the inexact fast mode).

  Returns:
    [B, S, H, D] attention outputs in fp32 (zeros for queries that see no key).
  """
  b, s, h, d = q.shape
  g, length = k_cache.shape[1], k_cache.shape[2]
  q = q.reshape(b, s, g, h // g, d).astype(k_cache.dtype)
  slot_ids = jnp.arange(length, dtype=jnp.int32)

  def one_query(args):
    q_s, slot_s, seg_s = args  # [B, G, R, D], [B], [B]
    scores = jnp.einsum("bgrd,bgld->bgrl", q_s, k_cache, preferred_element_type=F32)
    visible = ((slot_ids[None, :] <= slot_s[:, None]) & (key_segments == seg_s[:, None])
               & (key_segments != 0))
    scores = jnp.where(visible[:, None, None, :], scores, -jnp.inf)
    peak = jnp.max(scores, axis=-1, keepdims=True)  # max is exact in any order
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    probs = jnp.exp(scores - peak).astype(v1_cache.dtype)
    out1 = jnp.einsum("bgrl,bgld->bgrd", probs, v1_cache, preferred_element_type=F32)
    norm = out1[..., d:]
    return jnp.where(norm > 0, out1[..., :d] / jnp.where(norm > 0, norm, 1.0), 0.0)

  if not exact:
    out = jax.vmap(one_query, in_axes=((1, 1, 1),), out_axes=1)(
        (q, query_slots, query_segments))
    return out.reshape(b, s, h, d)
  out = lax.map(one_query, (jnp.moveaxis(q, 1, 0), query_slots.T, query_segments.T))
  return jnp.moveaxis(out, 0, 1).reshape(b, s, h, d)
