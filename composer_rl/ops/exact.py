"""Batch-invariant ("exact") operations: a row's bits never depend on its neighbours.

Measured on XLA:CPU (jaxlib 0.10.2, with `xla_flags.PARITY_FLAGS`; BUILD_NOTES.md §1,
"What breaks it" and `python -m composer_rl.bench.invariance`): a matmul row's bits depend
on how many rows the call has when the contraction is wider than 128 (Eigen's blocking and
inner-dimension sharding change the summation order), when the call has one row (XLA's
own matrix-vector loop) or 2..7 rows and more than 2048 output columns (other Eigen
kernel paths); reductions over the minor axis (norms, softmax, sums)
and element-wise maths do not depend on the row count. So every operation here runs on the
whole batch at once, and only two rules make it exact:

* `dense`: the contraction is cut into fixed chunks of at most `CONTRACTION_CHUNK` (128)
  whose partial products are added in a fixed order; a call with fewer than `MIN_ROWS` (2)
  rows (`WIDE_MIN_ROWS`, 8, above `WIDE_COLS` output columns) or `MIN_COLS` (16) output
  columns is padded to that. Row i's bits are then the same for any number of rows, in
  prefill, decode and the forward inside `value_and_grad`.
* `attention`: scores over the head dimension (<= 128, one chunk), one softmax shift per
  query (the max over its visible keys: exact in any order), and the weighted sum of values
  taken in fixed key blocks (`key_block` <= 128 keys, each block's dot a fixed contraction)
  added in block order, with the normalizer summed block by block the same way. A block a
  query cannot see contributes exact zeros, so a call may read any multiple of the key
  block that covers its visible keys: each call reads the smallest of a few key-length
  buckets (`key_buckets`) that covers the furthest key it can see, picked on device.

Element-wise maths is the same in every program once XLA may not emit fused multiply-adds
(`xla_flags.PARITY_FLAGS`), but XLA:CPU's reduction loops are not: their summation order
follows how the reduction was fused and laid out, which differs between the sampler's and
the trainer's programs. So every sum that feeds a log-prob (norms, softmax normalizers,
top-p's cumulative mass) is a fixed tree of element-wise additions (`row_sum`,
`row_cumsum`), maxima stay reductions (exact in any order), and row-local stages run on
at least `MIN_ROWS` rows (`pad_rows`).

A backend-specific kernel (a Pallas fixed-tile matmul on GPU) can replace `dense` or
`attention` here without touching the model.
"""
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32
# Widest contraction whose per-row bits do not depend on the row count (measured above).
CONTRACTION_CHUNK = 128
# Fewest rows a dot may have: one row is XLA:CPU's own matrix-vector loop (a sequential sum
# without fused multiply-adds), two or more rows Eigen's matrix kernel (a sequential chain of
# fused multiply-adds per 128-wide chunk), measured for 1..300 rows, f32 and bf16, 1 and 8
# devices (`python -m composer_rl.bench.invariance`).
MIN_ROWS = 2
# ...but with more than 2048 output columns (K = 128, 1 device) calls of 2..7 rows take
# other kernel paths than calls of 8 or more (measured at N = 2304..32768; 8 devices did
# not differ): such dots (the head, a wide fused FFN) are padded to 8 rows.
WIDE_COLS = 2048
WIDE_MIN_ROWS = 8
# Fewest output columns: with 8 columns Eigen re-blocks the contraction once the left
# operand passes ~330 KB (measured at 256 x 320 rows and 128 x 656 rows); 16 never did.
MIN_COLS = 16
# Fewest query rows of an attention dot ([rows, <=128] x [<=128, <=128]): one row is a
# matrix-vector kernel; 2..8 rows gave the 16-row bits for 16..128 keys/channels, 1 and 8
# devices (measured).
ATTENTION_MIN_ROWS = 2
# Up to this many rows `dense` runs its chunks as one batched dot.
BATCHED_CHUNK_ROWS = 512


