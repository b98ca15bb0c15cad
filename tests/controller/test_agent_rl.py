"""The default experiment's pipeline end to end (smoke size): launch/train.py -> SFT on
oracle sessions in the sandbox -> eval -> async GRPO -> eval -> summary and artifacts."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_bugfix_smoke_runs_end_to_end(tmp_path):
  wd = tmp_path / "wd"
  out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "train.py"),
                        f"--config={os.path.join(ROOT, 'experiments', 'tiny_bugfix.py')}:smoke",
                        f"--workdir={wd}"], capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  summary = json.loads(out.stdout.strip().splitlines()[-1])
  for key in ("heldout_solve_rate_sft", "heldout_solve_rate_rl", "trainer_idle_fraction",
              "rl_steps_per_hour"):
    assert key in summary
  assert 0.0 <= summary["heldout_solve_rate_rl"] <= 1.0
  rows = [json.loads(l) for l in open(wd / "metrics.jsonl")]
  assert {r["phase"] for r in rows} >= {"sft", "rl", "eval_sft", "eval_rl"}
  assert os.listdir(wd / "tensorboard")
  demos = [json.loads(l) for l in open(wd / "oracle_demos.jsonl")]
  assert demos and all(d["reward"] == 1.0 for d in demos)  # oracle sessions really solve
  rl = sorted(p for p in os.listdir(wd / "rollouts") if p.startswith("rl_step_"))
  assert len(rl) == 2
  traj = json.loads(open(wd / "rollouts" / rl[0]).readline())
  assert traj["logprobs_are_uint32_bits"] and sum(traj["loss_mask"]) > 0
