"""Publishes each new inference copy of the weights as a sparse bit-level delta.

After a train step the controller calls `publish(inference_copy(state))`. The publisher
compares the new bits with the last published bits, writes version v as a delta against
v-1 (or a full anchor every `anchor_every` versions, on the first publish, and whenever the
delta would not be smaller), and garbage-collects versions no reader needs any more.
"""
import time
from typing import Dict, Optional, Tuple

import jax
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

  The last published tree stays on the device the weights live on (the publisher keeps a
  reference, so a published tree must not be donated or mutated afterwards): change
  detection runs there, and only changed positions and values cross to the host.
  """

  def __init__(self, root: str, anchor_every: int = 20, keep: int = 8):
    if anchor_every < 1 or keep < 1:
      raise ValueError(f"anchor_every ({anchor_every}) and keep ({keep}) must be >= 1")
    self.root, self.anchor_every, self.keep = root, anchor_every, keep
    self._last: Optional[Dict[str, jax.Array]] = None  # the last published leaves, on device
    self._fps: Dict[str, Tuple[int, int]] = {}
    self._anchor = None
    self.version = store.latest(root)
    if self.version is not None:  # resuming: diff against what is on disk
      from composer_rl.sync.subscriber import materialize  # pylint: disable=g-import-not-at-top
      try:
        self._last = {k: jnp.asarray(v) for k, v in materialize(root, self.version).items()}
        m = store.read_manifest(root, self.version)
        self._anchor = m["anchor"]
        self._fps = {k: tuple(v["fingerprint"]) for k, v in m["leaves"].items()}
      except store.VersionError as e:  # a damaged chain: the next version is an anchor
        logging.warning("weight sync: cannot rebuild version %d (%s); next publish is a "
                        "full anchor", self.version, e)
        self._last = None

  def publish(self, tree) -> Dict:
    """Publishes `tree` (the inference copy) as the next version; returns its manifest."""
    t0 = time.perf_counter()
    flat = codec.flatten_device(tree)
    new = {k: jnp.asarray(v) for k, v in flat.items()}
    shapes = {k: (list(v.shape), str(v.dtype)) for k, v in new.items()}
    version = 0 if self.version is None else self.version + 1
    full_bytes = sum(b.size * b.dtype.itemsize for b in new.values())
    changed = None
    if self._last is not None and version % self.anchor_every != 0:
      if set(self._last) != set(new) or any(
          (self._last[k].shape, self._last[k].dtype) != (new[k].shape, new[k].dtype)
          for k in new):
        raise ValueError("published tree changed structure; start a new weights root")
      masks = {k: codec.changed_mask(self._last[k], new[k]) for k in new}  # dispatch all
      changed = {k: codec.mask_positions(np.asarray(m), new[k].size) for k, m in masks.items()}
      delta_bytes = sum(len(p) * (4 + new[k].dtype.itemsize) for k, p in changed.items())
      if delta_bytes >= full_bytes:
        changed = None  # a delta that is not smaller than the anchor is not worth a link
    leaves, payload, fps = {}, {}, {}
    if changed is None:
      kind = "anchor"
      dev_fps = {k: codec.fingerprint_device(b) for k, b in new.items()}  # dispatch all first
      for k, b in new.items():
        parts = {"bits": codec.bits_of(np.asarray(b))}
        payload[payload_key(k)] = parts["bits"]
        fps[k] = tuple(int(x) for x in np.asarray(dev_fps[k]))
        leaves[k] = _leaf_meta(k, shapes[k], b.size, fps[k], store.payload_sha256(parts))
    else:
      kind = "delta"
      deltas = {}
      for k, b in new.items():
        pos = changed[k]
        if len(pos):
          xors, newv = codec.gather_changes(self._last[k], b, pos)
          deltas[k] = (pos, xors)
          # the old values at pos are the new ones XOR the change
          fps[k] = codec.fingerprint_update(self._fps[k], pos, newv ^ xors, newv)
        else:  # unchanged leaf: nothing stored, same fingerprint
          deltas[k] = (pos, np.zeros(0, np.uint16))
          fps[k] = self._fps[k]
      payload, layout = store.pack_delta(deltas)
      for k in new:
        lay = dict(layout.get(k, {"payload_sha256": store.payload_sha256({})}))
        leaves[k] = _leaf_meta(k, shapes[k], len(changed[k]), fps[k], lay.pop("payload_sha256"),
                               **lay)
    anchor = version if kind == "anchor" else self._anchor
    total_changed = sum(v["nnz"] for v in leaves.values())
    manifest = dict(format=store.FORMAT, version=version,
                    parent=None if kind == "anchor" else version - 1, kind=kind, anchor=anchor,
                    leaves=leaves, changed=int(total_changed),
                    total=int(sum(b.size for b in new.values())),
                    payload_bytes=int(sum(np.asarray(x).nbytes for x in payload.values())),
                    full_bytes=int(full_bytes))
    store.write_version(self.root, version, manifest, payload)
    self.version, self._last, self._anchor, self._fps = version, new, anchor, fps
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


def _leaf_meta(key, shape_dtype, nnz, fp, sha256, **layout) -> Dict:
  return dict(shape=shape_dtype[0], dtype=shape_dtype[1], nnz=int(nnz),
              fingerprint=[int(x) for x in fp], payload_key=payload_key(key),
              payload_sha256=sha256, **layout)
