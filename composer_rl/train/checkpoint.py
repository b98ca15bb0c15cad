"""Checkpoints: Orbax `CheckpointManager` with the train state, the data iterator's state,
the controller's ledger and an integrity record; corrupt or partial checkpoints are skipped.

Items of one checkpoint (a directory `<workdir>/checkpoints/<step>/`):
  state   TrainState (params, optimizer state, step, RNG, optional reference params);
          restored directly into the mesh's shardings.
  data    JSON: the Grain iterator state (`iterator.get_state()`), so the pipeline resumes at
          exactly the next element.
  ledger  JSON: the controller's record of consumed / in-flight rollouts (an opaque dict
          owned by the controller; the trainer only stores it atomically with the weights).
  meta    JSON: step and a SHA-256 of the saved parameters and optimizer state.

Why the checksum: Orbax finalizes a checkpoint by renaming its temporary directory, so a
process killed mid-save leaves only an ignored `*.orbax-checkpoint-tmp-*` directory. But a
finalized checkpoint can still be damaged later (disk, partial copy). Restore therefore
walks from the newest step down, and a step whose items are missing, unreadable, or whose
bytes do not hash to the recorded digest is reported and skipped.

Several processes (multi-controller JAX): every process calls save and restore; Orbax
writes each array's shards from the process that holds them and the JSON items from process
0, so a checkpoint written by N processes restores in M processes (any mesh, through the
target's shardings) -- tested with 2 and 1 in tests/cluster.
"""
import hashlib
import logging
import os
import sys
from typing import Any, Dict, NamedTuple, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from composer_rl.model import sharding

log = logging.getLogger(__name__)


def digest(tree: Any) -> str:
  """SHA-256 over every leaf's dtype, shape and bytes, in tree order."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(sharding.to_host(tree)):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _state_dict(state) -> Dict[str, Any]:
  d = dict(step=state.step, params=state.params, opt_state=state.opt_state, rng=state.rng)
  if state.ref_params is not None:
    d["ref_params"] = state.ref_params
  return d


class Restored(NamedTuple):
  step: int
  state: Any
  data_state: Optional[Dict[str, Any]]
  ledger: Optional[Dict[str, Any]]


class Checkpointer:
  """Saves and restores (TrainState, data iterator state, ledger) under `directory`.

  max_to_keep: newest checkpoints kept (older ones deleted); keep >= 2 so a damaged newest
    checkpoint still has a good predecessor.
  async_save: write in a background thread while training continues (the step's arrays are
    copied to host first, so later updates cannot leak into a checkpoint).
  keep_period: steps that are multiples of it are never deleted (None = off); e.g. a huge
    value keeps step 0 forever (the agent controller's SFT policy).
  """

  def __init__(self, directory: str, max_to_keep: int = 3, async_save: bool = True,
               keep_period: Optional[int] = None):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=async_save,
                                           keep_period=keep_period)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_names=("state", "data", "ledger", "meta"))

  def save(self, step: int, state, data_state: Optional[Dict[str, Any]] = None,
           ledger: Optional[Dict[str, Any]] = None, force: bool = True) -> bool:
    tree = _state_dict(state)
    meta = dict(step=int(step), digest=digest(tree))
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(tree), data=ocp.args.JsonSave(data_state or {}),
        ledger=ocp.args.JsonSave(ledger or {}), meta=ocp.args.JsonSave(meta))
    return self.manager.save(int(step), args=args, force=force)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def all_steps(self):
    return sorted(self.manager.all_steps())

  def latest_step(self) -> Optional[int]:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def restore(self, abstract_state, step: Optional[int] = None) -> Optional[Restored]:
    """Newest good checkpoint (or exactly `step`), restored into `abstract_state`'s
    shardings; None if there is none. Bad checkpoints are reported on stderr and skipped."""
    steps = [step] if step is not None else list(reversed(self.all_steps()))
    target = _state_dict(abstract_state)
    for s in steps:
      where = os.path.join(self.directory, str(s))
      try:
        got = self.manager.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore(),
            ledger=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
        meta = got["meta"]
        if meta is None or int(meta.get("step", -1)) != int(s):
          raise ValueError("missing or inconsistent meta item (partial checkpoint)")
        found = digest(got["state"])
        if found != meta["digest"]:
          raise ValueError(f"content digest {found[:12]}... != recorded {meta['digest'][:12]}"
                           "... (corrupt data)")
      except Exception as e:  # pylint: disable=broad-except
        msg = (f"composer_rl: skipping checkpoint step {s} at {where}: {type(e).__name__}: "
               f"{str(e).splitlines()[0] if str(e) else ''}; trying an older one")
        print(msg, file=sys.stderr, flush=True)
        log.warning(msg)
        continue
      st = got["state"]
      state = abstract_state.replace(
          step=st["step"], params=st["params"], opt_state=st["opt_state"], rng=st["rng"],
          ref_params=st.get("ref_params"))
      return Restored(step=int(s), state=state, data_state=got["data"] or None,
                      ledger=got["ledger"] or None)
    return None

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
