"""Online ingestion: completion and feedback records become trajectories with the exact
token layout, sampler log-prob bits and versions; feedback turns into rewards; sessions
without consent or feedback, too long or too stale are dropped and counted."""
import collections

import numpy as np
import pytest

from composer_rl.online import ingest
from composer_rl.rollout.session import Trajectory
from composer_rl.serving.records import RecordLog, encode, float_bits

NOW = 1_700_000_000.0
LIMITS = ingest.IngestLimits(max_tokens=30, max_age_versions=3)
SPEC = ingest.RewardSpec(weights={"accepted": 1.0, "rejected": -1.0, "thumbs_up": 0.5,
                                  "thumbs_down": -0.5, "task_outcome": 1.0}, default=-0.1)


def completion(conv, cid, prompt, sampled, choice=0, version=5, created=NOW - 10,
               consent=True, finish="stop", logprobs=None):
  logprobs = logprobs if logprobs is not None else [-0.5] * len(sampled)
  return {"kind": "completion", "id": f"{cid}:{choice}", "completion_id": cid,
          "choice": choice, "conversation_id": conv, "created": created, "model": "m",
          "prompt_ids": prompt, "completion_ids": sampled,
          "logprobs_bits": float_bits(logprobs), "policy_version": version,
          "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None,
                       "max_tokens": 16, "stop": []},
          "finish_reason": finish, "timings": {"total": 0.1}, "consent": consent,
          "key_id": None, "endpoint": "chat", "messages": [],
          "response": {"role": "assistant", "content": f"reply {cid}:{choice}"}}


def feedback(fid, signal, value=None, conv=None, cid=None, consent=None, created=NOW):
  return {"kind": "feedback", "id": fid, "created": created, "conversation_id": conv,
          "completion_id": cid, "signal": signal, "value": value, "text": None,
          "consent": consent}


def write(directory, records):
  with RecordLog(str(directory)) as log:
    for r in records:
      log.append(r)
  return str(directory)


def source(directory, records, spec=SPEC, limits=LIMITS, version=6):
  return ingest.OnlineSessionSource(write(directory, records), spec, limits,
                                    current_version=version, now=NOW)


def bits(xs):
  return np.asarray(xs, np.float32).view(np.uint32).tolist()


def test_multi_turn_conversation_is_one_trajectory_with_exact_layout(tmp_path):
  lp1 = np.float32([-0.1234567, -2.7182817]).tolist()
  lp2 = np.float32([-1e-7, -3.3333333, -0.0]).tolist()
  turn1 = completion("conv", "c1", [1, 2, 3], [10, 11], version=4, created=NOW - 20,
                     finish="tool_calls", logprobs=lp1)
  # The client appended the tool result (20, 21, 22) and asked again.
  turn2 = completion("conv", "c2", [1, 2, 3, 10, 11, 20, 21, 22], [12, 13, 14], version=5,
                     created=NOW - 10, logprobs=lp2)
  src = source(tmp_path, [turn2, turn1, feedback("f", "accepted", conv="conv")])
  assert len(src) == 1 and src.stats["kept"] == 1
  t = src[0]
  assert isinstance(t, Trajectory)
  assert t.tokens == [1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 14]
  assert t.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
  assert t.versions == [-1, -1, -1, 4, 4, -1, -1, -1, 5, 5, 5]
  assert bits(t.logprobs) == bits([0.0] * 3 + lp1 + [0.0] * 3 + lp2)
  assert bits(t.logprobs)[8:] == turn2["logprobs_bits"]
  assert t.task_id == "conv" and t.turns == 2 and t.finish_reason == "stop"
  assert t.reward == 1.0 and t.metrics["online"] == 1.0
  assert t.metrics["version_lag"] == 2.0
  assert t.turn_texts == ["reply c1:0", "reply c2:0"]
  assert [f["signal"] for f in t.reward_info["feedback"]] == ["accepted"]
  again = source(tmp_path / "again", [turn1, turn2, feedback("f", "accepted", conv="conv")])
  assert (again[0].group_id, again[0].session_id) == (t.group_id, t.session_id)  # stable


