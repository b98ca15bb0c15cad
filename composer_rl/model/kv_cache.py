"""Fixed-length KV cache shared by prefill, decode and the training forward."""
from typing import Tuple

import flax.struct
import jax
import jax.numpy as jnp

from composer_rl.model.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values for `max_seq_len` slots.

  Attributes:
    k: per layer, [B, kv_heads, max_seq_len, head_dim] in the compute dtype.
    v: per layer, [B, kv_heads, max_seq_len, head_dim] in the compute dtype.
    segments: [B, max_seq_len] int32 segment id per slot, 0 for never-written slots.
  """
  k: Tuple[jax.Array, ...]
  v: Tuple[jax.Array, ...]
  segments: jax.Array

  @classmethod
  def init(cls, config: ModelConfig, batch: int) -> "KVCache":
    shape = (batch, config.num_kv_heads, config.max_seq_len, config.head_dim)
    dt = config.compute_jnp_dtype
    return cls(
        k=tuple(jnp.zeros(shape, dt) for _ in range(config.num_layers)),
        v=tuple(jnp.zeros(shape, dt) for _ in range(config.num_layers)),
        segments=jnp.zeros((batch, config.max_seq_len), jnp.int32))

  @property
  def batch(self) -> int:
    return self.segments.shape[0]

  @property
  def length(self) -> int:
    return self.segments.shape[1]


def write_slots(cache_array: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
  """cache [B, G, L, D'] <- new [B, S, G, D'] at slots [B, S]; out-of-range slots dropped."""
  b, s = slots.shape
  batch_idx = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
  return cache_array.at[batch_idx, :, slots].set(new.astype(cache_array.dtype), mode="drop")


def write_segments(segments: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
  b, s = slots.shape
  batch_idx = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
  return segments.at[batch_idx, slots].set(new, mode="drop")
