"""On-disk layout of published weight versions (a local path or any Orbax/tensorstore path).

  ROOT/LATEST                      newest complete version number (replaced atomically)
  ROOT/v00000012/manifest.json     what the version is (see below)
  ROOT/v00000012/payload/          Orbax PyTree checkpoint (OCDBT, zarr3, zstd):
                                     anchor: {leaf: raw bits}
                                     delta:  {"gaps2": uint16[.], "gaps4": uint32[.],
                                              "xor2": uint16[.], "xor4": uint32[.]}
                                              (an array is absent when empty)

A delta packs every changed leaf into at most four arrays (gaps of the leaves whose gaps
fit 16 bits, of those that need 32; the XORs of the 2-byte and of the 4-byte leaves), in
manifest order: Orbax's cost grows with the number of arrays it writes, and a model has
hundreds of leaves. A leaf's gaps restart at its first changed position (stored in the
manifest as `first`; its gap slot holds 0).

manifest.json = {"format": "composer_rl.weights/2", "version", "parent" (null for an anchor),
"kind": "anchor"|"delta", "anchor": the anchor version this chain starts from, "leaves":
{leaf: {"shape", "dtype", "nnz", "fingerprint": [h1, h2], "payload_sha256", and for a
changed leaf of a delta "first", "gap_width", "offset" (into its gaps array), "xor_offset"
(into its xor array)}},
"changed", "total", "payload_bytes", "full_bytes"}.

A version is written under a temporary name and renamed into place, then LATEST is
replaced: a reader never sees a partial version.
"""
import hashlib
import json
import os
import shutil
import uuid
from typing import Dict, List, Optional, Tuple

import numpy as np
import orbax.checkpoint as ocp

FORMAT = "composer_rl.weights/2"


class VersionError(RuntimeError):
  """A version is missing, partial, corrupt or does not chain; the message says which."""


def version_dir(root: str, version: int) -> str:
  return os.path.join(root, f"v{version:08d}")


def payload_sha256(arrays: Dict[str, np.ndarray]) -> str:
  h = hashlib.sha256()
  for k in sorted(arrays):
    h.update(k.encode())
    h.update(np.ascontiguousarray(arrays[k]).tobytes())
  return h.hexdigest()


def _checkpointer():
  return ocp.PyTreeCheckpointer(use_ocdbt=True, use_zarr3=True, use_compression=True)


def write_version(root: str, version: int, manifest: Dict, payload: Dict) -> None:
  os.makedirs(root, exist_ok=True)
  final = version_dir(root, version)
  if os.path.exists(final):
    raise VersionError(f"version {version} already exists at {final}")
  tmp = os.path.join(root, f".tmp-{version:08d}-{uuid.uuid4().hex[:8]}")
  os.makedirs(tmp)
  try:
    # A delta of an unchanged tree (e.g. a skipped update) has no arrays; Orbax refuses an
    # empty item, so it gets a one-byte marker that readers never look up.
    _checkpointer().save(os.path.join(tmp, "payload"),
                         payload or {"_empty": np.zeros(1, np.uint8)})
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
      json.dump(manifest, f)
      f.flush()
      os.fsync(f.fileno())
    os.rename(tmp, final)  # atomic: the version appears whole or not at all
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  set_latest(root, version)


def set_latest(root: str, version: int) -> None:
  tmp = os.path.join(root, f".LATEST-{uuid.uuid4().hex[:8]}")
  with open(tmp, "w") as f:
    f.write(str(version))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(root, "LATEST"))


def latest(root: str) -> Optional[int]:
  try:
    with open(os.path.join(root, "LATEST")) as f:
      return int(f.read().strip())
  except (FileNotFoundError, ValueError):
    return None


def read_manifest(root: str, version: int) -> Dict:
  path = os.path.join(version_dir(root, version), "manifest.json")
  try:
    with open(path) as f:
      m = json.load(f)
  except FileNotFoundError as e:
    raise VersionError(f"version {version}: missing ({path})") from e
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise VersionError(f"version {version}: corrupt manifest ({e})") from e
  if m.get("format") != FORMAT or m.get("version") != version:
    raise VersionError(f"version {version}: manifest is not a {FORMAT} manifest of this "
                       f"version (format={m.get('format')!r}, version={m.get('version')!r})")
  return m


