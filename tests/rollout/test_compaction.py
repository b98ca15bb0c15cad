"""Context compaction inside the RL loop: sessions longer than the model's window summarize,
restart from (system, task, summary) on an empty cache, and every context's sampled-token
log-probs (the summary's included) equal the trainer's scoring of that context alone, bit
for bit, so each context trains on-policy as its own sequence."""
import dataclasses
import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import sharding
from composer_rl.rollout import compaction as cl
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner
from composer_rl.rollout.session import Trajectory
from composer_rl.train import losses
from composer_rl.train.batch import build_batch
from composer_rl.train.train_step import TrainConfig, make_train_step

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_runner import CountingEnv, _verify  # noqa: E402  (the runner tests' fake env)

MAX_SEQ = 160
SYSTEM, TASK = "sys", "count bytes"  # TASK is what CountingEnv.reset() says
COMP = cl.CompactionConfig(enabled=True, trigger_fraction=0.5, max_compactions=2,
                           summary_max_tokens=10, instruction="summarize")
CFG = RolloutConfig(system_prompt=SYSTEM, max_turns=40, max_turn_tokens=6, top_k=50, seed=1,
                    compaction=COMP)
# Turns per session: two sessions compact twice, one never reaches the trigger, one compacts
# once, one runs out of compactions and ends 'context_full'.
TURNS = [12, 12, 3, 8, 30]


@pytest.fixture(scope="module")
def compacted(window_160):
  tok, model, eng = window_160
  runner = RolloutRunner(eng, ChatFormat(tok), CFG, eng.load_params())
  jobs = [(f"t{i}", i, CountingEnv(turns=n, delay=0.0)) for i, n in enumerate(TURNS)]
  return runner.run(jobs, max_in_flight=3)  # 5 sessions through 2 slots


def _bits(x):
  return np.asarray(x, np.float32).view(np.uint32)


def test_pure_helpers():
  chat = ChatFormat(ByteTokenizer())
  tok = chat.tok
  c = dataclasses.replace(COMP, max_turns_per_context=3)
  assert not cl.should_compact(cl.CompactionConfig(), 150, 9, 0, MAX_SEQ)  # disabled
  assert cl.should_compact(c, 80, 0, 0, MAX_SEQ) and not cl.should_compact(c, 79, 0, 0, MAX_SEQ)
  assert cl.should_compact(c, 10, 3, 1, MAX_SEQ)                           # turn trigger
  assert not cl.should_compact(c, 150, 3, 2, MAX_SEQ)                      # cap reached
  assert cl.segment_seed(7, 0) == 7 and len({cl.segment_seed(7, k) for k in range(4)}) == 4
  summary = cl.summary_ids(chat, tok.encode("ab") + [tok.TOOL] + tok.encode("c"))
  assert summary == tok.encode("abc")  # a stray role token never opens a message
  assert cl.restart_tokens(chat, SYSTEM, TASK, summary) == (
      chat.start(SYSTEM, TASK)[:-1] + [tok.USER] + tok.encode("abc") + [tok.EOT, tok.ASSISTANT])
  assert cl.instruction_tokens(chat, "len=3", "summarize") == (
      chat.observation("len=3")[:-1] + [tok.USER] + tok.encode("summarize")
      + [tok.EOT, tok.ASSISTANT])
  t = Trajectory("t", 0, 1, [1, 2, 3], [0, 1, 1], [0.0, -1.5, -0.25], [-1, 0, 0])
  rec, = cl.segment_records(t)  # no compaction: one record, the whole trajectory
  assert (rec["tokens"], rec["loss_mask"], rec["logprobs"], rec["versions"]) == (
      t.tokens, t.loss_mask, t.logprobs, t.versions)


def test_sessions_compact_restart_and_stay_exact(window_160, compacted):
  tok, model, _ = window_160
  chat = ChatFormat(tok)
  trajs = compacted
  ask = cl.instruction_tokens(chat, "", COMP.instruction)[-(len(COMP.instruction) + 3):]
  by_turns = dict(zip(TURNS, trajs))
  assert len(by_turns[12].tokens) > MAX_SEQ and len(by_turns[12].segments) == 2
  assert by_turns[3].segments == [] and "compactions" not in by_turns[3].metrics
  assert len(by_turns[8].segments) == 1
  capped = by_turns[30]  # two compactions, then the third context filled up
  assert len(capped.segments) == 2 and capped.finish_reason == "context_full"
  for t, n in zip(trajs, TURNS):
    assert t.finish_reason == ("context_full" if n == 30 else "submitted"), t.session_id
    assert t.metrics.get("compactions", 0) == len(t.segments)
    bounds = cl.segment_bounds(t)
    summary_tokens = 0
    for k, (a, b) in enumerate(bounds):
      assert b - a < MAX_SEQ  # every context fits the window; the session need not
      if k == 0:
        assert t.tokens[:len(chat.start(SYSTEM, TASK))] == chat.start(SYSTEM, TASK)
        continue
      # The previous context ends with: instruction (user message), the summary turn.
      prev = t.tokens[bounds[k - 1][0]:a]
      at = max(i for i in range(len(prev)) if prev[i:i + len(ask)] == ask) + len(ask)
      turn = list(range(bounds[k - 1][0] + at, a))
      assert t.tokens[turn[-1]] == tok.EOT
      sampled = [i for i in turn if t.loss_mask[i]]
      assert sampled == turn or sampled == turn[:-1]  # only a cut summary's EOT is unsampled
      assert all(t.versions[i] == 0 for i in sampled)
      summary_tokens += len(sampled)
      seg = t.segments[k - 1]
      body = [t.tokens[i] for i in turn if t.tokens[i] != tok.EOT or i != turn[-1]]
      assert seg["summary"] == tok.decode(body) and seg["token"] == a
      # The new context: (system, task, summary), prefilled from position 0.
      start = cl.restart_tokens(chat, SYSTEM, TASK, cl.summary_ids(chat, body))
      assert t.tokens[a:a + len(start)] == start
      assert not any(t.loss_mask[a:a + len(start)])
      assert tok.decode(t.tokens[:a]).count("len=") == seg["turn"]  # turns before it
    assert summary_tokens == t.metrics.get("summary_tokens", 0)
    assert [s["turn"] for s in t.segments] == sorted(s["turn"] for s in t.segments)
  # Each context alone, scored by the trainer's program from position 0: every sampled
  # token (summaries included) has the engine's log-prob bits.
  assert verify_each_context_alone(trajs, model, CFG) == sum(t.num_generated for t in trajs)


