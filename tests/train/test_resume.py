"""Kill-and-resume: SIGKILL in the middle of a step, resume, continue to N steps; the
final state equals an uninterrupted N-step run bit for bit (checkpoint digests cover
params, optimizer state, step and RNG)."""
import json
import os
import signal
import subprocess
import sys
import time


from composer_rl.train import trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERRIDES = dict(steps=6, every=2)


def _config():
  sys.path.insert(0, os.path.join(ROOT, "experiments"))
  import rl_synthetic_tiny  # pylint: disable=import-outside-toplevel
  c = rl_synthetic_tiny.get_config()
  c.train.steps = OVERRIDES["steps"]
  c.checkpoint.every_steps = OVERRIDES["every"]
  c.model.num_layers = 1
  return c


def _cmd(workdir):
  return [sys.executable, os.path.join(ROOT, "launch", "train.py"),
          "--config=" + os.path.join(ROOT, "experiments", "rl_synthetic_tiny.py"),
          f"--workdir={workdir}", f"--config.train.steps={OVERRIDES['steps']}",
          f"--config.checkpoint.every_steps={OVERRIDES['every']}",
          "--config.model.num_layers=1"]


def _meta(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")) as f:
    return json.load(f)


def _losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [(r["step"], r["loss"], r["reward_mean"], r["grad_norm"])
            for r in map(json.loads, f)]


def test_sigkill_mid_step_then_resume_is_bitwise(tmp_path):
  ref = str(tmp_path / "ref")
  trainer.train(_config(), ref)  # uninterrupted, in-process

  run = str(tmp_path / "run")
  env = dict(os.environ, **{trainer.STALL_ENV: "3"})  # stall inside the 4th update
  proc = subprocess.Popen(_cmd(run), env=env, cwd=ROOT, stdout=subprocess.PIPE,
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

  out = subprocess.run(_cmd(run), cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "resumed from step 2" in out.stdout
  assert json.loads(out.stdout.strip().splitlines()[-1])["resumed_from"] == 2
  assert _meta(run, 6)["digest"] == _meta(ref, 6)["digest"]
  assert _losses(run) == _losses(ref)