def pack_delta(changes: Dict[str, Tuple[np.ndarray, np.ndarray]]) -> Tuple[Dict, Dict]:
  """Packs {leaf: (sorted flat positions, XOR bits)} into the delta payload.

  Returns (payload, layout): layout[leaf] = {"first", "gap_width", "offset",
  "xor_offset", "payload_sha256"} for every leaf with changes (the sha256 covers that
  leaf's slices of the payload)."""
  parts = {f"{kind}{w}": [] for kind in ("gaps", "xor") for w in (2, 4)}
  ends = dict.fromkeys(parts, 0)
  layout = {}
  for leaf, (pos, xors) in changes.items():
    if not len(pos):
      continue
    gaps = np.diff(pos, prepend=pos[0])  # 0 at the leaf's first position
    gw = 2 if gaps.max() < 2**16 else 4  # per leaf: one sparse leaf does not widen all
    xw = xors.dtype.itemsize
    layout[leaf] = dict(first=int(pos[0]), gap_width=gw, offset=ends[f"gaps{gw}"],
                        xor_offset=ends[f"xor{xw}"])
    parts[f"gaps{gw}"].append(gaps.astype(np.uint16 if gw == 2 else np.uint32))
    parts[f"xor{xw}"].append(xors)
    ends[f"gaps{gw}"] += len(pos)
    ends[f"xor{xw}"] += len(pos)
  payload = {k: np.concatenate(v) for k, v in parts.items() if v}
  for leaf, lay in layout.items():
    n, width = len(changes[leaf][0]), changes[leaf][1].dtype.itemsize
    lay["payload_sha256"] = payload_sha256(_delta_slices(payload, lay, n, width))
  return payload, layout


def _delta_slices(payload: Dict, lay: Dict, n: int, xor_width: int) -> Dict[str, np.ndarray]:
  """A leaf's {"gaps", "xor"} slices of a packed delta payload (shorter if truncated)."""
  gaps = payload[f"gaps{lay['gap_width']}"]
  xors = payload[f"xor{xor_width}"]
  return {"gaps": gaps[lay["offset"]:lay["offset"] + n],
          "xor": xors[lay["xor_offset"]:lay["xor_offset"] + n]}


def read_payload(root: str, version: int, manifest: Dict) -> Dict:
  """Reads and sha256-verifies a version's payload, per leaf: {"bits"} (anchor) or
  {"gaps", "xor"} (delta; gaps[0] is the leaf's first changed position)."""
  path = os.path.join(version_dir(root, version), "payload")
  try:
    payload = _checkpointer().restore(path)
  except Exception as e:  # tensorstore raises many types for damaged files
    raise VersionError(f"version {version}: unreadable payload ({type(e).__name__}: {e})") from e
  if not isinstance(payload, dict):
    raise VersionError(f"version {version}: payload is not a tree of arrays")
  payload = {k: np.asarray(v) for k, v in payload.items()}
  out = {}
  for leaf, meta in manifest["leaves"].items():
    if manifest["kind"] == "anchor":
      if meta["payload_key"] not in payload:
        raise VersionError(f"version {version}: payload lacks leaf {leaf}")
      arrays = {"bits": payload[meta["payload_key"]]}
    elif meta["nnz"] == 0:  # unchanged leaf: nothing stored
      out[leaf] = {"gaps": np.zeros(0, np.int64), "xor": np.zeros(0, np.uint16)}
      continue
    else:
      n = int(meta["nnz"])
      width = 2 if meta["dtype"] in ("bfloat16", "float16", "uint16", "int16") else 4
      if (f"gaps{meta.get('gap_width')}" not in payload or f"xor{width}" not in payload):
        raise VersionError(f"version {version}: payload lacks the arrays of leaf {leaf}")
      arrays = _delta_slices(payload, meta, n, width)
      if len(arrays["gaps"]) != n or len(arrays["xor"]) != n:
        raise VersionError(f"version {version}: payload of {leaf} is truncated")
    if payload_sha256(arrays) != meta["payload_sha256"]:
      raise VersionError(f"version {version}: payload of {leaf} fails its sha256")
    if manifest["kind"] == "delta":
      gaps = arrays["gaps"].astype(np.int64)
      gaps[0] = meta["first"]
      arrays = {"gaps": gaps, "xor": arrays["xor"]}
    out[leaf] = arrays
  return out


def list_versions(root: str) -> List[int]:
  if not os.path.isdir(root):
    return []
  out = []
  for name in os.listdir(root):
    if name.startswith("v") and name[1:].isdigit():
      out.append(int(name[1:]))
  return sorted(out)
