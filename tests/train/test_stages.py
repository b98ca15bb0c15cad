"""The training stages the controllers compose (composer_rl.train.stages): row padding by
hand, an RL update that is exactly the step on the batch it describes, and SFT that logs
where it says and learns."""
import types

import jax
import numpy as np

from composer_rl.model import sharding as shd
from composer_rl.train import losses, stages
from composer_rl.train.batch import build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, make_train_step
from tests.train.helpers import TINY, on_policy_records


def test_padded_rows_by_hand():
  step = types.SimpleNamespace(num_shards=4, config=types.SimpleNamespace(micro_batch_size=2))
  # 5 -> 8 (shards x micro-batch); 5 with groups of 3 -> 6 -> 8; 9 -> 16; 8 -> 8.
  assert [stages.padded_rows(step, n) for n in (1, 5, 8, 9)] == [8, 8, 8, 16]
  assert stages.padded_rows(step, 5, multiple=3) == 8
  assert stages.padded_rows(step, 17, multiple=6) == 24


def _step(mesh):
  return make_train_step(TINY, TrainConfig(
      optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=0, total_steps=4),
      loss=losses.LossConfig(policy_loss="ppo_clip")), mesh)


def test_rl_update_is_the_step_on_its_batch():
  mesh = shd.make_mesh({"data": -1}, jax.devices())
  step = _step(mesh)
  records, _ = on_policy_records(TINY, step.init_state(0).params, 5)
  adv = np.asarray([1.0, -1.0, 0.5, 0.0, -0.5], np.float32)
  state, m = stages.rl_update(step, step.init_state(0), records, adv, temperature=1.0,
                              row_multiple=3)
  rows = stages.padded_rows(step, 5, 3)
  assert rows % step.num_shards == 0 and rows >= 6
  want_state, want_m = step.step(step.init_state(0), step.shard_batch(build_batch(
      records, TINY.max_seq_len, num_rows=rows, advantages=adv)))
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(want_state.params)):
    assert np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
  assert m["loss"] == float(want_m["loss"])
  assert m["trained_tokens"] == sum(len(r["tokens"]) for r in records)


class _Log:
  def __init__(self):
    self.rows = []

  def write(self, step, metrics, phase):
    self.rows.append((phase, step, metrics))


def test_sft_stage_logs_and_learns():
  mesh = shd.make_mesh({"data": -1}, jax.devices())
  rec = dict(tokens=[1, 2, 3, 4, 5, 6], loss_mask=[0, 0, 1, 1, 1, 1])
  log, seen = _Log(), []

  def sample(k):
    seen.append(k)
    return [rec] * 3
  state = stages.sft_stage(TINY, mesh, learning_rate=3e-2, warmup_steps=0, steps=7,
                           batch_size=3, sample=sample, metrics=log, log_every=3, seed=0)
  assert seen == list(range(7))
  assert [(p, k) for p, k, _ in log.rows] == [("sft", 0), ("sft", 3), ("sft", 6)]
  assert log.rows[-1][2]["loss"] < log.rows[0][2]["loss"]
  assert int(state.step) == 7
