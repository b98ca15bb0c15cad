"""The rollout factory: keeps agent sessions running and hands complete groups to training.

A background thread per inference engine pulls task groups (G rollouts of one task) from
the task pipeline, creates one sandboxed environment per rollout, runs them through its
`RolloutRunner` (continuous batching on that engine's slots), and puts each *complete* group
on a bounded queue (a group's sessions all run on one engine, under one weight stream). The trainer consumes groups as they arrive; the queue bound is the back-pressure
that, with `max_staleness`, keeps samples from drifting too far behind the policy.

The ledger (`issued`, `consumed`) makes resume exact: a group is consumed once; groups that
were issued but not consumed when the process died are re-run after a restart.
"""
import dataclasses
import queue
import threading
from typing import Callable, Dict, List, Optional

from composer_rl.rollout.runner import NOT_YET, RolloutRunner
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

  def num_in_flight(self) -> int:
    return len(self.issued) - len(self.consumed) - len(self.dropped_stale)

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
  """Runs groups in background threads (async) or on demand (sync).

  runners: one `RolloutRunner` per inference engine (mesh); each pulls whole groups.
  next_group: returns (group_id, task_index) for the next task visit, or None when done.
  make_env: task_index -> a fresh environment.
  group_size: G rollouts per group.
  max_in_flight: sessions running at once per runner (>= the engine's slots keeps slots
    busy while other sessions wait for tools).
  queue_groups: complete groups buffered for the trainer before the factory pauses.
  place_params: (train params, runner index) -> that runner's params (e.g. the inference
    copy moved onto its mesh).
  max_outstanding: groups issued but not yet consumed (running or queued) before the factory
    waits; this bounds how far rollouts run ahead of training, hence their staleness:
    (S + 1) * groups_per_step keeps it at about S versions. None = unbounded.
  """

  def __init__(self, runners: List[RolloutRunner], next_group: Callable, make_env: Callable,
               group_size: int, max_in_flight: int, queue_groups: int, ledger: Ledger,
               max_outstanding: Optional[int] = None,
               place_params: Callable = lambda params, runner: params):
    self.runners, self.next_group, self.make_env = list(runners), next_group, make_env
    self.group_size, self.max_in_flight = group_size, max_in_flight
    self.ledger = ledger
    self.max_outstanding, self.place_params = max_outstanding, place_params
    self.version = 0  # the newest policy version handed to the runners
    self.groups: "queue.Queue[Group]" = queue.Queue(maxsize=queue_groups)
    self._partial: Dict[int, List[Trajectory]] = {}
    self._stop = threading.Event()
    self._threads: List[threading.Thread] = []
    self._jobs: Dict[int, List] = {}  # per runner: the rest of the group it is issuing
    self._task_of: Dict[int, int] = {}
    self._deliver = self._to_queue
    self._lock = threading.Lock()
    self.error: Optional[BaseException] = None
    # Re-run what a previous process issued but never consumed, before anything new.
    self._resume = sorted(ledger.in_flight().items())

  # ---- job stream ----------------------------------------------------------------------
  def _next_job(self, runner: int, limit_groups: Optional[List[int]] = None):
    with self._lock:
      jobs = self._jobs.setdefault(runner, [])
      if not jobs:
        if limit_groups is not None:
          if limit_groups[0] <= 0:
            return None
          limit_groups[0] -= 1
        if self._resume:
          gid, tidx = self._resume.pop(0)
        elif (self.max_outstanding is not None
              and self.ledger.num_in_flight() >= self.max_outstanding):
          return NOT_YET
        else:
          nxt = self.next_group()
          if nxt is None:
            return None
          gid, tidx = nxt
          self.ledger.issued[gid] = tidx
        g = self.group_size  # session ids are a function of the group: stable across resumes
        jobs.extend((f"{tidx}", gid, self.make_env(tidx), gid * g + i) for i in range(g))
        self._task_of[gid] = tidx
      return jobs.pop(0)

  def _emit(self, traj: Trajectory) -> None:
    with self._lock:
      parts = self._partial.setdefault(traj.group_id, [])
      parts.append(traj)
      if len(parts) < self.group_size:
        return
      del self._partial[traj.group_id]
      group = Group(traj.group_id, self._task_of.pop(traj.group_id),
                    sorted(parts, key=lambda t: t.session_id))
    self._deliver(group)

  def _to_queue(self, group: Group) -> None:
    while not self._stop.is_set():
      try:
        self.groups.put(group, timeout=0.5)
        return
      except queue.Full:
        continue

  def set_params(self, train_params, version: int) -> None:
    """New weights for every runner, placed on its mesh by `place_params(params, i)`."""
    for i, r in enumerate(self.runners):
      r.set_params(self.place_params(train_params, i), version)
    self.version = version

  def stats(self) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for r in self.runners:
      for k, v in r.stats.items():
        out[k] = out.get(k, 0) + v
    return out

  # ---- ledger --------------------------------------------------------------------------
  def record(self, consumed: List[int], dropped_stale: List[int]) -> None:
    with self._lock:
      self.ledger.consumed.extend(consumed)
      self.ledger.dropped_stale.extend(dropped_stale)

  def ledger_json(self) -> Dict:
    """A consistent snapshot (the factory thread issues groups concurrently)."""
    with self._lock:
      return self.ledger.to_json()

  # ---- async ---------------------------------------------------------------------------
  def _run(self, i: int, next_job: Callable, stop=None) -> None:
    try:
      self.runners[i].run_stream(next_job, self._emit, self.max_in_flight, stop)
    except BaseException as e:  # surfaced to the trainer thread by get() / collect()
      self.error = e

  def start(self) -> None:
    for i in range(len(self.runners)):
      t = threading.Thread(target=self._run, args=(i, lambda i=i: self._next_job(i),
                                                    self._stop),
                           name=f"rollout-factory-{i}", daemon=True)
      t.start()
      self._threads.append(t)

  def get(self, timeout: float = 600.0) -> Optional[Group]:
    """Next complete group (async mode); None if the stream ended."""
    while True:
      if self.error is not None:
        raise RuntimeError("rollout factory failed") from self.error
      try:
        return self.groups.get(timeout=0.5)
      except queue.Empty:
        if not any(t.is_alive() for t in self._threads) and self.groups.empty():
          return None
        timeout -= 0.5
        if timeout <= 0:
          raise TimeoutError("no rollout group arrived in time")

  def stop(self) -> None:
    self._stop.set()
    for t in self._threads:
      t.join(timeout=120)

  def close(self) -> None:
    pass

  # ---- sync ----------------------------------------------------------------------------
  def collect(self, num_groups: int) -> List[Group]:
    """Runs exactly `num_groups` groups to completion with the current weights (sync), on
    all runners at once."""
    budget, out = [num_groups], []
    self._deliver = out.append
    try:
      threads = [threading.Thread(target=self._run,
                                  args=(i, lambda i=i: self._next_job(i, budget)))
                 for i in range(len(self.runners))]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
    finally:
      self._deliver = self._to_queue
    if self.error is not None:
      raise RuntimeError("rollout factory failed") from self.error
    return sorted(out, key=lambda g: g.group_id)