def test_choices_are_separate_trajectories_in_one_group(tmp_path):
  prompt = [7, 8, 9]
  a = completion("conv", "cb", prompt, [30, 31], choice=0)
  b = completion("conv", "cb", prompt, [40, 41, 42], choice=1)
  # The client continued from choice 1 only; the next turn extends that branch alone.
  b2 = completion("conv", "cc", prompt + [40, 41, 42, 50], [60], created=NOW - 5)
  # A client that edited history: the prompt extends no branch, so it starts a new one.
  edited = completion("conv", "cd", [7, 8, 99], [70], created=NOW - 4)
  src = source(tmp_path, [a, b, b2, edited,
                          feedback("f1", "thumbs_up", cid="cb:1"),
                          feedback("f2", "task_outcome", 0.25, conv="conv")])
  by_first = {tuple(t.tokens[:5]): t for t in (src[i] for i in range(len(src)))}
  assert len(src) == 3 and src.stats["sessions"] == 3
  ta, tb, te = by_first[(7, 8, 9, 30, 31)], by_first[(7, 8, 9, 40, 41)], by_first[(7, 8, 99, 70)]
  assert ta.group_id == tb.group_id != te.group_id
  assert len({ta.session_id, tb.session_id, te.session_id}) == 3
  assert tb.tokens == [7, 8, 9, 40, 41, 42, 50, 60]
  assert tb.loss_mask == [0, 0, 0, 1, 1, 1, 0, 1] and tb.turns == 2
  # thumbs_up by record id reaches choice 1's branch only; task_outcome reaches all.
  assert tb.reward == 0.5 + 0.25
  assert ta.reward == te.reward == 0.25


def test_bare_response_id_reaches_every_choice(tmp_path):
  # Choice 0 is empty, so choice 1's prompt starts with choice 0's history; a sibling
  # choice still never extends it.
  recs = [completion("conv", "cb", [1], [], choice=0, finish="length"),
          completion("conv", "cb", [1], [3], choice=1),
          feedback("f", "rejected", cid="cb")]
  src = source(tmp_path, recs)
  assert [src[i].reward for i in range(len(src))] == [-1.0, -1.0]


def test_feedback_weights_give_the_hand_computed_reward(tmp_path):
  recs = [completion("a", "ca", [1], [2]),
          feedback("f1", "accepted", conv="a"),           # presence: 1.0 * 1
          feedback("f2", "thumbs_down", True, conv="a"),  # bool True: -0.5 * 1
          feedback("f3", "task_outcome", 0.25, cid="ca:0"),  # number: 1.0 * 0.25
          feedback("f4", "thumbs_up", False, conv="a"),   # bool False: 0.5 * 0
          feedback("f5", "correction", conv="a"),         # no weight: nothing
          completion("b", "cb", [1], [2]),
          feedback("g1", "correction", conv="b"),         # nothing weighted: the default
          feedback("g2", "task_outcome", conv="b")]       # task_outcome needs a value
  src = source(tmp_path, recs)
  rewards = {src[i].task_id: src[i] for i in range(len(src))}
  assert rewards["a"].reward == pytest.approx(1.0 - 0.5 + 0.25 + 0.0)
  info = rewards["a"].reward_info
  assert [f["contribution"] for f in info["feedback"]] == [1.0, -0.5, 0.25, 0.0, None]
  assert not info["default_reward"]
  assert rewards["b"].reward == -0.1 and rewards["b"].reward_info["default_reward"]


def test_drops_are_counted_and_unmatched_feedback_too(tmp_path):
  ok = lambda conv: feedback(f"fb-{conv}", "accepted", conv=conv)
  recs = [
      completion("kept", "k", [1], [2]), ok("kept"),
      completion("unasked", "u", [1], [2], consent=None), ok("unasked"),
      completion("refused", "r", [1], [2]),
      feedback("fb-refused", "accepted", conv="refused", consent=False),
      completion("long", "l", list(range(25)), list(range(6))), ok("long"),  # 31 > 30
      completion("stale", "s", [1], [2], version=2), ok("stale"),  # 6 - 2 > 3
      completion("edge", "e", [1], [2], version=3), ok("edge"),    # 6 - 3 = 3: kept
      completion("silent", "q", [1], [2]),
      feedback("lost1", "accepted", cid="nope:0"),
      feedback("lost2", "accepted", conv="ghost"),
  ]
  src = source(tmp_path, recs)
  assert sorted(src[i].task_id for i in range(len(src))) == ["edge", "kept"]
  s = src.stats
  assert (s["conversations"], s["sessions"], s["kept"]) == (7, 7, 2)
  assert (s["dropped_no_consent"], s["dropped_no_feedback"], s["dropped_too_long"],
          s["dropped_stale"], s["dropped_too_old"]) == (2, 1, 1, 1, 0)
  assert s["feedback_unmatched"] == 2

  lenient = source(tmp_path / "lenient", recs,
                   spec=ingest.RewardSpec(require_feedback=False, default=0.3),
                   limits=ingest.IngestLimits(require_consent=False, max_tokens=30,
                                              max_age_versions=3, max_age_seconds=5))
  # Consent not required, but the explicit refusal still drops; the age limit (5 s)
  # drops the four sessions (written 10 s before `now`) that pass the earlier checks.
  assert lenient.stats["dropped_no_consent"] == 1
  assert lenient.stats["dropped_too_old"] == 4 and len(lenient) == 0
  relaxed = source(tmp_path / "relaxed", recs,
                   spec=ingest.RewardSpec(require_feedback=False, default=0.3))
  silent = [relaxed[i] for i in range(len(relaxed)) if relaxed[i].task_id == "silent"]
  assert [t.reward for t in silent] == [0.3]


