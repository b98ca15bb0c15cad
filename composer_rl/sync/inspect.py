"""Checkpoint inspection: parameter tables, diffs, chain verification.

Works on published weight roots (`composer_rl.sync.store` layout) and on Orbax training
checkpoints (a CheckpointManager directory of step folders, or one checkpoint folder): any
folder below the chosen step that holds an Orbax PyTree checkpoint is read, and its leaves
are named `item/path/to/leaf`.
"""
import os
from typing import Dict, List, Optional

import numpy as np
import orbax.checkpoint as ocp

from composer_rl.sync import codec, store
from composer_rl.sync.subscriber import materialize


def is_weights_root(path: str) -> bool:
  return os.path.exists(os.path.join(path, "LATEST")) or bool(store.list_versions(path))


def _step_dirs(path: str) -> List[int]:
  return sorted(int(n) for n in os.listdir(path) if n.isdigit() and
                os.path.isdir(os.path.join(path, n)))


def load(path: str, version: Optional[int] = None) -> Dict[str, np.ndarray]:
  """Flat {leaf: array} of a weights version (default newest) or a training checkpoint
  step (default newest)."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no checkpoint directory at {path}")
  if is_weights_root(path):
    v = store.latest(path) if version is None else version
    if v is None:
      raise store.VersionError(f"{path} has no complete version")
    return materialize(path, v)
  steps = _step_dirs(path)
  if steps:
    step = steps[-1] if version is None else version
    if step not in steps:
      raise FileNotFoundError(f"step {step} not in {path} (have {steps})")
    path = os.path.join(path, str(step))
  out = {}
  for d, _, files in os.walk(path):
    if "_METADATA" in files:
      item = os.path.relpath(d, path)
      try:
        tree = ocp.PyTreeCheckpointer().restore(d)
      except Exception as e:  # a partial or corrupt item: say which
        raise store.VersionError(f"unreadable checkpoint item {d}: {type(e).__name__}: {e}")
      prefix = "" if item == "." else item + "/"
      for k, v in codec.flatten(tree).items():
        if v.dtype.kind in "fiub" or str(v.dtype) == "bfloat16":
          out[prefix + k] = v
  if not out:
    raise FileNotFoundError(f"no Orbax PyTree checkpoint found under {path}")
  return out


def describe(tree: Dict[str, np.ndarray]) -> List[Dict]:
  rows = []
  for k, v in sorted(tree.items()):
    f = np.asarray(v, np.float64) if v.size else np.zeros(0)
    rows.append(dict(leaf=k, shape=list(v.shape), dtype=str(v.dtype), bytes=int(v.nbytes),
                     norm=float(np.sqrt(np.sum(f * f))) if f.size else 0.0))
  return rows


def diff(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> List[Dict]:
  """Per leaf: fraction of values whose bits changed, and value-level max/mean |change|."""
  rows = []
  for k in sorted(set(a) | set(b)):
    if k not in a or k not in b or a[k].shape != b[k].shape:
      rows.append(dict(leaf=k, error="missing or shape differs"))
      continue
    x, y = np.asarray(a[k]), np.asarray(b[k])
    changed = (codec.bits_of(x) != codec.bits_of(y)) if x.dtype == y.dtype else (
        x.reshape(-1) != y.reshape(-1))
    d = np.abs(x.astype(np.float64) - y.astype(np.float64)).reshape(-1)
    rows.append(dict(leaf=k, size=int(x.size), changed_fraction=float(changed.mean()),
                     max_abs_change=float(d.max()) if d.size else 0.0,
                     mean_abs_change=float(d.mean()) if d.size else 0.0))
  return rows


def verify(root: str) -> List[Dict]:
  """Rebuilds every version under a weights root from its anchor, checking every link."""
  rows = []
  for v in store.list_versions(root):
    try:
      m = store.read_manifest(root, v)
      materialize(root, v)
      rows.append(dict(version=v, kind=m["kind"], parent=m["parent"], ok=True,
                       changed=m["changed"], payload_bytes=m["payload_bytes"]))
    except (store.VersionError, OSError) as e:
      rows.append(dict(version=v, ok=False, error=str(e)))
  return rows


def table(rows: List[Dict]) -> str:
  if not rows:
    return "(empty)"
  cols = list(dict.fromkeys(k for r in rows for k in r))
  cells = [[str(r.get(c, "")) if not isinstance(r.get(c), float) else f"{r[c]:.6g}"
            for c in cols] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
  line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))
  return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])
