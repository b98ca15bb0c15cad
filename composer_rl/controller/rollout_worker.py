"""A remote rollout worker: its own process, JAX runtime and mesh; the controller's engine,
environments and token layout; weights and work through shared storage.

    python launch/rollout_worker.py --config=experiments/tiny_bugfix.py \\
        --shared_dir=/shared/run1 --worker=w0

Loop: follow the published weight versions (`sync.WeightSubscriber`: verified sparse
deltas, new versions handed to the runner between decode steps), claim group tickets from
the queue (`rollout.transport.GroupQueue`), run each group's G sessions with continuous
batching, and publish each complete group atomically, tagged with the policy version of
every sampled token. A restarted worker (same --worker name) first finishes the claims it
held; it exits when the controller writes STOP.
"""
import os
import threading
import time
from typing import Dict, List

import jax
from absl import logging
from flax import nnx

from composer_rl.controller.agent_setup import Setup
from composer_rl.model import inference_copy
from composer_rl.rollout.runner import NOT_YET, RolloutRunner
from composer_rl.rollout.session import Trajectory
from composer_rl.rollout.transport import GroupQueue
from composer_rl.sync.subscriber import WeightSubscriber


class _Follower(threading.Thread):
  """Polls the weights and the STOP flag; beats the worker's heartbeat."""

  def __init__(self, sub: WeightSubscriber, queue: GroupQueue, worker: str, engine,
               runner: RolloutRunner, stop: threading.Event, poll_s: float):
    super().__init__(name="weight-follower", daemon=True)
    self.sub, self.queue, self.worker, self.engine = sub, queue, worker, engine
    self.runner, self.stop, self.poll_s = runner, stop, poll_s
    self.error = None

  def run(self):
    try:
      while not self.stop.is_set():
        self.queue.heartbeat(self.worker)
        if self.queue.stopped():
          self.stop.set()
          return
        if self.sub.poll() is not None:
          self.runner.set_params(self.engine.place(self.sub.snapshot()), self.sub.version)
          logging.info("worker %s: weights version %d", self.worker, self.sub.version)
        time.sleep(self.poll_s)
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e
      self.stop.set()


def run_worker(config, shared_dir: str, worker: str, poll_s: float = 0.2) -> Dict:
  """Runs rollouts for the controller until it says STOP; returns counters."""
  s = Setup(config, os.path.join(shared_dir, "worker_logs", worker), worker=True)
  engine, c = s.engines[0], config.rl
  queue = GroupQueue(os.path.join(shared_dir, "queue"))
  # the trainer publishes inference copies of its params (a pure dict of arrays)
  template = jax.eval_shape(lambda p: inference_copy(p, s.model_config),
                            nnx.to_pure_dict(engine.params))
  sub = WeightSubscriber(os.path.join(shared_dir, "weights"), template)
  queue.heartbeat(worker)
  while sub.poll() is None and sub.version is None:  # wait for the first version
    if queue.stopped():
      return dict(groups=0)
    time.sleep(poll_s)
  runner = RolloutRunner(engine, s.chat, s.rollout_config(greedy=False, seed=config.seed),
                         engine.place(sub.snapshot()), sub.version)
  stop = threading.Event()
  follower = _Follower(sub, queue, worker, engine, runner, stop, poll_s)
  follower.start()
  backlog = list(queue.my_claims(worker))  # claims held before a restart come first
  jobs: List = []
  parts: Dict[int, List[Trajectory]] = {}
  tasks: Dict[int, int] = {}
  done = [0]

  def next_job():
    if not jobs:
      ticket = backlog.pop(0) if backlog else queue.claim(worker)
      if ticket is None:
        return NOT_YET
      gid, tidx = int(ticket["group_id"]), int(ticket["task_index"])
      tasks[gid] = tidx
      g = c.group_size
      jobs.extend((f"{tidx}", gid, s.train_env(tidx), gid * g + i) for i in range(g))
    return jobs.pop(0)

  def emit(t: Trajectory):
    group = parts.setdefault(t.group_id, [])
    group.append(t)
    if len(group) == c.group_size:
      del parts[t.group_id]
      queue.finish(worker, t.group_id, [x.to_json() for x in group],
                   header=dict(task_index=tasks.pop(t.group_id)))
      done[0] += 1

  try:
    runner.run_stream(next_job, emit, c.max_in_flight, stop)
  finally:
    stop.set()
    follower.join(timeout=30)
  if follower.error is not None:
    raise RuntimeError("weight follower failed") from follower.error
  return dict(groups=done[0], weights_version=sub.version, **runner.stats)
