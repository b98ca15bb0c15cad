"""Fixed-length KV cache shared by prefill, decode and the training forward."""
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from composer_rl.model.config import ModelConfig
from composer_rl.ops import exact


@flax.struct.dataclass
class KVCache:
  """Every layer's keys and values for `length` slots (the model's layer loop indexes the
  layer axis; the batch stays the leading axis of every field).

  Attributes:
    k: [B, num_layers, kv_heads, length, head_dim] in the compute dtype, stored as its
      bits (`storage_dtype`: uint16 for bfloat16; `values` reads them back).
    v: like k.
    segments: [B, length] int32 segment id per slot, 0 for never-written slots.
  """
  k: jax.Array
  v: jax.Array
  segments: jax.Array

  @classmethod
  def init(cls, config: ModelConfig, batch: int, length: int = 0) -> "KVCache":
    """An empty cache of `length` slots (default `max_seq_len`)."""
    length = length or config.max_seq_len
    shape = (batch, config.num_layers, config.num_kv_heads, length, config.head_dim)
    dt = storage_dtype(config.compute_jnp_dtype)
    return cls(k=jnp.zeros(shape, dt), v=jnp.zeros(shape, dt),
               segments=jnp.zeros((batch, length), jnp.int32))

  @classmethod
  def for_tokens(cls, config: ModelConfig, batch: int, tokens: int) -> "KVCache":
    """The shortest cache that holds `tokens` per row and that attention accepts (a
    multiple of the key block, at least its first key bucket): a training forward over
    1,024-token rows needs 1,024 slots, not the model's whole window. Attention's bits do
    not depend on how many empty slots follow the keys (`composer_rl.ops.exact`)."""
    if not config.exact_numerics:
      return cls.init(config, batch, min(tokens, config.max_seq_len))
    kb = config.key_block
    length = max(exact.key_buckets(config.max_seq_len, kb)[0], -(-tokens // kb) * kb)
    return cls.init(config, batch, min(length, config.max_seq_len))

  @property
  def batch(self) -> int:
    return self.segments.shape[0]

  @property
  def length(self) -> int:
    return self.segments.shape[1]


def storage_dtype(dtype) -> jnp.dtype:
  """How the cache stores keys and values of `dtype`: 16-bit floats as uint16 bits. XLA:CPU
  scatters a 16-bit float array by converting all of it to f32 and back, which for the
  layer loop's in-place write is every layer's cache, once per layer; a uint16 scatter
  writes only the new slots. The bits are the values'; nothing is rounded."""
  dtype = jnp.dtype(dtype)
  return jnp.dtype(jnp.uint16) if dtype == jnp.bfloat16 else dtype


values = exact.stored_values  # cache contents (or a slice) as the compute dtype's values


def stored(x: jax.Array, like: jax.Array) -> jax.Array:
  """Values `x` as the cache array `like` stores them."""
  if like.dtype == jnp.uint16:
    return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
  return x.astype(like.dtype)


def write_slots(cache_array: jax.Array, new: jax.Array, slots: jax.Array,
                layer: Optional[jax.Array] = None) -> jax.Array:
  """cache [B, G, L, D'] <- new [B, S, G, D'] at slots [B, S]; out-of-range slots dropped.
  With `layer`, cache is every layer's stored [B, num_layers, G, L, D'] and only that
  layer's slots are written (in place inside the model's layer loop; not differentiable).
  Without it, a per-layer cache of values (differentiable: the training forward)."""
  b, s = slots.shape
  batch_idx = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
  if layer is None:
    return cache_array.at[batch_idx, :, slots].set(new.astype(cache_array.dtype), mode="drop")
  return cache_array.at[batch_idx, layer, :, slots].set(stored(new, cache_array),
                                                        mode="drop")


def write_segments(segments: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
  b, s = slots.shape
  batch_idx = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
  return segments.at[batch_idx, slots].set(new, mode="drop")


def bucket_length(length: int, max_len: int, smallest: int = 16) -> int:
  """The cache length kept for a session of `length` tokens: the next power of two (at
  least `smallest`), capped at `max_len`. A few lengths mean a few compiled programs."""
  return min(int(max_len), max(int(smallest), 1 << max(int(length) - 1, 0).bit_length()))


# Fewest slots a decode state's cache has: with the window / 16 below (whichever is larger),
# a window has at most ~5 decode lengths to compile programs for.
DECODE_MIN_SLOTS = 256


def decode_length(config: ModelConfig, tokens: int) -> int:
  """The cache length of a decode state whose sessions hold up to `tokens` tokens: their
  power-of-two bucket (at least DECODE_MIN_SLOTS and max_seq_len / 16), a multiple of the
  key block (what attention reads in), at most max_seq_len."""
  n = bucket_length(tokens, config.max_seq_len,
                    smallest=max(DECODE_MIN_SLOTS, config.max_seq_len // 16))
  kb = config.key_block
  return min(config.max_seq_len, -(-n // kb) * kb)


def resize(cache: KVCache, length: int) -> KVCache:
  """The first `length` slots of every row, or the cache padded with empty slots (zero
  keys and values, segment 0 = never written) up to `length`. Slots past a session's
  tokens are masked out of attention, so resizing never changes a result."""
  def fit(x, axis):
    have = x.shape[axis]
    if have >= length:
      return jax.lax.slice_in_dim(x, 0, length, axis=axis)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - have)
    return jnp.pad(x, pad)
  return KVCache(k=fit(cache.k, 3), v=fit(cache.v, 3), segments=fit(cache.segments, 1))
