"""A durable group queue on shared storage between the controller and rollout workers.

    ROOT/tickets/g000000000012.json        issued, not yet claimed: {"group_id", "task_index"}
    ROOT/claims/<worker>/g000000000012.json  claimed by a worker (moved there by rename)
    ROOT/results/g000000000012.jsonl       the complete group: a header line, then one
                                           trajectory per line (exact log-prob bits)
    ROOT/workers/<worker>                  heartbeat (its mtime)
    ROOT/STOP                              the controller is done; workers exit

Every write goes to a temporary name and is renamed into place, so nobody ever reads a
partial file, and a claim is an atomic rename of the ticket: of two workers racing for one
ticket exactly one wins. Exactly-once consumption is the controller's: it records consumed
group ids in its checkpointed ledger, drops any result whose group it already consumed (a
duplicate from a reclaimed claim), and on resume re-issues the groups it had issued but
not consumed and that are nowhere in the queue. A killed worker restarted under the same
name first finishes its own claims; claims of a worker whose heartbeat stopped are put
back as tickets (`reclaim`). Pure file operations: no JAX, works on any POSIX filesystem
shared by the processes (a local disk, NFS, a FUSE-mounted bucket).
"""
import json
import os
import time
import uuid
from typing import Dict, Iterator, List, Optional, Tuple


def _name(group_id: int) -> str:
  return f"g{group_id:012d}"


def _gid(filename: str) -> Optional[int]:
  stem = filename.split(".", 1)[0]
  return int(stem[1:]) if stem.startswith("g") and stem[1:].isdigit() else None


def _atomic_write(path: str, text: str) -> None:
  tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex[:10]}")
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class GroupQueue:
  """Both ends of the queue under `root` (see module docstring)."""

  def __init__(self, root: str):
    self.root = root
    for d in ("tickets", "claims", "results", "workers"):
      os.makedirs(os.path.join(root, d), exist_ok=True)

  def _path(self, *parts) -> str:
    return os.path.join(self.root, *parts)

  # ---- controller side -----------------------------------------------------------------
  def issue(self, group_id: int, task_index: int) -> None:
    _atomic_write(self._path("tickets", _name(group_id) + ".json"),
                  json.dumps(dict(group_id=group_id, task_index=task_index)))

  def known(self) -> set:
    """Group ids that are somewhere in the queue (ticket, claim or result)."""
    out = {_gid(f) for f in os.listdir(self._path("tickets"))}
    out |= {_gid(f) for f in os.listdir(self._path("results"))}
    for w in os.listdir(self._path("claims")):
      out |= {_gid(f) for f in os.listdir(self._path("claims", w))}
    return {g for g in out if g is not None}

  def results(self) -> List[int]:
    return sorted(g for g in map(_gid, os.listdir(self._path("results")))
                  if g is not None)

  def read_result(self, group_id: int) -> Tuple[Dict, List[Dict]]:
    """(header, trajectory dicts) of a complete group."""
    with open(self._path("results", _name(group_id) + ".jsonl")) as f:
      lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("group_id") != group_id:
      raise ValueError(f"result of group {group_id} is malformed")
    return lines[0], lines[1:]

  def retire(self, group_id: int) -> None:
    """Deletes a consumed (or duplicate) result."""
    try:
      os.remove(self._path("results", _name(group_id) + ".jsonl"))
    except FileNotFoundError:
      pass

  def reclaim(self, lease_s: float) -> List[int]:
    """Puts back the claims of workers silent for more than `lease_s`; returns their ids."""
    back, now = [], time.time()
    for w in os.listdir(self._path("claims")):
      beat = self._path("workers", w)
      if os.path.exists(beat) and now - os.path.getmtime(beat) <= lease_s:
        continue
      for f in os.listdir(self._path("claims", w)):
        try:
          os.rename(self._path("claims", w, f), self._path("tickets", f))
          back.append(_gid(f))
        except FileNotFoundError:
          pass
    return back

  def stop(self) -> None:
    _atomic_write(self._path("STOP"), "stop")

  # ---- worker side ---------------------------------------------------------------------
  def stopped(self) -> bool:
    return os.path.exists(self._path("STOP"))

  def heartbeat(self, worker: str) -> None:
    _atomic_write(self._path("workers", worker), str(time.time()))

  def my_claims(self, worker: str) -> Iterator[Dict]:
    """Claims this worker holds (after a restart: work it must finish first)."""
    d = self._path("claims", worker)
    os.makedirs(d, exist_ok=True)
    for f in sorted(os.listdir(d)):
      if _gid(f) is not None:
        with open(os.path.join(d, f)) as fh:
          yield json.load(fh)

  def claim(self, worker: str) -> Optional[Dict]:
    """Takes the oldest ticket (atomic rename); None when there is none."""
    d = self._path("claims", worker)
    os.makedirs(d, exist_ok=True)
    for f in sorted(os.listdir(self._path("tickets"))):
      if _gid(f) is None:
        continue
      try:
        os.rename(self._path("tickets", f), os.path.join(d, f))
      except FileNotFoundError:  # another worker won this one
        continue
      with open(os.path.join(d, f)) as fh:
        return json.load(fh)
    return None

  def finish(self, worker: str, group_id: int, trajectories: List[Dict],
             header: Optional[Dict] = None) -> None:
    """Publishes a complete group, then drops the claim (a crash in between leaves a claim
    whose result exists: harmless, the controller consumes the result once)."""
    head = dict(group_id=group_id, worker=worker, **(header or {}))
    _atomic_write(self._path("results", _name(group_id) + ".jsonl"),
                  "".join(json.dumps(x) + "\n" for x in [head] + trajectories))
    try:
      os.remove(self._path("claims", worker, _name(group_id) + ".json"))
    except FileNotFoundError:
      pass
