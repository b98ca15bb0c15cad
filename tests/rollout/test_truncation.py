"""The truncation baseline of context compaction (`CompactionConfig.mode='truncation'`): when
the trigger fires, the oldest whole turns are dropped, the context restarts from (system,
task, the most recent turns, the observation) on an empty cache, with no summary turn, and
every context's sampled-token log-probs equal the trainer's scoring of that context alone,
bit for bit."""
import dataclasses
import os
import sys

import numpy as np
import pytest

from composer_rl.rollout import compaction as cl
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.runner import RolloutConfig, RolloutRunner

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_runner import CountingEnv  # noqa: E402  (the runner tests' fake env)
from test_compaction import train_step_on_contexts, verify_each_context_alone  # noqa: E402

MAX_SEQ = 160
SYSTEM, TASK = "sys", "count bytes"  # TASK is what CountingEnv.reset() says
TRUNC = cl.CompactionConfig(enabled=True, mode="truncation", trigger_fraction=0.6,
                            max_compactions=3, truncation_keep_fraction=0.4)
CFG = RolloutConfig(system_prompt=SYSTEM, max_turns=40, max_turn_tokens=6, top_k=50, seed=1,
                    compaction=TRUNC)
TURNS = [14, 3, 8, 40]  # long, never triggers, one or two restarts, runs out of restarts


@pytest.fixture(scope="module")
def truncated(window_160):
  tok, model, eng = window_160
  runner = RolloutRunner(eng, ChatFormat(tok), CFG, eng.load_params())
  jobs = [(f"t{i}", i, CountingEnv(turns=n, delay=0.0)) for i, n in enumerate(TURNS)]
  return runner.run(jobs, max_in_flight=3)


def test_config_and_cut():
  with pytest.raises(ValueError):
    cl.CompactionConfig(mode="summarise")
  assert not cl.CompactionConfig(enabled=True, mode="none").active
  assert cl.CompactionConfig(enabled=True, mode="truncation").active
  # head 10, turns at 10/30/50/70, context ends at 90, pending 5: keep <= 60
  assert cl.truncation_cut(10, [10, 30, 50, 70], 90, 5, 60) == 2   # 10 + 40 + 5 = 55
  assert cl.truncation_cut(10, [10, 30, 50, 70], 90, 5, 45) == 3   # 10 + 20 + 5 = 35
  assert cl.truncation_cut(10, [10, 30, 50, 70], 90, 5, 20) == 4   # drops every turn
  assert cl.truncation_cut(10, [10], 90, 5, 500) == 1              # always >= 1


def test_sessions_truncate_restart_and_stay_exact(window_160, truncated):
  tok, model, _ = window_160
  chat = ChatFormat(tok)
  head = chat.start(SYSTEM, TASK)
  by_turns = dict(zip(TURNS, truncated))
  assert by_turns[3].segments == [] and "truncations" not in by_turns[3].metrics
  assert len(by_turns[14].segments) >= 1 and len(by_turns[14].tokens) > MAX_SEQ
  capped = by_turns[40]
  assert len(capped.segments) == TRUNC.max_compactions
  assert capped.finish_reason == "context_full"
  for t, n in zip(truncated, TURNS):
    assert t.finish_reason == ("context_full" if n == 40 else "submitted")
    assert t.metrics.get("truncations", 0) == len(t.segments)
    assert "summary_tokens" not in t.metrics and t.turns == len(t.turn_texts)
    bounds = cl.segment_bounds(t)
    for k, (a, b) in enumerate(bounds):
      assert b - a <= MAX_SEQ  # a turn cut by the window ends with an unsampled EOT
      assert t.tokens[a:a + len(head)] == head  # every context starts with system + task
      if k == 0:
        continue
      seg = t.segments[k - 1]
      assert seg["token"] == a and seg["summary"] == "" and seg["dropped_turns"] >= 1
      pa, pb = bounds[k - 1]
      # The previous context ended with a whole model turn (its end-of-turn; unsampled
      # when the turn was cut by its budget).
      assert t.tokens[pb - 1] == tok.EOT and t.loss_mask[pb - 2] == 1
      # The new context: head, then a suffix of the previous context (whole turns, so it
      # starts with a model turn's first token or is empty), then the observation; nothing
      # in it is sampled until the next model turn.
      obs = chat.observation(f"len={len(t.turn_texts[seg['turn'] - 1])}")
      nxt = next(i for i in range(a + len(head), b) if t.loss_mask[i])
      kept = t.tokens[a + len(head):nxt - len(obs)]
      assert t.tokens[nxt - len(obs):nxt] == obs
      assert kept == t.tokens[pb - len(kept):pb]
      assert not any(t.loss_mask[a:nxt])
      assert nxt - a <= TRUNC.truncation_keep_fraction * MAX_SEQ
      # the kept part is whole turns: it starts right after an assistant header
      if kept:
        assert t.tokens[pb - len(kept) - 1] == tok.ASSISTANT
  assert verify_each_context_alone(truncated, model, CFG) == sum(
      t.num_generated for t in truncated)


def test_truncated_segments_train_with_ratio_exactly_one(window_160, truncated):
  m = train_step_on_contexts(truncated, window_160[1], CFG)
  assert float(m["ratio_not_one_frac"]) == 0.0
  assert float(m["ratio_min"]) == 1.0 and float(m["ratio_max"]) == 1.0
  assert float(m["tokens"]) == sum(t.num_generated for t in truncated)


def test_mode_none_is_disabled(window_160):
  """mode='none' with triggers that would fire everywhere = compaction disabled."""
  tok, model, eng = window_160
  out = []
  base = RolloutConfig(system_prompt=SYSTEM, max_turns=5, max_turn_tokens=6, top_k=50, seed=3)
  none = dataclasses.replace(base, compaction=cl.CompactionConfig(
      enabled=True, mode="none", trigger_fraction=0.01, max_turns_per_context=1))
  for cfg in (base, none):
    runner = RolloutRunner(eng, ChatFormat(tok), cfg, eng.load_params())
    out.append(runner.run([(f"t{i}", i, CountingEnv(turns=5, delay=0.0)) for i in range(2)]))
  for a, b in zip(*out):
    assert a.tokens == b.tokens and a.segments == b.segments == []
    assert np.array_equal(np.asarray(a.logprobs, np.float32).view(np.uint32),
                          np.asarray(b.logprobs, np.float32).view(np.uint32))
