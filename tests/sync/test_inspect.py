"""launch/inspect_checkpoint.py on published weights and on an Orbax checkpoint."""
import json
import os
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp

from composer_rl.sync.publisher import WeightPublisher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args):
  out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "inspect_checkpoint.py"),
                        *args], capture_output=True, text=True, timeout=300)
  return out


def test_inspect_weights_diff_and_verify(tmp_path):
  root = str(tmp_path / "w")
  pub = WeightPublisher(root, anchor_every=10)
  a = {"layer": {"w": np.arange(100, dtype=np.float32)}, "b": np.ones(4, np.float32)}
  b = {"layer": {"w": np.arange(100, dtype=np.float32)}, "b": np.ones(4, np.float32) * 2}
  pub.publish(a)
  pub.publish(b)
  out = _run(f"--path={root}", "--version=0", f"--diff={root}", "--diff_version=1", "--json")
  rows = {r["leaf"]: r for r in json.loads(out.stdout)["rows"]}
  assert rows["b"]["changed_fraction"] == 1.0 and rows["b"]["max_abs_change"] == 1.0
  assert rows["layer/w"]["changed_fraction"] == 0.0
  out = _run(f"--path={root}", "--verify", "--json")
  assert out.returncode == 0 and json.loads(out.stdout)["ok"] is True
  table = _run(f"--path={root}").stdout
  assert "layer/w" in table and "norm" in table
  # Damage the delta: --verify reports it and exits non-zero.
  with open(os.path.join(root, "v00000001", "manifest.json"), "w") as f:
    f.write("garbage")
  out = _run(f"--path={root}", "--verify", "--json")
  assert out.returncode == 1 and "corrupt manifest" in out.stdout


def test_inspect_orbax_training_checkpoint(tmp_path):
  ckpt = tmp_path / "ckpts"
  mgr = ocp.CheckpointManager(str(ckpt), item_names=("params",))
  mgr.save(3, args=ocp.args.Composite(params=ocp.args.StandardSave(
      {"w": np.full((2, 3), 2.0, np.float32)})))
  mgr.wait_until_finished()
  out = _run(f"--path={ckpt}", "--json")
  rows = {r["leaf"]: r for r in json.loads(out.stdout)["rows"]}
  assert rows["params/w"]["shape"] == [2, 3]
  np.testing.assert_allclose(rows["params/w"]["norm"], np.sqrt(6 * 4.0))
