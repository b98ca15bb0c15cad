"""The default experiment's pipeline end to end (smoke size): launch/train.py -> SFT on
demonstrator sessions in the sandbox -> eval -> async GRPO -> eval -> summary and artifacts;
and a SIGKILL mid-RL followed by a restart loses and repeats no rollout group."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

from composer_rl.controller.agent_rl import task_of_group

NUM_TRAIN_TASKS = 2000  # experiments/tiny_bugfix.py rl.num_train_tasks
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "tiny_bugfix.py")


def _cmd(wd, *overrides):
  return [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={CONFIG}:smoke",
          f"--workdir={wd}", *overrides]


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _check_run(wd, stdout, rl_steps):
  """What a finished run leaves: the summary line, every phase's metrics, TensorBoard
  events, demonstrations graded in the sandbox, one rollout file per RL step with log-probs
  stored as their bits."""
  summary = json.loads(stdout.strip().splitlines()[-1])
  for key in ("heldout_solve_rate_sft", "heldout_solve_rate_rl", "trainer_idle_fraction",
              "rl_steps_per_hour", "gain_points"):
    assert key in summary
  assert 0.0 <= summary["heldout_solve_rate_rl"] <= 1.0
  rows = _rows(os.path.join(wd, "metrics.jsonl"))
  assert {r["phase"] for r in rows} >= {"demos", "sft", "rl", "eval_sft", "eval_rl"}
  assert os.listdir(os.path.join(wd, "tensorboard"))
  (demo_file,) = glob.glob(os.path.join(wd, "demos_*.jsonl"))
  demos = _rows(demo_file)
  # The weak demonstrator really solves the tasks it fixes, and only those.
  assert {d["reward"] for d in demos} <= {0.0, 1.0}
  assert all((d["reward"] == 1.0) == any('"edit"' in t for t in d["turn_texts"]) for d in demos)
  rl = sorted(p for p in os.listdir(os.path.join(wd, "rollouts")) if p.startswith("rl_step_"))
  assert len(rl) == rl_steps
  traj = _rows(os.path.join(wd, "rollouts", rl[0]))[0]
  assert traj["logprobs_are_uint32_bits"] and sum(traj["loss_mask"]) > 0


def _ledger(wd, step):
  with open(os.path.join(wd, "checkpoints", str(step), "ledger", "metadata")) as f:
    return json.load(f)["rollouts"]


def test_sigkill_mid_rl_then_resume_loses_and_repeats_nothing(tmp_path):
  """The main job (smoke size) killed mid-RL and rerun: it finishes with everything a run
  leaves (`_check_run`), having lost and repeated no rollout group."""
  wd = str(tmp_path / "wd")
  steps, group = 6, 2
  overrides = (f"--config.rl.steps={steps}", "--config.rl.checkpoint_every=1",
               "--config.rl.max_staleness=100")  # keep every group: all must be consumed
  proc = subprocess.Popen(_cmd(wd, *overrides), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 600
  while not os.path.exists(os.path.join(wd, "checkpoints", "3")):  # mid-RL, async factory busy
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    assert time.time() < deadline
    time.sleep(0.1)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  out = subprocess.run(_cmd(wd, *overrides), capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "composer_rl: resumed at RL step" in out.stdout
  assert "Running SFT" not in out.stdout and "[sft " not in out.stdout  # SFT is not redone
  _check_run(wd, out.stdout, steps)

  ledger = _ledger(wd, steps)
  consumed = ledger["consumed"]
  assert len(consumed) == len(set(consumed)) == steps  # one group per step, none twice
  assert not ledger["dropped_stale"]
  issued = {int(g) for g in ledger["issued"]}
  assert set(consumed) <= issued
  # What training saw is on disk once per group: every consumed group's G rollouts appear in
  # exactly one step file, and no other group appears.
  seen = {}
  for k in range(steps):
    for t in _rows(os.path.join(wd, "rollouts", f"rl_step_{k:05d}.jsonl")):
      seen.setdefault(t["group_id"], []).append(t["session_id"])
      # a group re-run after the restart visits the task it was issued with
      assert t["task_id"] == str(task_of_group(0, t["group_id"], NUM_TRAIN_TASKS))
  assert set(seen) == set(consumed)
  for gid, sids in seen.items():
    assert sorted(sids) == [gid * group + i for i in range(group)]
  rl_steps = [r["step"] for r in _rows(os.path.join(wd, "metrics.jsonl")) if r["phase"] == "rl"]
  assert rl_steps == list(range(steps))  # the metrics log has each step once, in order
