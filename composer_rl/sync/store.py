"""On-disk layout of published weight versions (a local path or any Orbax/tensorstore path).

  ROOT/LATEST                      newest complete version number (replaced atomically)
  ROOT/v00000012/manifest.json     what the version is (see below)
  ROOT/v00000012/payload/          Orbax PyTree checkpoint (OCDBT, zarr3, zstd):
                                     anchor: {leaf: raw bits}
                                     delta:  {leaf: {"gaps": uint16|32[n], "xor": bits[n]}}

manifest.json = {"format": "composer_rl.weights/1", "version", "parent" (null for an anchor),
"kind": "anchor"|"delta", "anchor": the anchor version this chain starts from, "leaves":
{leaf: {"shape", "dtype", "nnz", "fingerprint": [h1, h2], "payload_sha256"}}, "changed",
"total", "payload_bytes"}.

A version is written under a temporary name and renamed into place, then LATEST is
replaced: a reader never sees a partial version.
"""
import hashlib
import json
import os
import shutil
import uuid
from typing import Dict, List, Optional

import numpy as np
import orbax.checkpoint as ocp

FORMAT = "composer_rl.weights/1"


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


def read_payload(root: str, version: int, manifest: Dict) -> Dict:
  """Reads and sha256-verifies a version's payload: {leaf: {"bits"} or {"gaps", "xor"}}."""
  path = os.path.join(version_dir(root, version), "payload")
  try:
    payload = _checkpointer().restore(path)
  except Exception as e:  # tensorstore raises many types for damaged files
    raise VersionError(f"version {version}: unreadable payload ({type(e).__name__}: {e})") from e
  out = {}
  for leaf, meta in manifest["leaves"].items():
    part = payload.get(meta["payload_key"]) if isinstance(payload, dict) else None
    if part is None:
      if manifest["kind"] == "delta" and meta["nnz"] == 0:  # unchanged leaf: nothing stored
        part = {"gaps": np.zeros(0, np.uint32), "xor": np.zeros(0, np.uint16)}
      else:
        raise VersionError(f"version {version}: payload lacks leaf {leaf}")
    arrays = part if isinstance(part, dict) else {"bits": part}
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    if (manifest["kind"] != "delta" or meta["nnz"]) and (
        payload_sha256(arrays) != meta["payload_sha256"]):
      raise VersionError(f"version {version}: payload of {leaf} fails its sha256")
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
