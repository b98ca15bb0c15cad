"""API keys (stored hashed) and a per-key token-bucket rate limit.

Key file (`--api_key_file`): one key per line, as the SHA-256 hex digest of the key, with an
optional name, `name:sha256hex`; blank lines and lines starting with '#' are ignored. The
server never sees a key in plain text on disk. To make a key:

  python -m composer_rl.serving.auth alice >> keys.txt   # prints the key on stderr once

A request's `Authorization: Bearer <key>` is hashed and compared with every stored digest
in constant time (`hmac.compare_digest`, no early exit). The key's id in records is its
name, or the first 12 hex digits of its digest (which identifies it without revealing it).
"""
import dataclasses
import hashlib
import hmac
import re
import secrets
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

_HEX = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def hash_key(key: str) -> str:
  return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key(name: str = "") -> Tuple[str, str]:
  """(the secret key, its key-file line)."""
  key = "sk-crl-" + secrets.token_urlsafe(32)
  return key, (f"{name}:{hash_key(key)}" if name else hash_key(key))


@dataclasses.dataclass(frozen=True)
class StoredKey:
  digest: bytes     # 32 bytes
  key_id: str


class KeyRing:
  """The accepted keys. `check(bearer)` returns the key id, or None."""

  def __init__(self, keys: List[StoredKey]):
    if not keys:
      raise ValueError("an API key file must hold at least one key")
    self.keys = list(keys)

  @classmethod
  def from_file(cls, path: str) -> "KeyRing":
    keys, seen = [], set()
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        line = line.strip()
        if not line or line.startswith("#"):
          continue
        name, _, hexd = line.rpartition(":")
        hexd = hexd.lower()
        if not _HEX.match(hexd):
          raise ValueError(f"{path}:{n}: expected a SHA-256 hex digest (64 hex digits), "
                           "optionally 'name:' before it -- store hash_key(key), not the key")
        if name and not _NAME.match(name):
          raise ValueError(f"{path}:{n}: key name must be 1-64 of [A-Za-z0-9_.@-]")
        if hexd in seen:
          raise ValueError(f"{path}:{n}: duplicate key digest")
        seen.add(hexd)
        keys.append(StoredKey(bytes.fromhex(hexd), name or hexd[:12]))
    ids = [k.key_id for k in keys]
    if len(set(ids)) != len(ids):
      raise ValueError(f"{path}: key names must be unique")
    return cls(keys)

  def check(self, bearer: Optional[str]) -> Optional[str]:
    if not bearer:
      return None
    got = hashlib.sha256(bearer.encode("utf-8", errors="surrogateescape")).digest()
    found = None
    for k in self.keys:  # no early exit: the time does not depend on which key matched
      if hmac.compare_digest(got, k.digest):
        found = k.key_id
    return found


def bearer_token(authorization: Optional[str]) -> Optional[str]:
  """The token of an `Authorization: Bearer <token>` header (None if absent/malformed)."""
  if not authorization:
    return None
  scheme, _, token = authorization.strip().partition(" ")
  if scheme.lower() != "bearer" or not token.strip():
    return None
  return token.strip()


class RateLimiter:
  """Token bucket per key: `per_minute` requests a minute on average, bursts up to
  `burst` (default: per_minute). per_minute <= 0 disables it."""

  def __init__(self, per_minute: float, burst: Optional[float] = None,
               clock=time.monotonic, max_keys: int = 100_000):
    self.rate = float(per_minute) / 60.0
    self.capacity = float(burst if burst else per_minute)
    self.clock = clock
    self.max_keys = max_keys
    self._buckets: Dict[str, Tuple[float, float]] = {}  # key -> (tokens, time)
    self._lock = threading.Lock()

  @property
  def enabled(self) -> bool:
    return self.rate > 0

  def acquire(self, key: str, cost: float = 1.0) -> Tuple[bool, float]:
    """(allowed, seconds until it would be allowed)."""
    if not self.enabled:
      return True, 0.0
    now = self.clock()
    with self._lock:
      tokens, last = self._buckets.get(key, (self.capacity, now))
      tokens = min(self.capacity, tokens + (now - last) * self.rate)
      if tokens >= cost:
        self._buckets[key] = (tokens - cost, now)
        ok, wait = True, 0.0
      else:
        self._buckets[key] = (tokens, now)
        ok, wait = False, (cost - tokens) / self.rate
      if len(self._buckets) > self.max_keys:  # forget full buckets (anonymous clients)
        for k in [k for k, (t, _) in self._buckets.items() if t >= self.capacity][:1000]:
          del self._buckets[k]
    return ok, wait


def main(argv: List[str]) -> int:
  name = argv[1] if len(argv) > 1 else ""
  if name and not _NAME.match(name):
    print("key name must be 1-64 of [A-Za-z0-9_.@-]", file=sys.stderr)
    return 2
  key, line = new_key(name)
  print(f"API key (shown once; give it to the client): {key}", file=sys.stderr)
  print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
