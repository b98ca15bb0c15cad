"""Checkpoints: exact round trip (state, data iterator, ledger); damaged ones skipped."""
import glob
import os

import jax
import numpy as np
import pytest

from composer_rl.model import sharding as shd
from composer_rl.train import data
from composer_rl.train.checkpoint import Checkpointer
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, make_train_step

from .helpers import TINY, on_policy_batch


@pytest.fixture(scope="module")
def states():
  mesh = shd.make_mesh({"data": 1}, jax.devices()[:1])
  ts = make_train_step(TINY, TrainConfig(optimizer=OptimizerConfig(warmup_steps=0)), mesh)
  s0 = ts.init_state(0)
  batch = ts.shard_batch(on_policy_batch(TINY, jax.device_get(s0.params), 2, 16))
  s1, _ = ts.step(ts.init_state(0), batch)
  s2, _ = ts.step(jax.tree.map(lambda x: x.copy(), s1), batch)
  return ts, jax.device_get(s1), jax.device_get(s2)


def _equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_and_corrupt_checkpoint_is_skipped(tmp_path, capsys, states):
  ts, s1, s2 = states
  ds = data.task_groups(list(range(10)), group_size=2, groups_per_step=3, seed=1)
  it = data.iterator(ds)
  next(it)
  ck = Checkpointer(str(tmp_path), max_to_keep=3)
  ck.save(1, s1, it.get_state(), ledger={"consumed": [0, 1]})
  next(it)
  ck.save(2, s2, it.get_state(), ledger={"consumed": [0, 1, 2]})
  ck.wait()
  got = ck.restore(ts.abstract_state())
  ck.close()
  assert got.step == 2 and got.ledger == {"consumed": [0, 1, 2]}
  _equal(got.state, s2)
  assert int(got.state.step) == 2
  assert got.state.params["embed"].sharding == ts.param_shardings["embed"]
  resumed = data.iterator(ds, got.data_state)
  assert [g.group_id for g in next(resumed)] == [g.group_id for g in next(it)]

  # Damage the newest checkpoint's array data: restore reports it and falls back to step 1.
  files = [f for f in glob.glob(str(tmp_path / "2" / "state" / "**" / "*"), recursive=True)
           if os.path.isfile(f) and "/d/" in f]
  assert files
  for f in files:
    with open(f, "r+b") as fh:
      fh.seek(0)
      fh.write(b"\0garbage\0" * 8)
  ck = Checkpointer(str(tmp_path))
  got = ck.restore(ts.abstract_state())
  ck.close()
  err = capsys.readouterr().err
  assert "skipping checkpoint step 2" in err and "trying an older one" in err
  assert got.step == 1
  _equal(got.state, s1)


def test_partial_checkpoint_is_skipped(tmp_path, capsys, states):
  ts, s1, s2 = states
  ck = Checkpointer(str(tmp_path))
  ck.save(1, s1)
  ck.save(2, s2)
  ck.close()
  # A checkpoint that lost an item (e.g. copied half-way): its meta is gone.
  for f in glob.glob(str(tmp_path / "2" / "meta" / "*")):
    os.remove(f)
  # And an unfinalized temporary directory, as a kill during a save leaves behind.
  os.makedirs(tmp_path / "3.orbax-checkpoint-tmp-123" / "state")
  ck = Checkpointer(str(tmp_path))
  got = ck.restore(ts.abstract_state())
  ck.close()
  assert got.step == 1
  _equal(got.state, s1)
  assert "skipping checkpoint step 2" in capsys.readouterr().err


def test_no_checkpoint_returns_none(tmp_path, states):
  ts, _, _ = states
  ck = Checkpointer(str(tmp_path))
  assert ck.restore(ts.abstract_state()) is None
  ck.close()