def map_row_tiles(fn: Callable[..., Any], rows: Any, tile: Optional[int]) -> Any:
  """Applies `fn` to fixed-size row tiles of `rows` (a pytree of [R, ...] arrays).

  A memory bound, not an exactness device: with the ops below a row's bits are the same
  whatever the tile. `fn` must be row-local. Rows are padded to a multiple of `tile` by
  repeating the last row (zeros would put e.g. a temperature of 0 into the padding, whose
  NaN partials poison the weight gradient even under a zero cotangent); padding rows are
  computed and dropped. `tile=None` (or a tile covering every row) calls `fn` once.
  Each tile is rematerialized in a backward pass (`jax.checkpoint`): differentiating
  keeps one tile's intermediates at a time, not every tile's.
  """
  leaves = jax.tree.leaves(rows)
  num_rows = leaves[0].shape[0]
  if tile is None or tile >= num_rows:
    return fn(rows)
  num_tiles = -(-num_rows // tile)
  pad = num_tiles * tile - num_rows

  def to_tiles(x):
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), mode="edge")
    return x.reshape((num_tiles, tile) + x.shape[1:])

  out = lax.map(jax.checkpoint(fn), jax.tree.map(to_tiles, rows))
  return jax.tree.map(lambda y: y.reshape((num_tiles * tile,) + y.shape[2:])[:num_rows], out)


