"""Bit-level weight deltas: which values changed, where, and a fingerprint of the result.

Weights are compared as their raw bit patterns (bf16 -> uint16, fp32 -> uint32), so "did
not change" means bit-identical, and applying a delta reproduces the published tensor
exactly. A delta for one leaf is the sorted flat positions that changed, delta-coded (gaps
between consecutive positions, uint16 when they all fit, else uint32), and the XOR of the
new and old bit patterns there: a small update flips low mantissa bits, so the XOR's high
bits are almost all zero and zstd removes them.

`fingerprint` is a position-weighted 64-bit sum over the bit patterns in uint32 arithmetic
(wrap-around is associative, so any reduction order gives the same value): computed with
numpy or on device, it verifies a whole tensor without copying it back to the host. It
detects corruption, truncation and reordering; it is not a defence against a deliberate
forger (the payload's sha256 covers the bytes read).

Because it is a sum of per-position terms, the fingerprint of the tensor after a delta is
the old fingerprint plus the change of the terms at the changed positions
(`fingerprint_update`), an exact identity in wrap-around arithmetic: publisher and
subscriber verify a whole tensor in O(changed values), starting from a tensor that was
itself verified (an anchor's fingerprint is computed in full).

Change detection (`changed_mask`, `gather_changes`): the publisher keeps the last published
tree on device, compares it there with the new one, and copies to the host a packed bit
mask (1/16 of the bf16 bytes) and then only the changed values.
"""
import functools
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
def fingerprint_device(x: jax.Array) -> jax.Array:
  """Same as `fingerprint_np`, on device, of an array's bits (any 2- or 4-byte dtype):
  returns uint32[2]."""
  x = device_bits(x).reshape(-1).astype(jnp.uint32)
  i = jnp.arange(x.size, dtype=jnp.uint32)
  h1 = jnp.sum((x + jnp.uint32(1)) * (i * jnp.uint32(_M1) + jnp.uint32(0x9E3779B9)),
               dtype=jnp.uint32)
  h2 = jnp.sum((x ^ (i * jnp.uint32(_M2))) * jnp.uint32(_M3), dtype=jnp.uint32)
  return jnp.stack([h1, h2])


def _terms(x, i, xp):
  """The two per-position fingerprint terms (uint32, wrapping), numpy or jax.numpy."""
  x, i = x.astype(xp.uint32), i.astype(xp.uint32)
  t1 = (x + xp.uint32(1)) * (i * xp.uint32(_M1) + xp.uint32(0x9E3779B9))
  t2 = (x ^ (i * xp.uint32(_M2))) * xp.uint32(_M3)
  return t1, t2


def fingerprint_update(fp, pos: np.ndarray, old: np.ndarray, new: np.ndarray) -> Tuple[int, int]:
  """The fingerprint after values at `pos` changed from `old` to `new` (host, numpy)."""
  with np.errstate(over="ignore"):
    o1, o2 = _terms(old, pos, np)
    n1, n2 = _terms(new, pos, np)
    d1 = np.sum(n1 - o1, dtype=np.uint32)
    d2 = np.sum(n2 - o2, dtype=np.uint32)
    return int(np.uint32(fp[0]) + d1), int(np.uint32(fp[1]) + d2)


@jax.jit
def changed_mask(old: jax.Array, new: jax.Array) -> jax.Array:
  """Which values' bits differ, packed 8 per byte (uint8[ceil(size / 8)]): what crosses to
  the host is 1/16 of a bf16 tensor, whatever changed."""
  return jnp.packbits(device_bits(old).reshape(-1) != device_bits(new).reshape(-1))


def mask_positions(packed: np.ndarray, size: int) -> np.ndarray:
  """Sorted flat positions of the set bits of a `changed_mask` (host). Only the nonzero
  bytes are unpacked, so the cost follows the changes, not the tensor."""
  nz = np.flatnonzero(packed)
  r, c = np.nonzero(np.unpackbits(packed[nz]).reshape(-1, 8))
  pos = nz[r].astype(np.int64) * 8 + c
  return pos[pos < size]


@jax.jit
def _gather_device(old, new, pos):
  old, new = device_bits(old).reshape(-1), device_bits(new).reshape(-1)
  newv = new.at[pos].get(mode="fill", fill_value=0)
  return newv ^ old.at[pos].get(mode="fill", fill_value=0), newv


def gather_changes(old: jax.Array, new: jax.Array, pos: np.ndarray):
  """(xors, new bits) at `pos`, on the host. On a CPU device the arrays already are host
  memory (numpy views, no copy); elsewhere the gather runs on device over a power-of-two
  padded position buffer (few compiled programs) and only the gathered values travel."""
  if all(d.platform == "cpu" for d in new.devices()):
    o, n = bits_of(np.asarray(old))[pos], bits_of(np.asarray(new))[pos]
    return o ^ n, n
  padded = np.full(capacity(len(pos)), old.size, np.int32)
  padded[:len(pos)] = pos
  xors, newv = _gather_device(old, new, jnp.asarray(padded))
  return np.asarray(xors)[:len(pos)], np.asarray(newv)[:len(pos)]


@functools.partial(jax.jit, donate_argnums=0)
def apply_changes(x: jax.Array, pos: jax.Array, xors: jax.Array):
  """Applies XOR-coded changes to `x` (any shape; 2- or 4-byte dtype) at flat positions, in
  place (`x` is donated; padding positions >= size are dropped). Returns (new array,
  uint32[2] fingerprint change)."""
  bits = device_bits(x).reshape(-1)
  live = pos < bits.size
  old = bits.at[pos].get(mode="fill", fill_value=0)
  new = old ^ xors
  o1, o2 = _terms(old, pos, jnp)
  n1, n2 = _terms(new, pos, jnp)
  zero = jnp.uint32(0)
  d = jnp.stack([jnp.sum(jnp.where(live, n1 - o1, zero), dtype=jnp.uint32),
                 jnp.sum(jnp.where(live, n2 - o2, zero), dtype=jnp.uint32)])
  out = bits.at[pos].set(new, mode="drop").reshape(x.shape)
  return jax.lax.bitcast_convert_type(out, x.dtype), d


def capacity(n: int) -> int:
  """Power-of-two buffer size for n changes: a handful of compiled programs serve all."""
  return max(1024, 1 << max(0, int(n - 1).bit_length()))


def leaf_capacity(size: int) -> int:
  """Fixed scatter capacity for a leaf of `size` values: a power of two near 1/32 of it
  (RL steps change ~1-4% of the bf16 values), at least 1024, at most the next power of
  two of `size`. A delta larger than this is applied in several chunks of the same size,
  so each leaf shape compiles its scatter once, whatever the step's delta."""
  whole = 1 << max(0, int(size - 1).bit_length())
  return min(whole, max(1024, 1 << max(0, int(size // 32 - 1).bit_length())))


def device_bits(x: jax.Array) -> jax.Array:
  """An array's raw bit patterns (same shape), as uint16 or uint32."""
  if x.dtype.itemsize not in _BITS:
    raise TypeError(f"cannot diff dtype {x.dtype}")
  target = jnp.uint16 if x.dtype.itemsize == 2 else jnp.uint32
  return x if x.dtype == target else jax.lax.bitcast_convert_type(x, target)
