"""Progress lines: count, rate and ETA, one line per update in a log file."""
import io
import os
import subprocess
import sys

from composer_rl.progress import progress


def test_log_file_gets_count_rate_and_eta_lines(monkeypatch):
  monkeypatch.setenv("COMPOSER_RL_PROGRESS_S", "0")
  out = io.StringIO()
  with progress(4, "demonstrations", "sessions", stream=out) as bar:
    for _ in range(4):
      bar.update(1)
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue() and len(lines) >= 2
  assert lines[-1].startswith("demonstrations: 100%") and "4/4" in lines[-1]
  assert "sessions/s" in lines[-1]
  assert "<" in lines[1]  # elapsed<remaining: the ETA


def test_iterable_and_off_switch(monkeypatch):
  out = io.StringIO()
  assert list(progress(3, "x", iterable=range(3), stream=out)) == [0, 1, 2]
  assert "3/3" in out.getvalue()
  monkeypatch.setenv("COMPOSER_RL_PROGRESS", "0")
  out = io.StringIO()
  assert list(progress(3, "x", iterable=range(3), stream=out)) == [0, 1, 2]
  assert out.getvalue() == ""


def test_trainer_run_shows_progress(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(
      [sys.executable, os.path.join(root, "launch", "train.py"),
       "--config=" + os.path.join(root, "experiments", "sft_tiny.py"),
       f"--workdir={tmp_path}", "--config.train.steps=3", "--config.train.log_every=1"],
      capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": root, "COMPOSER_RL_PROGRESS_S": "0"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "sft: 100%" in proc.stderr and "3/3" in proc.stderr, proc.stderr[-2000:]
  # the one metrics writer: TensorBoard events and the curves PNG on the trainer path too
  assert os.listdir(os.path.join(tmp_path, "tensorboard"))
  assert os.path.getsize(os.path.join(tmp_path, "curves.png")) > 0
