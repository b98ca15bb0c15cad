"""The online-RL loop end to end at smoke size (experiments/online_rl.py:smoke): SFT, the
server in-process, the scripted user as a separate process with the openai client, the
trainer on ingested records mixed with simulated rollouts, weights published and followed."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from composer_rl.controller import online_rl
from tests.train import helpers


def test_online_rl_smoke_closes_the_loop_and_resumes(tmp_path):
  """One step, then the same workdir run for two: the second run resumes at step 1 (no SFT
  or before-evaluation again, the consumed-session ledger restored, so no session is
  trained twice) and publishes the resumed weights as a new version the server follows."""
  c = helpers.load_experiment("online_rl", "smoke")
  c.online.steps = 1
  c.sft.update(num_demos=16, steps=2)
  c.online.batch_size = 4  # 3 served sessions + 1 simulated rollout per step
  c.eval.num_heldout = 2
  first = online_rl.run(c, str(tmp_path))
  before_mtime = (tmp_path / "eval_before.jsonl").stat().st_mtime
  c.online.steps = 2
  out = online_rl.run(c, str(tmp_path))
  assert out["preference_rate_before"] == first["preference_rate_before"]
  assert (tmp_path / "eval_before.jsonl").stat().st_mtime == before_mtime
  assert 0.0 <= out["preference_rate_after"] <= 1.0
  # v0 (SFT), v1 (after step 0); resumed: v2 (the step-1 state again), v3 (after step 1)
  assert first["final_version"] == 1 and out["final_version"] == 3
  n_online = c.online.batch_size - round(c.online.batch_size * c.online.sim_fraction)
  assert out["sessions_consumed"] == 2 * n_online
  with open(tmp_path / "metrics.jsonl") as f:
    rows = list(map(json.loads, f))
  assert len([r for r in rows if r.get("phase") == "sft"]) == c.sft.steps  # SFT ran once
  online = [r for r in rows if r.get("phase") == "online"]
  assert [r["step"] for r in online] == [0, 1]
  for r in online:
    assert r["ingest_kept"] >= n_online and r["tokens"] > 0
    # Held-out conversations were asked without consent: never trained on.
    assert r["ingest_dropped_no_consent"] >= c.eval.num_heldout
    assert r["version_lag_max"] <= c.online.max_online_staleness
  # The first step trains on sessions the served version 0 produced: ratio exactly 1.
  assert online[0]["ratio_min"] == online[0]["ratio_max"] == 1.0
  # The held-out evaluation after training was served by the last published version.
  with open(tmp_path / "eval_after.jsonl") as f:
    after = [json.loads(line) for line in f]
  assert len(after) == c.eval.num_heldout
  assert {r["fingerprint"] for r in after} == {"fp_v3"}


def test_online_rl_in_qwen3_format_from_a_checkpoint(tmp_path, qwen3_checkpoint):
  """A converted Qwen3 checkpoint (architecture, weights, tokenizer) through the whole
  online loop: SFT in its chat layout, the server rendering Qwen3 turns for the scripted
  user's openai client, records in its ids, a train step with ratio 1 on served sessions."""
  from composer_rl.data.hf_tokenizer import HfTokenizer  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.records import read_records  # pylint: disable=import-outside-toplevel
  c = helpers.load_experiment("online_rl", "smoke")
  c.init_checkpoint, c.chat.format = qwen3_checkpoint, "qwen3"
  c.online.steps, c.online.batch_size, c.online.sim_fraction = 1, 4, 0.0
  c.sft.steps, c.sft.num_demos, c.eval.num_heldout = 1, 8, 2
  out = online_rl.run(c, str(tmp_path))
  assert 0.0 <= out["preference_rate_after"] <= 1.0 and out["final_version"] == 1
  tok = HfTokenizer(os.path.join(qwen3_checkpoint, "hf_files"))
  completions = [r for r in read_records(str(tmp_path / "records"))
                 if r["kind"] == "completion"]
  assert completions and all(r["prompt_ids"][0] == tok.token_id("<|im_start|>")
                             for r in completions)
  assert all(max(r["completion_ids"]) < tok.vocab_size for r in completions)
  with open(tmp_path / "metrics.jsonl") as f:
    (step,) = [r for r in map(json.loads, f) if r.get("phase") == "online"]
  assert step["ratio_min"] == step["ratio_max"] == 1.0 and step["tokens"] > 0


@pytest.mark.slow
def test_online_rl_sigkill_mid_run_resumes(tmp_path):
  """SIGKILL of the controller (server, trainer) after its second step; the same command
  again finishes the run with every step trained once and no session consumed twice."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, os.path.join(root, "launch", "train.py"),
         "--config=" + os.path.join(root, "experiments", "online_rl.py") + ":smoke",
         f"--workdir={tmp_path}", "--config.online.steps=3"]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    t0 = time.time()
    while time.time() - t0 < 600:
      if (tmp_path / "metrics.jsonl").exists():
        with open(tmp_path / "metrics.jsonl") as f:
          if any(r.get("phase") == "online" and r["step"] == 1 for r in map(json.loads, f)):
            break
      time.sleep(0.2)
    else:
      pytest.fail("the run never reached step 1")
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "resumed at step" in done.stdout
  out = json.loads(done.stdout.strip().splitlines()[-1])
  c = helpers.load_experiment("online_rl", "smoke")
  n_online = c.online.batch_size - round(c.online.batch_size * c.online.sim_fraction)
  assert out["sessions_consumed"] == 3 * n_online
  with open(tmp_path / "metrics.jsonl") as f:
    steps = [r["step"] for r in map(json.loads, f) if r.get("phase") == "online"]
  assert steps == [0, 1, 2]
