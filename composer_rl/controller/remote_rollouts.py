"""The controller's side of remote rollout workers: the rollout factory's interface (`get`,
`collect`, `set_params`, `record`, `ledger_json`, `stats`, `version`) over shared storage.

  shared/weights/   the published weight versions (`composer_rl.sync`; sparse deltas)
  shared/queue/     the durable group queue (`composer_rl.rollout.transport`)

The controller issues groups as tickets (at most `max_outstanding` not yet consumed, which
bounds staleness exactly as for local rollouts), publishes the inference copy after every
train step, and consumes complete groups from any worker, once each: the ledger it
checkpoints says which groups were consumed; a result for a consumed group is a duplicate
and is deleted unread. Workers may join and leave at any time; claims of a worker whose
heartbeat stopped for `lease_s` go back to the queue.
"""
import os
import time
from typing import Callable, Dict, List, Optional

from composer_rl.controller.rollout_factory import Group, Ledger
from composer_rl.rollout.session import Trajectory
from composer_rl.rollout.transport import GroupQueue
from composer_rl.sync.publisher import WeightPublisher


class RemoteRollouts:
  """Issues groups to, and consumes groups from, remote workers (see module docstring).

  next_group: () -> (group_id, task_index) for a new task visit.
  to_published: train params -> the tree to publish (the inference copy).
  """

  def __init__(self, shared: str, next_group: Callable, ledger: Ledger, group_size: int,
               max_outstanding: int, to_published: Callable, anchor_every: int = 20,
               lease_s: float = 60.0):
    self.queue = GroupQueue(os.path.join(shared, "queue"))
    self.publisher = WeightPublisher(os.path.join(shared, "weights"), anchor_every=anchor_every)
    self.next_group, self.ledger, self.group_size = next_group, ledger, group_size
    self.max_outstanding, self.lease_s = max_outstanding, lease_s
    self.to_published = to_published
    self.version: Optional[int] = self.publisher.version
    self._stats = dict(groups_received=0, duplicates_dropped=0, reclaimed=0,
                       publish_seconds=0.0, published_bytes=0)
    known = self.queue.known()  # resume: re-issue what the last process issued but lost
    for gid, tidx in sorted(ledger.in_flight().items()):
      if gid not in known:
        self.queue.issue(gid, tidx)

  def set_params(self, train_params, step: int = 0) -> None:
    """Publishes the new weights as the next version (its number becomes `version`)."""
    m = self.publisher.publish(self.to_published(train_params))
    self.version = m["version"]
    self._stats["publish_seconds"] += m["publish_seconds"]
    self._stats["published_bytes"] += m["payload_bytes"]

  def _top_up(self) -> None:
    while self.ledger.num_in_flight() < self.max_outstanding:
      gid, tidx = self.next_group()
      self.ledger.issued[gid] = tidx
      self.queue.issue(gid, tidx)

  def get(self, timeout: float = 600.0) -> Group:
    done = set(self.ledger.consumed) | set(self.ledger.dropped_stale)
    deadline, last_reclaim = time.time() + timeout, 0.0
    while True:
      self._top_up()
      for gid in self.queue.results():
        if gid in done or gid not in self.ledger.issued:
          self.queue.retire(gid)  # a duplicate (e.g. a reclaimed claim finished twice)
          self._stats["duplicates_dropped"] += 1
          continue
        try:
          _, rows = self.queue.read_result(gid)
        except ValueError:
          self.queue.retire(gid)
          self.queue.issue(gid, self.ledger.issued[gid])  # unreadable: run it again
          continue
        self.queue.retire(gid)
        self._stats["groups_received"] += 1
        trajs = sorted((Trajectory.from_json(r) for r in rows), key=lambda t: t.session_id)
        return Group(gid, self.ledger.issued[gid], trajs)
      if time.time() - last_reclaim > self.lease_s / 4:
        self._stats["reclaimed"] += len(self.queue.reclaim(self.lease_s))
        last_reclaim = time.time()
      if time.time() > deadline:
        raise TimeoutError("no rollout group arrived from the workers in time "
                           f"(queue: {self.queue.root})")
      time.sleep(0.05)

  def collect(self, num_groups: int) -> List[Group]:
    return [self.get() for _ in range(num_groups)]

  def record(self, consumed: List[int], dropped_stale: List[int]) -> None:
    self.ledger.consumed.extend(consumed)
    self.ledger.dropped_stale.extend(dropped_stale)

  def ledger_json(self) -> Dict:
    return self.ledger.to_json()

  def stats(self) -> Dict:
    return dict(self._stats)

  def start(self) -> None:
    pass

  def stop(self) -> None:
    pass

  def close(self) -> None:
    """Tells the workers the run is over."""
    self.queue.stop()
