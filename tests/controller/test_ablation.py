"""The context-compaction ablation (experiments/tiny_compaction.py:ablation_smoke) end to end:
every arm trains and evaluates with its own context mode (RL metrics and rollouts show it),
each arm is also evaluated with the full window, the summary reports solve rates and
per-session tokens against the window, and a re-run reads the finished arms back."""
import json

import pytest

from composer_rl.controller import ablation, agent_rl, agent_setup, agent_sft
from composer_rl.train import checkpoint
from tests.train import helpers


def _config():
  c = helpers.load_experiment("tiny_compaction", "ablation_smoke")
  c.agent.sft.update(num_demos=2, steps=1)
  c.agent.rl.steps = 1
  c.agent.eval.num_heldout = 1
  return c


def _rl_rows(path):
  with open(path / "metrics.jsonl") as f:
    return [r for r in map(json.loads, f) if r.get("phase") == "rl"]


def _rollouts(path, name):
  with open(path / "rollouts" / f"{name}.jsonl") as f:
    return [json.loads(line) for line in f]


def test_arm_configs_change_only_the_context_modes():
  c = _config()
  b = ablation.arm_config(c, "none", "compaction")
  assert b.rl.compaction.mode == "none" and b.eval.context_mode == "compaction"
  assert b.model.to_dict() == c.agent.model.to_dict() and b.rl.steps == c.agent.rl.steps
  assert c.agent.rl.compaction.mode == "compaction"  # the experiment's config is untouched
  with pytest.raises(ValueError, match="context mode"):
    ablation.arm_config(c, "summarise", "none")
  assert set(c.arms) == {"compaction", "compaction_eval_only", "truncation"}


def _step0_params_digest(c, path):
  arm = ablation.arm_config(c, "compaction", "compaction")
  s = agent_setup.Setup(arm, str(path / "probe"))
  params = agent_sft.saved_sft_params(s, agent_rl.make_rl_step(s), str(path))
  s.metrics.close()
  return checkpoint.digest(params)


@pytest.mark.slow
def test_ablation_smoke_runs_every_arm_and_resumes(tmp_path, monkeypatch):
  c = _config()
  out = ablation.run(c, str(tmp_path))
  assert set(out["arms"]) == set(c.arms)
  assert out["window"] == c.agent.model.max_seq_len
  for name, (train_mode, eval_mode) in c.arms.items():
    arm = out["arms"][name]
    assert (arm["train_context_mode"], arm["eval_context_mode"]) == (train_mode, eval_mode)
    for k in ("heldout_solve_rate_sft", "heldout_solve_rate_rl",
              "heldout_solve_rate_rl_full_window", "heldout_session_tokens_mean_rl",
              "heldout_session_tokens_max_rl", "heldout_context_restarts_mean_rl",
              "heldout_summary_tokens_mean_rl"):
      assert k in arm, (name, k)
    # Evaluation sessions outgrow the window and restart their contexts; with the full
    # window (mode 'none') they do not.
    assert arm["heldout_session_tokens_max_rl"] > out["window"]
    assert arm["heldout_context_tokens_max_rl"] <= out["window"]
    assert arm["heldout_context_restarts_mean_rl"] >= 1
    assert arm["heldout_context_restarts_mean_rl_full_window"] == 0
    assert (arm["heldout_summary_tokens_mean_rl"] > 0) == (eval_mode == "compaction")
    # RL rollouts used the arm's training mode (context stats in the RL metrics).
    rows = _rl_rows(tmp_path / name)
    assert rows and all("context_restarts_mean" in r for r in rows)
    trajs = _rollouts(tmp_path / name, "rl_step_00000")
    segs = [s for t in trajs for s in t.get("segments") or []]
    if train_mode == "none":
      assert not segs and all(r["context_restarts_mean"] == 0 for r in rows)
    else:
      assert segs and all((s["summary"] == "") == (train_mode == "truncation") for s in segs)
  # SFT ran once, in the first arm; every arm's RL started from that SFT policy.
  first, *later = list(c.arms)
  sft_rows = lambda n: [r for r in map(json.loads, open(tmp_path / n / "metrics.jsonl"))
                        if r.get("phase") == "sft"]
  assert sft_rows(first) and not any(sft_rows(n) for n in later)
  digests = {n: _step0_params_digest(c, tmp_path / n) for n in c.arms}
  assert len(set(digests.values())) == 1, digests
  # A re-run reads every finished arm back: nothing trains again.
  monkeypatch.setattr(agent_rl, "run", lambda *a, **k: pytest.fail("an arm ran again"))
  assert ablation.run(c, str(tmp_path)) == out
  with open(tmp_path / "summary.json") as f:
    assert json.load(f) == out


@pytest.mark.slow  # ~52 s; the default suite is over 20 min (BUILD_NOTES)
def test_ablation_driver_one_arm_truncation(tmp_path):
  """The driver in the default suite at one arm (~35 s; all three: the slow test above):
  truncation through the whole loop, SFT -> RL -> evaluation -> full-window reference."""
  c = _config()
  c.arms = {"truncation": ["truncation", "truncation"]}
  out = ablation.run(c, str(tmp_path))
  arm = out["arms"]["truncation"]
  assert arm["heldout_session_tokens_max_rl"] > out["window"] >= arm[
      "heldout_context_tokens_max_rl"]
  assert arm["heldout_context_restarts_mean_rl"] >= 1 and arm["heldout_summary_tokens_mean_rl"] == 0
  trajs = _rollouts(tmp_path / "truncation", "rl_step_00000")
  assert any(s["summary"] == "" and s["dropped_turns"] >= 1
             for t in trajs for s in t.get("segments") or [])
