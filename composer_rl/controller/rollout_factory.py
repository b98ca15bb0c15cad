"""The rollout factory: keeps agent sessions running and hands complete groups to training.

A background thread pulls task groups (G rollouts of one task) from the task pipeline,
creates one sandboxed environment per rollout, runs them all through one `RolloutRunner`
(continuous batching on the engine's slots), and puts each *complete* group on a bounded
queue. The trainer consumes groups as they arrive; the queue bound is the back-pressure
that, with `max_staleness`, keeps samples from drifting too far behind the policy.

The ledger (`issued`, `consumed`) makes resume exact: a group is consumed once; groups that
were issued but not consumed when the process died are re-run after a restart.
"""
import dataclasses
import queue
import threading
from typing import Callable, Dict, List, Optional

from composer_rl.rollout.runner import RolloutRunner
from composer_rl.rollout.session import Trajectory


@dataclasses.dataclass
class Group:
  group_id: int
  task_index: int
  trajectories: List[Trajectory]

  @property
  def min_version(self) -> int:
    return min(t.min_version() for t in self.trajectories)


@dataclasses.dataclass
class Ledger:
  """What happened to every task group: issued (task index by group id) and consumed."""
  issued: Dict[int, int] = dataclasses.field(default_factory=dict)
  consumed: List[int] = dataclasses.field(default_factory=list)
  dropped_stale: List[int] = dataclasses.field(default_factory=list)

  def in_flight(self) -> Dict[int, int]:
    done = set(self.consumed) | set(self.dropped_stale)
    return {g: t for g, t in self.issued.items() if g not in done}

  def to_json(self) -> Dict:
    return dict(issued={str(k): v for k, v in self.issued.items()}, consumed=self.consumed,
                dropped_stale=self.dropped_stale)

  @classmethod
  def from_json(cls, d: Optional[Dict]) -> "Ledger":
    if not d:
      return cls()
    return cls(issued={int(k): int(v) for k, v in d["issued"].items()},
               consumed=list(d["consumed"]), dropped_stale=list(d.get("dropped_stale", [])))


class RolloutFactory:
  """Runs groups in a background thread (async) or on demand (sync).

  next_group: returns (group_id, task_index) for the next task visit, or None when done.
  make_env: task_index -> a fresh environment.
  group_size: G rollouts per group.
  max_in_flight: sessions running at once (>= the engine's slots keeps slots busy while
    other sessions wait for tools).
  queue_groups: complete groups buffered for the trainer before the factory pauses.
  """

  def __init__(self, runner: RolloutRunner, next_group: Callable, make_env: Callable,
               group_size: int, max_in_flight: int, queue_groups: int, ledger: Ledger):
    self.runner, self.next_group, self.make_env = runner, next_group, make_env
    self.group_size, self.max_in_flight = group_size, max_in_flight
    self.ledger = ledger
    self.groups: "queue.Queue[Group]" = queue.Queue(maxsize=queue_groups)
    self._partial: Dict[int, List[Trajectory]] = {}
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._jobs: List = []
    self._task_of: Dict[int, int] = {}
    self._deliver = self._to_queue
    self._lock = threading.Lock()
    self.error: Optional[BaseException] = None
    # Re-run what a previous process issued but never consumed, before anything new.
    self._resume = sorted(ledger.in_flight().items())

  # ---- job stream ----------------------------------------------------------------------
  def _next_job(self, limit_groups: Optional[List[int]] = None):
    with self._lock:
      if not self._jobs:
        if limit_groups is not None:
          if limit_groups[0] <= 0:
            return None
          limit_groups[0] -= 1
        if self._resume:
          gid, tidx = self._resume.pop(0)
        else:
          nxt = self.next_group()
          if nxt is None:
            return None
          gid, tidx = nxt
          self.ledger.issued[gid] = tidx
        self._jobs = [(f"{tidx}", gid, self.make_env(tidx)) for _ in range(self.group_size)]
        self._task_of[gid] = tidx
      return self._jobs.pop(0)

  def _emit(self, traj: Trajectory) -> None:
    parts = self._partial.setdefault(traj.group_id, [])
    parts.append(traj)
    if len(parts) == self.group_size:
      del self._partial[traj.group_id]
      self._deliver(Group(traj.group_id, self._task_of.pop(traj.group_id),
                          sorted(parts, key=lambda t: t.session_id)))

  def _to_queue(self, group: Group) -> None:
    while not self._stop.is_set():
      try:
        self.groups.put(group, timeout=0.5)
        return
      except queue.Full:
        continue

  # ---- async ---------------------------------------------------------------------------
  def start(self) -> None:
    def run():
      try:
        self.runner.run_stream(self._next_job, self._emit, self.max_in_flight, self._stop)
      except BaseException as e:  # surfaced to the trainer thread by get()
        self.error = e
    self._thread = threading.Thread(target=run, name="rollout-factory", daemon=True)
    self._thread.start()

  def get(self, timeout: float = 600.0) -> Optional[Group]:
    """Next complete group (async mode); None if the stream ended."""
    while True:
      if self.error is not None:
        raise RuntimeError("rollout factory failed") from self.error
      try:
        return self.groups.get(timeout=0.5)
      except queue.Empty:
        if self._thread is not None and not self._thread.is_alive() and self.groups.empty():
          return None
        timeout -= 0.5
        if timeout <= 0:
          raise TimeoutError("no rollout group arrived in time")

  def stop(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=120)

  # ---- sync ----------------------------------------------------------------------------
  def collect(self, num_groups: int) -> List[Group]:
    """Runs exactly `num_groups` groups to completion with the current weights (sync)."""
    budget, out = [num_groups], []
    self._deliver = out.append
    try:
      self.runner.run_stream(lambda: self._next_job(budget), self._emit, self.max_in_flight)
    finally:
      self._deliver = self._to_queue
    return out