def _padded(x: jax.Array, axis: int, size: int) -> jax.Array:
  """x zero-padded along `axis` to `size`, behind an optimization barrier: XLA would
  otherwise rewrite dot(pad(x), w) into pad(dot(x, w)), the small shape padding avoids."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, size - x.shape[axis])
  return lax.optimization_barrier(jnp.pad(x, pad))


def pad_rows(rows: Any, min_rows: int = MIN_ROWS) -> Any:
  """A pytree of [R, ...] arrays with R < min_rows padded to min_rows rows (the last row
  repeated), behind an optimization barrier; others unchanged. Row-local stages run on
  >= MIN_ROWS rows: measured in a decode loop, a one-row call fuses its reductions (the
  RMSNorm's sum of squares) differently from a call of several rows, so a sequence decoded
  alone came out 1 ulp away from the same sequence decoded beside others."""
  num_rows = jax.tree.leaves(rows)[0].shape[0]
  if num_rows >= min_rows:
    return rows
  pad = lambda x: jnp.pad(x, [(0, min_rows - num_rows)] + [(0, 0)] * (x.ndim - 1), mode="edge")
  return lax.optimization_barrier(jax.tree.map(pad, rows))


def min_rows(cols: int) -> int:
  """The fewest rows `dense` computes a dot with `cols` output columns on (fewer are padded
  to it): MIN_ROWS, or WIDE_MIN_ROWS past WIDE_COLS columns."""
  return MIN_ROWS if cols <= WIDE_COLS else WIDE_MIN_ROWS


def dense(x: jax.Array, w: jax.Array, dtype, exact: bool = True) -> jax.Array:
  """x [T, K] @ w [K, N] in `dtype` with fp32 accumulation, row-invariant when `exact`."""
  x, w = x.astype(dtype), w.astype(dtype)
  if not exact:
    return jnp.dot(x, w, preferred_element_type=F32)
  rows, cols = x.shape[0], w.shape[1]
  if rows < min_rows(cols):
    x = _padded(x, 0, min_rows(cols))
  if cols < MIN_COLS:  # e.g. a router over a few experts
    w = _padded(w, 1, MIN_COLS)
  return _chunked_dot(x, w)[:rows, :cols]


@jax.custom_vjp
def _chunked_dot(x: jax.Array, w: jax.Array) -> jax.Array:
  """x [T, K] @ w [K, N] -> fp32, the contraction in fixed CONTRACTION_CHUNK-wide chunks
  added in order. Its gradient is the plain dot's: only the forward's bits must not depend
  on the row count (log-probs); the backward runs the same program on any device count, and
  a chunked backward would pay a zero-pad and an add of the whole [T, K] gradient per
  chunk (measured: ~100 ms of a 680 ms train step)."""
  width = x.shape[1]
  chunks = -(-width // CONTRACTION_CHUNK)
  if chunks > 1 and width % CONTRACTION_CHUNK == 0 and x.shape[0] <= BATCHED_CHUNK_ROWS:
    # Few rows (decode): one dot with the chunks as a batch axis (one call instead of one
    # per chunk; the same bits, measured); many rows: a dot per chunk (a [chunks, rows, N]
    # intermediate would not stay in cache).
    c = CONTRACTION_CHUNK
    parts = jnp.einsum("mck,ckn->cmn", x.reshape(-1, chunks, c), w.reshape(chunks, c, -1),
                       preferred_element_type=F32)
    parts = [parts[i] for i in range(chunks)]
  else:
    parts = [jnp.dot(x[:, lo:lo + CONTRACTION_CHUNK], w[lo:lo + CONTRACTION_CHUNK],
                     preferred_element_type=F32) for lo in range(0, width, CONTRACTION_CHUNK)]
  out = parts[0]
  for part in parts[1:]:  # added in a fixed order
    out = out + part
  return out


def _chunked_dot_fwd(x, w):
  return _chunked_dot(x, w), (x, w)


def _chunked_dot_bwd(residuals, g):
  x, w = residuals
  return jax.vjp(lambda x, w: jnp.dot(x, w, preferred_element_type=F32), x, w)[1](g)


_chunked_dot.defvjp(_chunked_dot_fwd, _chunked_dot_bwd)


def pairwise_sum(x: jax.Array, axis: int = -1) -> jax.Array:
  """Sum over `axis` in an order no program changes.

  XLA:CPU's reduction loops sum in an order that depends on how the reduction was fused
  and laid out (measured: the same RMSNorm rows differed by 1 ulp between the sampler's
  and the trainer's programs, even from a materialized input; a norm scale's gradient
  differed between the 1-device and the FSDP train step, whose reduction feeds a
  reduce-scatter). Element-wise additions are never reordered, so the sum is a fixed tree
  of them: the axis is zero-padded to a power of two and folded in halves (pairwise
  summation), all in one fused loop.
  """
  axis = axis % x.ndim
  n = x.shape[axis]
  width = 1 << max(n - 1, 0).bit_length()
  if width > n:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, width - n)
    x = jnp.pad(x, pad)  # zeros add nothing
  while width > 1:
    width //= 2
    x = (lax.slice_in_dim(x, 0, width, axis=axis)
         + lax.slice_in_dim(x, width, 2 * width, axis=axis))
  return lax.index_in_dim(x, 0, axis, keepdims=False)


def row_sum(x: jax.Array) -> jax.Array:
  """Sum over the last axis of fp32 `x` [..., n] -> [...], in an order no program changes
  (`pairwise_sum`)."""
  return pairwise_sum(x.astype(F32), -1)


def row_cumsum(x: jax.Array) -> jax.Array:
  """Inclusive cumulative sum over the last axis of fp32 `x` [..., n], in a fixed order (see
  `row_sum`): log2(n) rounds of adding the array shifted by 1, 2, 4, ... places."""
  x = x.astype(F32)
  n, shift = x.shape[-1], 1
  while shift < n:
    x = x + jnp.pad(x[..., :n - shift], [(0, 0)] * (x.ndim - 1) + [(shift, 0)])
    shift *= 2
  return x


def log_softmax(x: jax.Array) -> jax.Array:
  """log-softmax over the last axis with `row_sum` for the normalizer."""
  peak = lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))  # exact in any order
  shifted = x - jnp.where(jnp.isfinite(peak), peak, 0.0)
  return shifted - jnp.log(row_sum(jnp.exp(shifted)))[..., None]


def softmax(x: jax.Array) -> jax.Array:
  """softmax over the last axis with `row_sum` for the normalizer."""
  return jnp.exp(log_softmax(x))


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis in fp32."""
  x = x.astype(F32)
  var = row_sum(x * x)[..., None] / x.shape[-1]
  return _scaled(x * lax.rsqrt(var + eps), scale.astype(F32))


@jax.custom_vjp
def _scaled(x: jax.Array, scale: jax.Array) -> jax.Array:
  """x [..., d] * scale [d]. The scale's gradient sums over every row: with `pairwise_sum`,
  so its bits do not depend on the program around it (the FSDP step reduce-scatters it)."""
  return x * scale


def _scaled_fwd(x, scale):
  return x * scale, (x, scale)


def _scaled_bwd(residuals, g):
  x, scale = residuals
  return g * scale, pairwise_sum((g * x).reshape(-1, scale.shape[-1]), 0)


_scaled.defvjp(_scaled_fwd, _scaled_bwd)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotate-half RoPE. x [T, heads, head_dim], positions [T]; fp32 math."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=F32) * (2.0 / x.shape[-1])))
  angles = positions.astype(F32)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
  x = x.astype(F32)
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def key_buckets(length: int, key_block: int) -> Sequence[int]:
  """Key lengths a call may read: the smallest multiple of key_block with >= MIN_COLS keys,
  doubled until the whole cache."""
  out, n = [], key_block * -(-MIN_COLS // key_block)
  while n < length:
    out.append(n)
    n *= 2
  return tuple(out) + (length,)


def _attend(q, k, v, key_segments, query_slots, query_segments, key_block: int):
  """Attention of q [B, G, M, D] (M = query rows, query-major) over the first n keys.

  k, v: [B, G, n, D]; key_segments [B, n]; query_slots/segments [B, M] per query row.
  key_block > 0: every dot is one (sequence, kv head, key block): [M, D] x [D, key_block]
  scores and [M, key_block] x [key_block, D] values, the blocks a batch axis (a query
  block is never merged with others into one wide dot). key_block=0: one softmax over all
  n keys in one dot (the inexact fast mode).
  """
  b, g, m, d = q.shape
  n = k.shape[2]
  kb = key_block or n
  nb = n // kb
  # The block axis is a batch axis of both operands, so no dot is ever wider than kb keys.
  q = lax.optimization_barrier(jnp.broadcast_to(q[:, :, None], (b, g, nb, m, d)))
  k, v = k.reshape(b, g, nb, kb, d), v.reshape(b, g, nb, kb, d)
  scores = jnp.einsum("bgjmd,bgjkd->bgjmk", q, k, preferred_element_type=F32)
  key_ids = jnp.arange(n, dtype=jnp.int32).reshape(nb, kb)
  kseg = key_segments.reshape(b, 1, nb, 1, kb)
  visible = ((key_ids[None, None, :, None, :] <= query_slots[:, None, None, :, None])
             & (kseg == query_segments[:, None, None, :, None]) & (kseg != 0))
  scores = jnp.where(visible, scores, -jnp.inf)  # [B, G, nb, M, kb]
  peak = jnp.max(scores, axis=(2, 4), keepdims=True)  # exact in any order
  shift = lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
  probs = jnp.exp(scores - shift).astype(v.dtype)
  if key_block and d < MIN_COLS:  # value dots get >= MIN_COLS output columns
    v = _padded(v, 4, MIN_COLS)
  parts = jnp.einsum("bgjmk,bgjkd->bgjmd", probs, v, preferred_element_type=F32)[..., :d]
  totals = (row_sum(probs.astype(F32)) if key_block
            else jnp.sum(probs.astype(F32), axis=-1))[..., None]
  acc, norm = parts[:, :, 0], totals[:, :, 0]
  for j in range(1, nb):  # key blocks added in block order
    acc, norm = acc + parts[:, :, j], norm + totals[:, :, j]
  return jnp.where(norm > 0, acc / jnp.where(norm > 0, norm, 1.0), 0.0)


def stored_values(x: jax.Array) -> jax.Array:
  """KV cache contents as values: the cache stores bfloat16 keys and values as their uint16
  bits (`composer_rl.model.kv_cache.storage_dtype`); other dtypes as they are."""
  return lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == jnp.uint16 else x


def attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, key_segments: jax.Array,
              query_slots: jax.Array, query_segments: jax.Array, exact: bool = True,
              key_block: int = 128, key_len: Optional[int] = None,
              layer: Optional[jax.Array] = None) -> jax.Array:
  """Causal grouped-query attention over a KV cache.

  Args:
    q: [B, S, H, D] queries, already scaled by 1/sqrt(D) and rotated.
    k_cache, v_cache: [B, G, L, D] keys and values for every cache slot (G kv heads).
    key_segments: [B, L] int32 segment id of each slot; 0 = never written.
    query_slots: [B, S] cache slot of each query token (a query sees slots <= its own).
    query_segments: [B, S] segment id of each query (a query sees only its own segment).
    exact: False reads the whole cache in one softmax and one value dot, with no row
      padding (the inexact fast mode).
    key_block: keys per block of the value sum (<= CONTRACTION_CHUNK; divides L). Part of
      the numerics: sampler and trainer share it.
    key_len: a static number of leading slots that covers every key the call can see
      (a multiple of key_block, or L); None picks the smallest `key_buckets` length on
      device.
    layer: with it, k_cache and v_cache hold every layer ([B, num_layers, G, L, D]) and
      this layer's keys are read (only the slots the call reads are sliced out).

  Returns:
    [B, S, H, D] attention outputs in fp32 (zeros for queries that see no key).
  """
  b, s, h, d = q.shape
  g, length = k_cache.shape[-3], k_cache.shape[-2]
  value_dtype = jnp.bfloat16 if k_cache.dtype == jnp.uint16 else k_cache.dtype
  rep = h // g
  if not exact:
    key_block, key_len = 0, length
  elif length % key_block or key_block > CONTRACTION_CHUNK:
    raise ValueError(f"key_block={key_block} must divide the cache length {length} and be "
                     f"<= {CONTRACTION_CHUNK}")
  # Pad the query positions so every attention dot has >= ATTENTION_MIN_ROWS rows; padding
  # queries have segment 0: they see no key and are dropped below.
  s_pad = max(s, -(-ATTENTION_MIN_ROWS // rep)) if exact else s
  pad = [(0, 0), (0, s_pad - s)]
  q = (_padded(q, 1, s_pad) if s_pad > s else q).astype(value_dtype)
  slots, segs = jnp.pad(query_slots, pad), jnp.pad(query_segments, pad)
  rows = q.reshape(b, s_pad, g, rep, d).transpose(0, 2, 1, 3, 4).reshape(b, g, s_pad * rep, d)
  row_slots, row_segs = jnp.repeat(slots, rep, axis=1), jnp.repeat(segs, rep, axis=1)

  def keys(cache, n):
    if layer is None:
      return stored_values(cache[:, :, :n])
    # One slice of this layer's first n slots (slicing all layers first would copy them).
    zero = jnp.zeros((), jnp.int32)
    start = (zero, jnp.asarray(layer, jnp.int32), zero, zero, zero)
    sizes = (cache.shape[0], 1, cache.shape[2], n, cache.shape[4])
    return stored_values(lax.dynamic_slice(cache, start, sizes)[:, 0])

  def run(n):
    return lambda: _attend(rows, keys(k_cache, n), keys(v_cache, n), key_segments[:, :n],
                           row_slots, row_segs, key_block)

  if key_len is not None:
    out = run(key_len)()
  else:
    buckets = key_buckets(length, key_block)
    furthest = jnp.max(jnp.where(segs != 0, slots, 0)) + 1
    index = jnp.sum((jnp.asarray(buckets, jnp.int32) < furthest).astype(jnp.int32))
    out = lax.switch(jnp.minimum(index, len(buckets) - 1), [run(n) for n in buckets])
  out = out.reshape(b, g, s_pad, rep, d).transpose(0, 2, 1, 3, 4)
  return out.reshape(b, s_pad, h, d)[:, :s]
