"""The viewer's data build (no browser): old records, incremental rebuilds, the trainer's
advantages, and the work-tree diff's handling of an agent's symlinks."""
import json
import os
import subprocess
import sys
import urllib.request

import numpy as np

from composer_rl.bench.viewer import synthetic_run
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.tree_diff import tree_diff
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.session import Trajectory
from composer_rl.train import advantages as adv_lib
from composer_rl.viewer import build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEW_FIELDS = ("prompt", "system_prompt", "task_info", "final_diff", "segments")


def _data(wd, name):
  with open(os.path.join(wd, "viewer", "data", name)) as f:
    return json.load(f)


def test_records_without_the_new_fields_still_load_and_show(tmp_path):
  chat = ChatFormat(ByteTokenizer())
  t = Trajectory("7", 0, 0, tokens=chat.start("sys text", "Task: fix it"), loss_mask=[],
                 logprobs=[], versions=[])
  t.loss_mask, t.logprobs, t.versions = [0] * len(t.tokens), [0.0] * len(t.tokens), [-1] * len(t.tokens)
  old = t.to_json()
  for k in NEW_FIELDS:
    del old[k]
  back = Trajectory.from_json(old)  # an old record loads with the defaults
  assert back.prompt is None and back.segments == [] and back.final_diff is None
  assert Trajectory.from_json(json.loads(json.dumps(t.to_json()))) == t
  os.makedirs(tmp_path / "rollouts")
  (tmp_path / "rollouts" / "rl_step_00000.jsonl").write_text(json.dumps(old) + "\n")
  build.build(str(tmp_path))
  (s,) = _data(tmp_path, "shards/rl_step_00000.0.json")
  assert (s["system_prompt"], s["prompt"]) == ("sys text", "Task: fix it")  # from the tokens
  assert s["final_diff"] is None


def test_rebuild_reprocesses_only_changed_files(tmp_path):
  synthetic_run(str(tmp_path), sessions=48, group_size=4, groups_per_step=4)  # 3 steps
  first = build.build(str(tmp_path))
  assert (first["processed"], first["sessions"]) == (3, 48)
  again = build.build(str(tmp_path))
  assert (again["processed"], again["reused"]) == (0, 3)
  step1 = tmp_path / "rollouts" / "rl_step_00001.jsonl"
  lines = step1.read_text().splitlines(keepends=True)
  step1.write_text("".join(lines[:4]))  # the file changed (a rewritten step)
  third = build.build(str(tmp_path))
  assert (third["processed"], third["sessions"]) == (1, 36)
  os.remove(tmp_path / "rollouts" / "rl_step_00002.jsonl")
  fourth = build.build(str(tmp_path))
  assert (fourth["processed"], fourth["sessions"]) == (0, 20)
  assert sorted(os.listdir(tmp_path / "viewer" / "data" / "shards")) == [
      "rl_step_00000.0.json", "rl_step_00001.0.json"]
  assert [s["name"] for s in _data(tmp_path, "index.json")["sources"]] == [
      "rl_step_00000", "rl_step_00001"]


def test_advantages_are_the_trainers(tmp_path):
  synthetic_run(str(tmp_path), sessions=32, group_size=4, groups_per_step=8)
  build.build(str(tmp_path))
  with open(tmp_path / "rollouts" / "rl_step_00000.jsonl") as f:
    recs = [json.loads(line) for line in f]
  want = np.asarray(adv_lib.compute_advantages(
      "grpo", np.asarray([r["reward"] for r in recs], np.float32),
      np.asarray([r["group_id"] for r in recs], np.int32)))
  cols = _data(tmp_path, "sessions.json")["columns"]
  np.testing.assert_allclose(cols["adv"], want, atol=1e-5)
  assert any(abs(a) > 0 for a in cols["adv"])


def test_tree_diff_never_follows_the_agents_symlinks(tmp_path):
  (tmp_path / "a.py").write_text("x = 2\n")
  os.symlink("/etc/passwd", tmp_path / "leak.txt")
  (tmp_path / "__pycache__").mkdir()
  (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"\0\1")
  diff = tree_diff(str(tmp_path), {"a.py": "x = 1\n"})
  assert "-x = 1\n+x = 2\n" in diff
  assert "symbolic link, not followed" in diff and "root:" not in diff
  assert "pyc" not in diff
  assert tree_diff(str(tmp_path / "__pycache__"), {"a.pyc": "\0\1"}) == ""


def test_launch_view_builds_and_serves_on_localhost(tmp_path):
  synthetic_run(str(tmp_path), sessions=8, group_size=4, groups_per_step=2)
  proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "launch", "view.py"),
                           f"--workdir={tmp_path}", "--serve", "--port=0"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    lines = []
    for line in proc.stdout:  # the build's JSON, then "serving DIR at URL"
      lines.append(line)
      if line.startswith("serving "):
        break
    stats = json.loads(next(x for x in lines if x.startswith("{")))
    assert (stats["sessions"], stats["processed"]) == (8, 1)
    url = lines[-1].split(" at ")[-1].strip()
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url + "index.html", timeout=10) as r:
      assert "script-src 'self'" in r.headers["Content-Security-Policy"]
      assert b"Content-Security-Policy" in r.read()
    with urllib.request.urlopen(url + "data/index.json", timeout=10) as r:
      assert json.load(r)["sessions"] == 8
  finally:
    proc.terminate()
    proc.wait(timeout=10)
