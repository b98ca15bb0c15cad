"""Bit-level weight deltas: which values changed, where, and a fingerprint of the result.

Weights are compared as their raw bit patterns (bf16 -> uint16, fp32 -> uint32), so "did
not change" means bit-identical, and applying a delta reproduces the published tensor
exactly. A delta for one leaf is the sorted flat positions that changed, delta-coded (gaps
between consecutive positions, uint16 when they all fit, else uint32), and the XOR of the
new and old bit patterns there: a small update flips low mantissa bits, so the XOR's high
bits are almost all zero and zstd removes them.

`fingerprint` is a position-weighted 64-bit sum over the bit patterns in uint32 arithmetic
(wrap-around is associative, so any reduction order gives the same value): computed with
numpy by the publisher and on-device by the subscriber, it verifies a whole tensor without
copying it back to the host. It detects corruption, truncation and reordering; it is not a
defence against a deliberate forger (the payload's sha256 covers the bytes read).
"""
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

_BITS = {2: np.uint16, 4: np.uint32}
_M1, _M2, _M3 = np.uint32(2654435761), np.uint32(0x85EBCA6B), np.uint32(0xC2B2AE35)


def bits_of(x) -> np.ndarray:
  """Flat raw bit patterns of an array (host numpy)."""
  x = np.asarray(x)
  if x.dtype.itemsize not in _BITS:
    raise TypeError(f"cannot diff dtype {x.dtype}")
  return x.reshape(-1).view(_BITS[x.dtype.itemsize])


def flatten(tree) -> Dict[str, np.ndarray]:
  """{'/'-joined key path: host array} for a pytree of arrays (nnx State or dicts)."""
  return {k: np.asarray(v) for k, v in flatten_device(tree).items()}


def flatten_device(tree) -> Dict[str, jax.Array]:
  """Like `flatten`, but leaves stay where they are (no host copy)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    out["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)] = leaf
  return out


def encode(old_bits: np.ndarray, new_bits: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """(gaps, xors) for the positions where `new_bits` differs from `old_bits`."""
  pos = np.flatnonzero(old_bits != new_bits)
  gaps = np.diff(pos, prepend=0)
  if len(pos):
    gaps[0] = pos[0]
  gaps = gaps.astype(np.uint16 if len(gaps) == 0 or gaps.max() < 2**16 else np.uint32)
  return gaps, new_bits[pos] ^ old_bits[pos]


def positions(gaps: np.ndarray) -> np.ndarray:
  return np.cumsum(gaps.astype(np.int64))


def fingerprint_np(bits: np.ndarray) -> Tuple[int, int]:
  with np.errstate(over="ignore"):
    x = bits.astype(np.uint32)
    i = np.arange(x.size, dtype=np.uint32)
    h1 = np.sum((x + np.uint32(1)) * (i * _M1 + np.uint32(0x9E3779B9)), dtype=np.uint32)
    h2 = np.sum((x ^ (i * _M2)) * _M3, dtype=np.uint32)
  return int(h1), int(h2)


@jax.jit
def fingerprint_device(bits: jax.Array) -> jax.Array:
  """Same as `fingerprint_np`, on device: returns uint32[2]."""
  x = bits.reshape(-1).astype(jnp.uint32)
  i = jnp.arange(x.size, dtype=jnp.uint32)
  h1 = jnp.sum((x + jnp.uint32(1)) * (i * jnp.uint32(_M1) + jnp.uint32(0x9E3779B9)),
               dtype=jnp.uint32)
  h2 = jnp.sum((x ^ (i * jnp.uint32(_M2))) * jnp.uint32(_M3), dtype=jnp.uint32)
  return jnp.stack([h1, h2])


def device_bits(x: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(x, jnp.uint16 if x.dtype.itemsize == 2 else jnp.uint32)