def test_torn_records_are_counted_and_malformed_ones_skipped(tmp_path):
  d = write(tmp_path, [completion("a", "ca", [1], [2]), feedback("f", "accepted", conv="a"),
                       {"kind": "completion", "id": "broken"}, {"kind": "heartbeat"}])
  with open(f"{d}/records-000001.log", "ab") as f:
    f.write(encode(completion("b", "cb", [1], [2]))[:40])
  with pytest.warns(UserWarning, match="torn"):
    src = ingest.OnlineSessionSource(d, SPEC, LIMITS, current_version=6, now=NOW)
  assert src.stats["torn_records_skipped"] == 1 and src.stats["malformed_records"] == 1
  assert src.stats["records"] == 4 and len(src) == 1


def test_judge_and_unknown_signals_are_rejected():
  with pytest.raises(NotImplementedError, match="judge='rubric'"):
    ingest.RewardSpec(judge="rubric")
  with pytest.raises(ValueError, match="thumbs_sideways"):
    ingest.RewardSpec(weights={"thumbs_sideways": 1.0})


def test_grain_dataset_covers_every_session_once_per_epoch(tmp_path):
  recs = []
  for i in range(7):
    recs += [completion(f"conv{i}", f"c{i}", [i], [100 + i]), feedback(f"f{i}", "accepted",
                                                                      conv=f"conv{i}")]
  src = source(tmp_path, recs)
  ds = ingest.online_dataset(src, seed=3, batch_size=3)
  batches = [ds[i] for i in range(len(ds))]
  assert [len(b) for b in batches] == [3, 3, 1]
  assert all(isinstance(t, Trajectory) for b in batches for t in b)
  ids = [t.task_id for b in batches for t in b]
  assert collections.Counter(ids) == collections.Counter(f"conv{i}" for i in range(7))
  same = ingest.online_dataset(src, seed=3, batch_size=3)
  assert [t.task_id for i in range(len(same)) for t in same[i]] == ids
  two_epochs = list(ingest.online_dataset(src, seed=3, batch_size=7).repeat(2))
  assert [sorted(t.task_id for t in b) for b in two_epochs] == [sorted(ids)] * 2


def test_sessions_carry_their_sampling_and_the_batch_scores_under_it(tmp_path):
  """A session keeps the transform its tokens were sampled under and `build_batch` scores
  its row under that; a session whose turns used different transforms is dropped."""
  from composer_rl.train.batch import build_batch
  a = completion("a", "a1", [1, 2], [3, 4])
  a["sampling"].update(temperature=0.7, top_k=5, top_p=0.9)
  m1 = completion("m", "m1", [1, 2], [3], created=NOW - 20)
  m2 = completion("m", "m2", [1, 2, 3, 9], [5], created=NOW - 10)
  m2["sampling"]["temperature"] = 0.5
  src = source(tmp_path, [a, m1, m2, feedback("fa", "accepted", conv="a"),
                          feedback("fm", "accepted", conv="m")])
  assert len(src) == 1 and src.stats["dropped_mixed_sampling"] == 1
  t = src[0]
  assert t.sampling == {"temperature": 0.7, "top_k": 5, "top_p": 0.9}
  b = build_batch([t, {"tokens": [1, 2, 3], "loss_mask": [0, 1, 1]}], 8, temperature=1.0)
  assert b.sampling.temperature.tolist() == [np.float32(0.7), 1.0]
  assert b.sampling.top_k.tolist() == [5, 0] and b.sampling.top_p.tolist() == [np.float32(0.9), 1.0]
