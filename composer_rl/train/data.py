"""Grain input pipelines: task groups for RL and batches of expert trajectories for SFT.

Both are `grain.MapDataset` chains (random access, so the position in the stream is one
integer) turned into an iterator whose `get_state()` / `set_state()` the checkpoint stores:
a resumed run continues at exactly the next element, with the same shuffle order.

RL: a source of tasks -> filter -> seeded shuffle (a new order every epoch) -> repeat ->
one `TaskGroup` per task visit (the controller samples G rollouts for it) -> batches of
`groups_per_step` groups.
SFT: token-level records ({"tokens", "loss_mask"}) -> filter (fits the context) -> seeded
shuffle -> repeat -> batches of `batch_size` records.
"""
import dataclasses
import json
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import grain


@dataclasses.dataclass(frozen=True)
class TaskGroup:
  """One visit of a task: the controller runs `group_size` rollouts of `task`.

  group_id: unique, deterministic id of this visit (its index in the repeated, shuffled
    stream); advantages are normalized within a group.
  """
  group_id: int
  task: Any
  group_size: int

  def seq_ids(self) -> List[int]:
    """Per-rollout sequence ids (the sampler's RNG stream ids); unique across the run."""
    return [self.group_id * self.group_size + j for j in range(self.group_size)]


def task_groups(tasks: Sequence[Any], group_size: int, groups_per_step: int, seed: int,
                num_epochs: Optional[int] = None,
                keep: Optional[Callable[[Any], bool]] = None) -> grain.IterDataset:
  """Batches (lists) of `groups_per_step` TaskGroups.

  Args:
    tasks: the task source (any random-access sequence: Task objects, ids, prompts).
    group_size: G, rollouts per task visit.
    groups_per_step: task visits per train step (a step trains on G * groups_per_step
      rollouts).
    seed: shuffle seed (each epoch is reshuffled from it).
    num_epochs: passes over the tasks (None = forever).
    keep: optional predicate; tasks for which it is False are dropped.
  """
  if group_size <= 0 or groups_per_step <= 0:
    raise ValueError(f"group_size and groups_per_step must be positive, got {group_size}, "
                     f"{groups_per_step}")
  ds = grain.MapDataset.source(list(tasks))
  if keep is not None:
    ds = ds.filter(keep)
  ds = ds.shuffle(seed=seed).repeat(num_epochs)
  ds = ds.map_with_index(lambda i, t: TaskGroup(group_id=int(i), task=t, group_size=group_size))
  return ds.to_iter_dataset().batch(groups_per_step, drop_remainder=True, batch_fn=list)


def sft_batches(records: Sequence[Dict[str, Any]], batch_size: int, max_len: int, seed: int,
                num_epochs: Optional[int] = None) -> grain.IterDataset:
  """Batches (lists) of `batch_size` SFT records of at most `max_len` tokens, with at
  least one loss token (records that cannot train anything are filtered out)."""
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  fits = lambda r: len(r["tokens"]) <= max_len and sum(r["loss_mask"][1:]) > 0
  ds = grain.MapDataset.source(list(records)).filter(fits).shuffle(seed=seed)
  ds = ds.repeat(num_epochs)
  return ds.to_iter_dataset().batch(batch_size, drop_remainder=True, batch_fn=list)


def read_jsonl(path: str) -> List[Dict[str, Any]]:
  """Records {"tokens": [...], "loss_mask": [...]} (one JSON object per line)."""
  out = []
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      rec = json.loads(line)
      if "tokens" not in rec or "loss_mask" not in rec:
        raise ValueError(f"{path}:{n}: a record needs 'tokens' and 'loss_mask'")
      if len(rec["tokens"]) != len(rec["loss_mask"]):
        raise ValueError(f"{path}:{n}: tokens and loss_mask lengths differ")
      out.append(rec)
  return out


def write_jsonl(path: str, records: Sequence[Dict[str, Any]]) -> None:
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps({"tokens": [int(t) for t in r["tokens"]],
                          "loss_mask": [int(m) for m in r["loss_mask"]]}) + "\n")


def iterator(ds: grain.IterDataset, state: Optional[Dict[str, Any]] = None) -> Iterator:
  """An iterator over `ds`, positioned at `state` (from `it.get_state()`) if given."""
  it = iter(ds)
  if state:
    it.set_state(state)
  return it
