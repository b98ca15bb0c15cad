"""The real-scale benchmark's command at a seconds-long size: one JSON object with the
Engine's speed, KV bytes per decode slot and per parked session (bucketed), parity through
the Engine (0 mismatched), the train step's compile and memory, and the paper sizes."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # ~35 s; a benchmark command
def test_real_scale_runs_small_and_reports_every_part():
  out = subprocess.run(
      [sys.executable, "-m", "composer_rl.bench.real_scale", "--preset=tiny",
       "--max_seq_len=256", "--sessions=4", "--prompt_len=16", "--new_tokens=8",
       "--train_rows=4", "--train_len=64", "--paper_presets=tiny,qwen3_0_6b"],
      capture_output=True, text=True, cwd=ROOT, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  r = json.loads(out.stdout)
  eng, train = r["engine"], r["train"]
  assert eng["parity"] == {**eng["parity"], "tokens": 32, "mismatched_tokens": 0}
  assert eng["decode_tokens_per_s"] > 0 and eng["compile_seconds"] >= 0
  # A parked 23-token session keeps 32 slots, a decode slot the whole window.
  assert eng["parked_session_tokens"] == 23
  assert eng["kv_bytes_parked_session"] == 32 * eng["kv_bytes_per_token"]
  assert eng["kv_bytes_decode_slot"] == 256 * eng["kv_bytes_per_token"]
  assert train["ran"] and train["predicted_bytes_per_device"]["total"] > 0 and train["remat"] == "full"
  q = r["paper"]["qwen3_0_6b"]
  assert 590e6 < q["parameters"] < 600e6  # Qwen3-0.6B: 596M with tied embeddings
  assert q["kv_bytes_per_session"]["window_before"] == 40_960 * q["kv_bytes_per_token"]
