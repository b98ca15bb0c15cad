"""Exact and near-duplicate removal for the pretraining corpus (numpy only).

Exact: sha256 of the text with every whitespace run collapsed to one space (so re-indented
or re-wrapped copies count as the same file).

Near: MinHash over shingles of `shingle` consecutive word tokens, with LSH banding
(`bands` x `rows` = `num_perm`). Documents are processed in the given order; a document is
dropped when some already-kept document shares an LSH bucket with it and their estimated
Jaccard similarity (fraction of equal signature entries) is >= `threshold`. The first copy
wins, so the result is deterministic given the order.

Hashing is stable across processes and machines (crc32 of each token, a fixed polynomial
over each shingle's token hashes, permutations (a*h + b) mod (2**31 - 1) with a, b drawn
from a seeded numpy generator): Python's salted `hash()` is never used.
"""
import hashlib
import re
import zlib
from typing import Dict, List, Sequence

import numpy as np

_MERSENNE = np.uint64((1 << 31) - 1)
_WORD = re.compile(r"\w+")
_SHINGLE_MULT = np.uint64(0x9E3779B1)  # odd 32-bit multiplier for the shingle polynomial
_CHUNK = 8192  # shingles per block when computing a signature (bounds memory for big files)


def normalized_sha256(text: str) -> str:
  """Hex sha256 of `text` with whitespace runs collapsed (exact-duplicate key)."""
  return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


def exact_duplicates(texts: Sequence[str]) -> List[bool]:
  """For each text: True if an earlier text has the same normalized sha256."""
  seen, out = set(), []
  for t in texts:
    h = normalized_sha256(t)
    out.append(h in seen)
    seen.add(h)
  return out


def shingle_hashes(text: str, shingle: int) -> np.ndarray:
  """uint64 hashes (< 2**32) of every window of `shingle` consecutive word tokens.

  A text with fewer tokens than `shingle` gives one shingle of all its tokens (empty text:
  no shingles).
  """
  words = _WORD.findall(text)
  if not words:
    return np.zeros((0,), np.uint64)
  vocab = {w: zlib.crc32(w.encode("utf-8")) for w in set(words)}
  ids = np.fromiter(map(vocab.__getitem__, words), np.uint64, len(words))
  k = min(shingle, len(ids))
  n = len(ids) - k + 1
  h = np.zeros((n,), np.uint64)
  with np.errstate(over="ignore"):  # wrap-around mod 2**64 is the intended arithmetic
    for j in range(k):
      h = h * _SHINGLE_MULT + ids[j:j + n]
  return (h ^ (h >> np.uint64(32))) & np.uint64(0xFFFFFFFF)


class MinHasher:
  """MinHash signatures with `num_perm` seeded permutations."""

  def __init__(self, num_perm: int = 128, shingle: int = 5, seed: int = 0):
    """Args: num_perm: signature length; shingle: word tokens per shingle; seed: draws the
    permutation parameters (same seed -> same signatures everywhere)."""
    rng = np.random.default_rng(seed)
    self.a = rng.integers(1, int(_MERSENNE), num_perm, dtype=np.uint64)[:, None]
    self.b = rng.integers(0, int(_MERSENNE), num_perm, dtype=np.uint64)[:, None]
    self.num_perm = num_perm
    self.shingle = shingle

  def signature(self, text: str) -> np.ndarray:
    """[num_perm] uint64 minima (all _MERSENNE for a text without word tokens)."""
    h = shingle_hashes(text, self.shingle)
    sig = np.full((self.num_perm,), _MERSENNE, np.uint64)
    for s in range(0, len(h), _CHUNK):
      # a < 2**31, h < 2**32: a*h + b < 2**64, no overflow before the modulus.
      v = (self.a * h[None, s:s + _CHUNK] + self.b) % _MERSENNE
      sig = np.minimum(sig, v.min(axis=1))
    return sig


def near_duplicates(texts: Sequence[str], threshold: float = 0.8, num_perm: int = 128,
                    bands: int = 16, shingle: int = 5, seed: int = 0) -> List[bool]:
  """For each text: True if it is a near duplicate of an earlier kept text.

  Args:
    texts: documents in the order that decides which copy is kept (the first).
    threshold: estimated Jaccard similarity of shingle sets at or above which two texts are
      duplicates.
    num_perm: MinHash signature length (must be divisible by `bands`).
    bands: LSH bands; rows per band = num_perm // bands. 16 x 8 makes a pair at Jaccard 0.8
      a candidate with probability 0.95 and one at 0.5 with probability 0.06.
    shingle: word tokens per shingle.
    seed: permutation seed.
  """
  if num_perm % bands:
    raise ValueError(f"num_perm ({num_perm}) must be divisible by bands ({bands})")
  rows = num_perm // bands
  hasher = MinHasher(num_perm, shingle, seed)
  buckets: List[Dict[bytes, List[int]]] = [{} for _ in range(bands)]
  kept_sigs: List[np.ndarray] = []
  out = []
  for t in texts:
    sig = hasher.signature(t)
    keys = [sig[i * rows:(i + 1) * rows].tobytes() for i in range(bands)]
    cands = {c for i, k in enumerate(keys) for c in buckets[i].get(k, ())}
    dup = any(np.mean(kept_sigs[c] == sig) >= threshold for c in sorted(cands))
    out.append(dup)
    if not dup:
      idx = len(kept_sigs)
      kept_sigs.append(sig)
      for i, k in enumerate(keys):
        buckets[i].setdefault(k, []).append(idx)
  return out


def candidate_probability(similarity: float, bands: int, rows: int) -> float:
  """P(two texts with Jaccard `similarity` share at least one LSH bucket)."""
  return 1.0 - (1.0 - similarity ** rows) ** bands

