"""Follows published weight versions and keeps a verified copy on its own devices.

`poll()` brings the subscriber to the newest version: it replays the deltas after its current
version with a jitted scatter (position/value buffers padded to power-of-two capacities, so a
handful of programs serve every step), and checks each resulting tensor's fingerprint on
device against the manifest. A missing, partial, corrupt or out-of-order version stops the
replay with a log line naming it; the subscriber then rebuilds from the newest anchor and
replays what verifies. New weights replace the old only once every leaf of a version has
verified: nothing unverified is ever served.
"""
from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from composer_rl.sync import codec, store
from composer_rl.sync.store import VersionError


@jax.jit
def _scatter_xor(bits, pos, xors):
  old = bits.at[pos].get(mode="fill", fill_value=0)
  return bits.at[pos].set(old ^ xors, mode="drop")


def _capacity(n: int) -> int:
  return max(1024, 1 << max(0, int(n - 1).bit_length()))


def _unbits(bits: np.ndarray, meta: Dict) -> np.ndarray:
  dt = np.dtype(meta["dtype"]) if meta["dtype"] != "bfloat16" else jnp.bfloat16
  return bits.view(dt).reshape(meta["shape"])


def materialize(root: str, version: int) -> Dict[str, np.ndarray]:
  """Host-side reconstruction of `version` (for tools and publisher resume), verified."""
  m = store.read_manifest(root, version)
  chain = list(range(m["anchor"], version + 1))
  bits: Dict[str, np.ndarray] = {}
  metas = None
  for v in chain:
    mv = store.read_manifest(root, v)
    if v != chain[0] and mv.get("parent") != v - 1:
      raise VersionError(f"version {v}: parent {mv.get('parent')} does not chain to {v - 1}")
    payload = store.read_payload(root, v, mv)
    for leaf, meta in mv["leaves"].items():
      if mv["kind"] == "anchor":
        bits[leaf] = payload[leaf]["bits"].copy()
      else:
        p = payload[leaf]
        pos = codec.positions(p["gaps"])
        bits[leaf][pos] ^= p["xor"].astype(bits[leaf].dtype)
      if list(codec.fingerprint_np(bits[leaf])) != meta["fingerprint"]:
        raise VersionError(f"version {v}: leaf {leaf} fails its fingerprint")
    metas = mv["leaves"]
  return {leaf: _unbits(b, metas[leaf]) for leaf, b in bits.items()}


class WeightSubscriber:
  """Keeps the newest verifiable version of the weights under `root` on device.

  template: a pytree with the published tree's structure (e.g. `inference_copy(state)`);
    `params` is returned in that structure.
  """

  def __init__(self, root: str, template):
    self.root = root
    leaves, self._treedef = jax.tree_util.tree_flatten_with_path(template)
    self._keys = list(codec.flatten(template).keys())
    self.version: Optional[int] = None
    self._bits: Optional[Dict[str, jax.Array]] = None
    self._metas: Optional[Dict] = None
    self.log = []  # (version, event) lines, also sent to absl logging

  def _note(self, msg: str) -> None:
    logging.warning("weight sync: %s", msg)
    self.log.append(msg)

  @property
  def params(self):
    if self._bits is None:
      raise VersionError(f"no verified weights under {self.root} yet")
    arrays = [jax.lax.bitcast_convert_type(self._bits[k], jnp.bfloat16)
              if self._metas[k]["dtype"] == "bfloat16" else
              jax.lax.bitcast_convert_type(self._bits[k], jnp.dtype(self._metas[k]["dtype"]))
              for k in self._keys]
    arrays = [a.reshape(self._metas[k]["shape"]) for a, k in zip(arrays, self._keys)]
    return jax.tree_util.tree_unflatten(self._treedef, arrays)

  def poll(self) -> Optional[int]:
    """Advances to the newest version it can verify; returns it if it changed, else None."""
    target = store.latest(self.root)
    if target is None or target == self.version:
      return None
    start = self.version
    if self.version is not None and target > self.version:
      try:
        self._replay(self._bits, self._metas, self.version + 1, target)
        return self.version
      except VersionError as e:
        self._note(f"{e}; falling back to the newest anchor")
    self._from_anchor(target)
    return self.version if self.version != start else None

  def _from_anchor(self, target: int) -> None:
    for v in reversed([x for x in store.list_versions(self.root) if x <= target]):
      try:
        m = store.read_manifest(self.root, v)
      except VersionError as e:
        self._note(str(e))
        continue
      if m["kind"] != "anchor":
        continue
      try:
        self._replay(None, None, v, target)
        return
      except VersionError as e:
        self._note(f"{e}; trying an older anchor")
    self._note(f"no verifiable anchor at or before version {target}; "
               f"staying at {self.version}")

  def _replay(self, bits, metas, first: int, last: int) -> None:
    """Applies versions first..last on top of `bits` (None: `first` must be an anchor).
    Commits each version only after all its leaves verify; stops at the first failure
    (already-verified versions stay applied), raising VersionError."""
    for v in range(first, last + 1):
      m = store.read_manifest(self.root, v)
      if m["kind"] == "delta" and (bits is None or m["parent"] != v - 1):
        raise VersionError(f"version {v}: delta with parent {m['parent']} cannot follow "
                           f"{'nothing' if bits is None else v - 1}")
      payload = store.read_payload(self.root, v, m)
      new = {}
      for leaf, meta in m["leaves"].items():
        p = payload[leaf]
        if m["kind"] == "anchor":
          b = jnp.asarray(p["bits"])
        else:
          n = len(p["gaps"])
          cap = _capacity(n)
          size = int(np.prod(meta["shape"]))
          pos = np.full(cap, size, np.int64)  # out-of-range padding is dropped
          pos[:n] = codec.positions(p["gaps"])
          xors = np.zeros(cap, bits[leaf].dtype)
          xors[:n] = p["xor"]
          b = _scatter_xor(bits[leaf], jnp.asarray(pos, jnp.int32), jnp.asarray(xors))
        got = np.asarray(codec.fingerprint_device(b)).tolist()
        if got != meta["fingerprint"]:
          raise VersionError(f"version {v}: leaf {leaf} fails its fingerprint after applying")
        new[leaf] = b
      bits, metas = new, m["leaves"]
      self._bits, self._metas, self.version = bits, metas, v
