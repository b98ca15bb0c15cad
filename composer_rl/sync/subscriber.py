"""Follows published weight versions and keeps a verified copy on its own devices.

`poll()` brings the subscriber to the newest version: it replays the deltas after its current
version with a jitted in-place scatter (a fixed capacity per leaf, `codec.leaf_capacity`,
larger deltas in several chunks, so each leaf shape compiles once), and checks each resulting tensor's
fingerprint against the manifest (in full for an anchor, from the changed values for a
delta). A missing, partial, corrupt or out-of-order version stops the
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
    self._keys = list(codec.flatten_device(template).keys())  # abstract templates work too
    self.version: Optional[int] = None
    self._bits: Optional[Dict[str, jax.Array]] = None
    self._metas: Optional[Dict] = None
    self.log = []  # (version, event) lines, also sent to absl logging

  def _note(self, msg: str) -> None:
    logging.warning("weight sync: %s", msg)
    self.log.append(msg)

  @property
  def params(self):
    """The verified weights in the template's structure. The arrays are the subscriber's
    own: the next `poll()` updates them in place (donation), so hand `params` to a new
    consumer after each poll rather than keeping an old tree."""
    if self._bits is None:
      raise VersionError(f"no verified weights under {self.root} yet")
    return jax.tree_util.tree_unflatten(self._treedef, [self._bits[k] for k in self._keys])

  def snapshot(self):
    """A copy of `params` that later polls leave alone (what an engine should hold)."""
    return jax.tree.map(jnp.copy, self.params)

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
    (already-verified versions stay applied), raising VersionError.

    A delta is applied in place (the buffers are donated) and verified from the changed
    values alone (`codec.fingerprint_update`'s identity); if a leaf fails, the leaves
    already changed are restored by applying their XORs again (an exact inverse, since
    positions are checked to be strictly increasing and in range first)."""
    for v in range(first, last + 1):
      m = store.read_manifest(self.root, v)
      if m["kind"] == "delta" and (bits is None or m["parent"] != v - 1):
        raise VersionError(f"version {v}: delta with parent {m['parent']} cannot follow "
                           f"{'nothing' if bits is None else v - 1}")
      payload = store.read_payload(self.root, v, m)
      if m["kind"] == "anchor":
        new = {leaf: jnp.asarray(_unbits(payload[leaf]["bits"], meta))
               for leaf, meta in m["leaves"].items()}
        fps = {leaf: codec.fingerprint_device(b) for leaf, b in new.items()}
        for leaf, meta in m["leaves"].items():
          if np.asarray(fps[leaf]).tolist() != meta["fingerprint"]:
            raise VersionError(f"version {v}: leaf {leaf} fails its fingerprint")
        bits = new
      else:
        bits = self._apply_delta(v, bits, metas, m, payload)
      metas = m["leaves"]
      self._bits, self._metas, self.version = bits, metas, v

  def _apply_delta(self, v: int, bits, metas, m, payload):
    bits = dict(bits)
    work = []  # (leaf, padded positions, padded xors) of the changed leaves
    for leaf, meta in m["leaves"].items():
      if not meta["nnz"]:
        if meta["fingerprint"] != metas[leaf]["fingerprint"]:
          raise VersionError(f"version {v}: unchanged leaf {leaf} changes fingerprint")
        continue
      p = payload[leaf]
      n, size = len(p["gaps"]), int(np.prod(meta["shape"]))
      pos_host = codec.positions(p["gaps"])
      if n != meta["nnz"] or len(p["xor"]) != n or (n and (
          pos_host[-1] >= size or np.any(p["gaps"][1:] == 0))):
        raise VersionError(f"version {v}: leaf {leaf} has malformed change positions")
      cap = codec.leaf_capacity(size)
      chunks = -(-n // cap)
      pos = np.full(chunks * cap, size, np.int32)  # out-of-range padding is dropped
      pos[:n] = pos_host
      xors = np.zeros(chunks * cap, np.uint16 if bits[leaf].dtype.itemsize == 2 else np.uint32)
      xors[:n] = p["xor"]
      work.append((leaf, [(jnp.asarray(pos[i:i + cap]), jnp.asarray(xors[i:i + cap]))
                          for i in range(0, chunks * cap, cap)]))
    # Every position list checked first; then all scatters are dispatched before any
    # fingerprint is read back, so host work and device work overlap.
    diffs = {}
    for leaf, parts in work:
      diffs[leaf] = []
      for pos, xors in parts:
        bits[leaf], d = codec.apply_changes(bits[leaf], pos, xors)
        diffs[leaf].append(d)
    for leaf, _ in work:
      d = np.sum([np.asarray(x, np.uint64) for x in diffs[leaf]], axis=0)  # wraps below
      old = metas[leaf]["fingerprint"]
      got = [(int(old[0]) + int(d[0])) % 2**32, (int(old[1]) + int(d[1])) % 2**32]
      if got != m["leaves"][leaf]["fingerprint"]:
        for leaf2, parts in work:  # XOR again: an exact inverse (distinct positions)
          for pos, xors in parts:
            bits[leaf2], _ = codec.apply_changes(bits[leaf2], pos, xors)
        self._bits = bits  # the donated buffers now hold the previous version again
        raise VersionError(f"version {v}: leaf {leaf} fails its fingerprint after applying")
    return bits
