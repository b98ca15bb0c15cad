"""Kill-and-resume: SIGKILL in the middle of a step, resume, continue to N steps; the
final state equals an uninterrupted N-step run bit for bit (checkpoint digests cover
params, optimizer state, step and RNG), for synthetic RL and for continued pretraining
(whose checkpoint also holds the Grain packing iterator's position)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from composer_rl.train import trainer
from tests.train import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# experiment -> (config variant, command-line overrides); 6 steps, checkpoints every 2.
EXPERIMENTS = {
    "rl_synthetic_tiny": ("", {"train.steps": 6, "checkpoint.every_steps": 2,
                               "model.num_layers": 1}),
    # packed code rows: the Grain packing iterator's position is part of the checkpoint
    "cpt_code": ("tiny", {}),
}


def _config(name):
  variant, overrides = EXPERIMENTS[name]
  c = helpers.load_experiment(name, variant)
  for path, value in overrides.items():
    section, field = path.split(".")
    c[section][field] = value
  return c


def _cmd(name, workdir):
  variant, overrides = EXPERIMENTS[name]
  config = os.path.join(ROOT, "experiments", f"{name}.py") + (f":{variant}" if variant else "")
  return [sys.executable, os.path.join(ROOT, "launch", "train.py"), f"--config={config}",
          f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in overrides.items())]


def _meta(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [(r["step"], r["loss"], r.get("reward_mean"), r["grad_norm"])
            for r in map(json.loads, f)]


# rl_synthetic_tiny is `slow` (~85 s): since train/loop.py both modes resume through the
# same loop, and cpt_code also restores a data iterator's position.
@pytest.mark.parametrize("name", [pytest.param("rl_synthetic_tiny", marks=pytest.mark.slow),
                                  "cpt_code"])
def test_sigkill_mid_step_then_resume_is_bitwise(tmp_path, name):
  ref = str(tmp_path / "ref")
  trainer.train(_config(name), ref)  # uninterrupted, in-process

  run = str(tmp_path / "run")
  env = dict(os.environ, **{trainer.STALL_ENV: "3"})  # stall inside the 4th update
  proc = subprocess.Popen(_cmd(name, run), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
  marker = os.path.join(run, "STALLED")
  deadline = time.time() + 240
  while not os.path.exists(marker):
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    assert time.time() < deadline, "the run never reached the stall hook"
    time.sleep(0.2)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  steps = sorted(int(d) for d in os.listdir(os.path.join(run, "checkpoints")) if d.isdigit())
  assert steps and max(steps) == 2  # step 3 was done but lost; step 4 was in flight

  out = subprocess.run(_cmd(name, run), cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from step 2" in out.stdout
  assert json.loads(out.stdout.strip().splitlines()[-1])["resumed_from"] == 2
  assert _meta(run, 6)["digest"] == _meta(ref, 6)["digest"]
  assert _losses(run) == _losses(ref)