def verify_each_context_alone(trajs, model, cfg) -> int:
  """Scores every context of every session alone with the trainer's program (from
  position 0); asserts each sampled token's log-prob bits; returns how many it compared."""
  segments = [Trajectory(t.task_id, t.group_id, t.session_id, **r)
              for t in trajs for r in cl.segment_records(t)]
  graphdef, params = nnx.split(model)
  return _verify(segments, {0: params}, graphdef, cfg)


def train_step_on_contexts(trajs, model, cfg):
  """One ppo_clip step on the per-context rows (`expand_segments`); its metrics."""
  adv = np.linspace(-1.0, 1.0, len(trajs)).astype(np.float32)
  records, row_adv = cl.expand_segments(trajs, adv)
  assert len(records) == sum(len(t.segments) + 1 for t in trajs)
  assert list(row_adv) == [a for t, a in zip(trajs, adv) for _ in range(len(t.segments) + 1)]
  batch = build_batch(records, MAX_SEQ, advantages=row_adv, temperature=cfg.temperature,
                      top_k=cfg.top_k, top_p=cfg.top_p)
  step = make_train_step(model.config,
                         TrainConfig(loss=losses.LossConfig(policy_loss="ppo_clip")),
                         sharding.make_mesh({"data": 1}, jax.devices()[:1]))
  _, params = nnx.split(model)
  state = step.init_state(0, params=nnx.to_pure_dict(params))
  return jax.device_get(step.step(state, step.shard_batch(batch))[1])


def test_segments_train_on_policy_with_ratio_exactly_one(window_160, compacted):
  m = train_step_on_contexts(compacted, window_160[1], CFG)
  assert float(m["ratio_not_one_frac"]) == 0.0
  assert float(m["ratio_min"]) == 1.0 and float(m["ratio_max"]) == 1.0
  assert float(m["tokens"]) == sum(t.num_generated for t in compacted)  # summaries included
  assert np.isfinite(float(m["loss"]))


def test_disabled_compaction_changes_nothing(window_160):
  tok, model, eng = window_160
  out = []
  base = RolloutConfig(system_prompt=SYSTEM, max_turns=5, max_turn_tokens=6, top_k=50, seed=3)
  # Disabled, with triggers that would fire at every boundary if it were on.
  off = dataclasses.replace(base, compaction=cl.CompactionConfig(
      enabled=False, trigger_fraction=0.01, max_turns_per_context=1))
  for cfg in (base, off):
    runner = RolloutRunner(eng, ChatFormat(tok), cfg, eng.load_params())
    out.append(runner.run([(f"t{i}", i, CountingEnv(turns=5, delay=0.0)) for i in range(3)]))
  for a, b in zip(*out):
    assert a.tokens == b.tokens and a.loss_mask == b.loss_mask and a.versions == b.versions
    assert np.array_equal(_bits(a.logprobs), _bits(b.logprobs))
    assert a.segments == b.segments == [] and set(a.metrics) == set(b.metrics)
    assert "compactions" not in b.metrics and "summary_tokens" not in b.metrics


def test_compaction_with_multi_step_decode_and_a_weight_update_stays_exact(window_160):
  """A restarted context re-prefilled under new weights (from its own start, not the
  session's) and summaries cut inside a multi-step decode block stay exact."""
  tok, model, eng = window_160
  graphdef, p0 = nnx.split(model)
  p1 = jax.tree.map(lambda x: x * 1.01, p0)
  cfg = dataclasses.replace(CFG, decode_steps=4, compaction=dataclasses.replace(
      COMP, max_turns_per_context=3, summary_max_tokens=5))
  runner = RolloutRunner(eng, ChatFormat(tok), cfg, p0, version=0)
  jobs = iter([(f"t{i}", i, CountingEnv(turns=9, delay=0.0)) for i in range(4)])
  calls = []

  def next_job():
    calls.append(1)
    if len(calls) == 4:
      runner.set_params(p1, 1)  # the trainer publishing mid-run
    return next(jobs, None)
  out = []
  runner.run_stream(next_job, out.append, max_in_flight=3)
  assert {v for t in out for v in t.versions if v >= 0} == {0, 1}
  assert runner.stats["reprefills"] >= 1
  assert all(len(t.segments) == 2 for t in out)  # the turn trigger: after turns 3 and 6
  assert all([s["turn"] for s in t.segments] == [3, 6] for t in out)
  segments = [Trajectory(t.task_id, t.group_id, t.session_id, **r)
              for t in out for r in cl.segment_records(t)]
  assert _verify(segments, {0: p0, 1: p1}, graphdef, cfg) == sum(t.num_generated for t in out)
