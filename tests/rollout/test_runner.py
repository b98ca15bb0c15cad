"""Continuous batching of multi-turn sessions: tool calls release slots, weights change
mid-run, and every sampled token's log-prob equals the trainer's recomputation under the
version that sampled it, bit for bit."""
import dataclasses
import time

import jax
import numpy as np
import pytest
from flax import nnx

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import Transformer, get_preset
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.rollout.session import Trajectory
from composer_rl.sampling.engine import Engine
from composer_rl.sampling.head import RowSampling
from composer_rl.train.scoring import score_tokens


@dataclasses.dataclass
class _Step:
  observation: str
  done: bool
  info: dict


@dataclasses.dataclass
class _Grade:
  reward: float


class CountingEnv:
  """A minimal text environment for scheduler tests: it answers every turn with the turn's
  length after a delay (a slow tool), ends after `turns` turns, rewards 1 if any turn
  contained the byte 'a'."""

  def __init__(self, turns=3, delay=0.01, crash_on=None, budget_ends=False):
    self.turns, self.delay, self.crash_on, self.seen = turns, delay, crash_on, []
    self.budget_ends = budget_ends  # end as the harness does when its turn budget is spent
    self.metrics = {"malformed_calls": 0}

  def reset(self):
    return "count bytes"

  def step(self, text):
    time.sleep(self.delay)
    self.seen.append(text)
    self.metrics["malformed_calls"] += int(not text)
    if self.crash_on == len(self.seen):
      raise RuntimeError("tool died")
    done = len(self.seen) >= self.turns
    return _Step(f"len={len(text)}", done,
                 {"budget_exhausted": True} if done and self.budget_ends else {})

  def grade(self):
    return _Grade(float(any("a" in t for t in self.seen)))

  def close(self):
    pass


def _verify(trajs, params_by_version, graphdef, cfg):
  compared = 0
  rows = RowSampling.broadcast(1, cfg.temperature, cfg.top_k, cfg.top_p)
  score = jax.jit(lambda st, toks: score_tokens(nnx.merge(graphdef, st), toks, rows))
  for t in trajs:
    toks = np.asarray(t.tokens, np.int32)[None]
    for v in sorted({x for x in t.versions if x >= 0}):
      lp = np.asarray(score(params_by_version[v], toks).logprobs[0])
      for pos, (m, ver) in enumerate(zip(t.loss_mask, t.versions)):
        if m and ver == v:
          want = np.float32(t.logprobs[pos])
          assert lp[pos - 1].view(np.uint32) == want.view(np.uint32), (t.session_id, pos)
          compared += 1
  return compared


@pytest.fixture(scope="module")
def setup():
  tok = ByteTokenizer()
  model = Transformer(get_preset("tiny", vocab_size=tok.vocab_size, max_seq_len=160),
                      rngs=nnx.Rngs(0))
  return tok, model


def test_sessions_share_slots_and_stay_exact(setup):
  tok, model = setup
  eng = Engine(model, slots=2, prefill_chunk=16)
  cfg = RolloutConfig(system_prompt="sys", max_turns=3, max_turn_tokens=6, top_k=50, seed=1)
  runner = RolloutRunner(eng, ChatFormat(tok), cfg, eng.load_params())
  envs = [CountingEnv() for _ in range(5)]
  trajs = runner.run([(f"t{i}", i // 2, e) for i, e in enumerate(envs)], max_in_flight=4)
  assert len(trajs) == 5
  for t, e in zip(trajs, envs):
    assert t.turns == 3 and len(e.seen) == 3 and t.finish_reason == "submitted"
    assert t.reward == float(any("a" in x for x in e.seen))
    # Observations are in the token stream, as unsampled context.
    assert tok.decode(t.tokens).count("len=") == 2
  graphdef, params = nnx.split(model)
  assert _verify(trajs, {0: params}, graphdef, cfg) == sum(t.num_generated for t in trajs)
  assert runner.stats["decode_steps"] > 0


def test_a_session_ended_by_the_env_turn_budget_is_not_a_submission(setup):
  tok, model = setup
  eng = Engine(model, slots=2, prefill_chunk=16)
  cfg = RolloutConfig(system_prompt="sys", max_turns=5, max_turn_tokens=4, seed=1)
  runner = RolloutRunner(eng, ChatFormat(tok), cfg, eng.load_params())
  t, = runner.run([("t", 0, CountingEnv(turns=2, budget_ends=True))])
  assert t.turns == 2 and t.finish_reason == "turn_budget"


def test_multi_step_decode_gives_the_same_sessions_bit_for_bit(setup):
  """Several decode steps per engine call (one dispatch, one host sync) change nothing:
  the same tokens, the same log-prob bits, equal to the trainer's recomputation."""
  tok, model = setup
  out = {}
  for k in (1, 5):
    eng = Engine(model, slots=2, prefill_chunk=16)
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=7, top_k=50, seed=4, decode_steps=k)
    runner = RolloutRunner(eng, ChatFormat(tok), cfg, eng.load_params())
    out[k] = runner.run([(f"t{i}", i, CountingEnv()) for i in range(4)], max_in_flight=3)
  for a, b in zip(out[1], out[5]):
    assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
    assert np.array_equal(np.asarray(a.logprobs, np.float32).view(np.uint32),
                          np.asarray(b.logprobs, np.float32).view(np.uint32))
  graphdef, params = nnx.split(model)
  assert _verify(out[5], {0: params}, graphdef, cfg) == sum(t.num_generated for t in out[5])


def test_weight_update_mid_run_reprefills_and_stays_exact(setup):
  tok, model = setup
  eng = Engine(model, slots=3, prefill_chunk=16)
  graphdef, p0 = nnx.split(model)
  p1 = jax.tree.map(lambda x: x * 1.01, p0)
  # One decode step per call, so sessions are mid-turn in their slots when weights change.
  cfg = RolloutConfig(max_turns=3, max_turn_tokens=5, seed=2, decode_steps=1)
  runner = RolloutRunner(eng, ChatFormat(tok), cfg, p0, version=0)
  jobs = iter([(f"t{i}", i, CountingEnv(delay=0.02)) for i in range(6)])
  started = []

  def next_job():
    job = next(jobs, None)
    started.append(job)
    if len(started) == 4:
      runner.set_params(p1, 1)  # the trainer publishing mid-run
    return job
  out = []
  runner.run_stream(next_job, out.append, max_in_flight=4)
  versions = {v for t in out for v in t.versions if v >= 0}
  assert versions == {0, 1} and runner.stats["reprefills"] >= 1
  assert _verify(out, {0: p0, 1: p1}, graphdef, cfg) == sum(t.num_generated for t in out)


def test_crashed_tool_is_an_observation_not_an_exception(setup):
  tok, model = setup
  eng = Engine(model, slots=1, prefill_chunk=16)
  runner = RolloutRunner(eng, ChatFormat(tok), RolloutConfig(max_turns=2, max_turn_tokens=4),
                         eng.load_params())
  t = runner.run([("t", 0, CountingEnv(turns=2, crash_on=1))])[0]
  assert "tool crashed" in t.observations[0] and t.metrics["tool_crashes"] == 1
  assert t.turns == 2


def test_trajectory_json_round_trip_keeps_logprob_bits():
  t = Trajectory("t", 0, 1, [1, 2], [0, 1], [0.0, -1.2345678], [-1, 3])
  back = Trajectory.from_json(t.to_json())
  assert np.float32(back.logprobs[1]).view(np.uint32) == np.float32(-1.2345678).view(np.uint32)
