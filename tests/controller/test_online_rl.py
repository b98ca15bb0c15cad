"""The online-RL loop end to end at smoke size (experiments/online_rl.py:smoke): SFT, the
server in-process, the scripted user as a separate process with the openai client, the
trainer on ingested records mixed with simulated rollouts, weights published and followed."""
import json

from composer_rl.controller import online_rl
from tests.train import helpers


def test_online_rl_smoke_closes_the_loop(tmp_path):
  c = helpers.load_experiment("online_rl", "smoke")
  out = online_rl.run(c, str(tmp_path))
  assert 0.0 <= out["preference_rate_before"] <= 1.0
  assert 0.0 <= out["preference_rate_after"] <= 1.0
  assert out["final_version"] == c.online.steps  # version 0 = the SFT policy
  n_sim = round(c.online.batch_size * c.online.sim_fraction)
  assert out["sessions_consumed"] == c.online.steps * (c.online.batch_size - n_sim)
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [r for r in map(json.loads, f) if r.get("phase") == "online"]
  assert len(rows) == c.online.steps
  for r in rows:
    assert r["ingest_kept"] >= c.online.batch_size - n_sim
    # Held-out conversations were asked without consent: never trained on.
    assert r["ingest_dropped_no_consent"] >= c.eval.num_heldout
    assert r["version_lag_max"] <= c.online.max_online_staleness
    assert r["tokens"] > 0
  # The first step trains on sessions the served version 0 produced: ratio exactly 1.
  assert rows[0]["ratio_min"] == rows[0]["ratio_max"] == 1.0
  # The held-out evaluation after training was served by the last published version.
  with open(tmp_path / "eval_after.jsonl") as f:
    after = [json.loads(line) for line in f]
  assert len(after) == c.eval.num_heldout
  assert {r["fingerprint"] for r in after} == {f"fp_v{c.online.steps}"}
