"""Publishes each new inference copy of the weights as a sparse bit-level delta.

After a train step the controller calls `publish(inference_copy(state))`. The publisher
compares the new bits with the last published bits, writes version v as a delta against
v-1 (or a full anchor every `anchor_every` versions, on the first publish, and whenever the
delta would not be smaller), and garbage-collects versions no reader needs any more.
"""
import time
from typing import Dict, Optional

import jax.numpy as jnp
import numpy as np
from absl import logging

from composer_rl.sync import codec, store


def payload_key(leaf: str) -> str:
  """Orbax treats '/' as structure; leaf paths are flattened to a safe key."""
  return leaf.replace("/", "__")


class WeightPublisher:
  """Writes versions under `root` (see `composer_rl.sync.store` for the format).

  anchor_every: a full anchor every this many versions bounds how long a chain a new or
    lagging subscriber must replay, and how much damage one corrupt delta can do.
  keep: versions kept behind the newest; older ones are deleted, except the anchor and
    deltas still needed to rebuild any kept version.
  """

  def __init__(self, root: str, anchor_every: int = 20, keep: int = 8):
    if anchor_every < 1 or keep < 1:
      raise ValueError(f"anchor_every ({anchor_every}) and keep ({keep}) must be >= 1")
    self.root, self.anchor_every, self.keep = root, anchor_every, keep
    self._last: Optional[Dict[str, np.ndarray]] = None
    self._anchor = None
    self.version = store.latest(root)
    if self.version is not None:  # resuming: diff against what is on disk
      from composer_rl.sync.subscriber import materialize  # pylint: disable=g-import-not-at-top
      try:
        self._last = {k: codec.bits_of(v) for k, v in materialize(root, self.version).items()}
        self._anchor = store.read_manifest(root, self.version)["anchor"]
      except store.VersionError as e:  # a damaged chain: the next version is an anchor
        logging.warning("weight sync: cannot rebuild version %d (%s); next publish is a "
                        "full anchor", self.version, e)

  def publish(self, tree) -> Dict:
    """Publishes `tree` (the inference copy) as the next version; returns its manifest."""
    t0 = time.perf_counter()
    # Fingerprints are computed where the weights live (dispatched before the host copy).
    device_fps = {k: codec.fingerprint_device(codec.device_bits(jnp.asarray(v)))
                  for k, v in codec.flatten_device(tree).items()}
    arrays = codec.flatten(tree)
    bits = {k: codec.bits_of(v) for k, v in arrays.items()}
    version = 0 if self.version is None else self.version + 1
    delta = None
    if self._last is not None and version % self.anchor_every != 0:
      if set(self._last) != set(bits) or any(self._last[k].shape != bits[k].shape for k in bits):
        raise ValueError("published tree changed structure; start a new weights root")
      delta = {k: codec.encode(self._last[k], bits[k]) for k in bits}
      delta_bytes = sum(g.nbytes + v.nbytes for g, v in delta.values())
      if delta_bytes >= sum(b.nbytes for b in bits.values()):
        delta = None  # a delta that is not smaller than the anchor is not worth a chain link
    leaves, payload, changed = {}, {}, 0
    for k, b in bits.items():
      if delta is None:
        parts = {"bits": b}
        payload[payload_key(k)] = b
        nnz = b.size
      else:
        gaps, values = delta[k]
        parts = {"gaps": gaps, "xor": values}
        if len(gaps):
          payload[payload_key(k)] = parts
        nnz = len(gaps)
      changed += nnz
      leaves[k] = dict(shape=list(arrays[k].shape), dtype=str(arrays[k].dtype), nnz=int(nnz),
                       fingerprint=[int(x) for x in np.asarray(device_fps[k])],
                       payload_key=payload_key(k), payload_sha256=store.payload_sha256(parts))
    kind = "anchor" if delta is None else "delta"
    anchor = version if kind == "anchor" else self._anchor
    manifest = dict(format=store.FORMAT, version=version,
                    parent=None if kind == "anchor" else version - 1, kind=kind, anchor=anchor,
                    leaves=leaves, changed=int(changed),
                    total=int(sum(b.size for b in bits.values())),
                    payload_bytes=int(sum(np.asarray(x).nbytes for x in _leaves(payload))),
                    full_bytes=int(sum(b.nbytes for b in bits.values())))
    store.write_version(self.root, version, manifest, payload)
    self.version, self._last, self._anchor = version, bits, anchor
    self._gc()
    manifest["publish_seconds"] = time.perf_counter() - t0
    return manifest

  def _gc(self) -> None:
    """Deletes versions older than the anchor that rebuilds the oldest kept version."""
    import shutil  # pylint: disable=g-import-not-at-top
    versions = store.list_versions(self.root)
    oldest_kept = self.version - self.keep + 1
    needed_anchor = None
    for v in reversed(versions):
      if v <= max(oldest_kept, 0):
        try:
          needed_anchor = store.read_manifest(self.root, v)["anchor"]
        except store.VersionError:
          continue
        break
    if needed_anchor is None:
      return
    for v in versions:
      if v < needed_anchor:
        logging.info("weight sync: deleting version %d (older than anchor %d)", v, needed_anchor)
        shutil.rmtree(store.version_dir(self.root, v), ignore_errors=True)


def _leaves(payload):
  for v in payload.values():
    if isinstance(v, dict):
      yield from v.values()
    else:
      yield v
