"""Shared pieces of the viewer tests: a real smoke run (once per test session, shared by
xdist workers), the headless browser, page navigation and screenshots."""
import fcntl
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "experiments", "tiny_bugfix.py")
TITLE = "composer_rl viewer"


def shared_dir(tmp_path_factory) -> str:
  """A directory all xdist workers of this test session share (the session's basetemp
  without xdist; its parent, the per-session dir, under xdist)."""
  base = tmp_path_factory.getbasetemp()
  return str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


def make_real_run(tmp_path_factory) -> str:
  """`launch/train.py ...:smoke` into a shared workdir, then `launch/view.py` on it; the
  first worker does it under a lock, the others reuse the result."""
  root = shared_dir(tmp_path_factory)
  wd = os.path.join(root, "viewer_real_run")
  with open(os.path.join(root, "viewer_real_run.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(os.path.join(wd, "viewer", "data", "index.json")):
      shutil.rmtree(wd, ignore_errors=True)
      out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "train.py"),
                            f"--config={CONFIG}:smoke", f"--workdir={wd}"],
                           capture_output=True, text=True, timeout=600)
      assert out.returncode == 0, out.stderr[-3000:]
      out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "view.py"),
                            f"--workdir={wd}"], capture_output=True, text=True, timeout=300)
      assert out.returncode == 0, out.stderr[-3000:]
      stats = json.loads(out.stdout.strip().splitlines()[-1])
      assert stats["processed"] == stats["sources"] > 0
  return wd


def read_records(path: str):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def record_files(wd: str):
  """{source name (file stem): records} for every file the viewer shows."""
  paths = glob.glob(os.path.join(wd, "rollouts", "*.jsonl")) + glob.glob(
      os.path.join(wd, "demos_*.jsonl"))
  return {os.path.basename(p)[:-len(".jsonl")]: read_records(p) for p in paths}


def browser():
  """Headless Chromium; a missing browser is a test failure with the install command
  (CI installs it), never a skip."""
  from composer_rl.bench.viewer import chromium_driver
  try:
    import selenium  # noqa: F401
  except ImportError:
    pytest.fail("the viewer tests need selenium: pip install -e '.[test]'")
  try:
    return chromium_driver()
  except RuntimeError as e:
    pytest.fail(str(e))


def open_page(drv, base_url: str, fragment: str, view: str):
  """Navigates to `base_url + fragment` and waits for the router to render `view`."""
  from composer_rl.bench.viewer import wait_ready
  drv.get(base_url + fragment)
  wait_ready(drv, view)


def follow(drv, element, view: str):
  """Clicks a link and waits for `view`."""
  from composer_rl.bench.viewer import wait_ready
  element.click()
  wait_ready(drv, view)


def screenshot(drv, tmp_path_factory, name: str) -> str:
  """Saves a full-height screenshot as a test artifact and prints its path."""
  d = os.path.join(shared_dir(tmp_path_factory), "viewer_screenshots")
  os.makedirs(d, exist_ok=True)
  height = drv.execute_script("return document.documentElement.scrollHeight")
  drv.set_window_size(1400, min(max(height, 800), 6000))
  drv.execute_script("window.scrollTo(0, 0)")
  time.sleep(0.1)
  path = os.path.join(d, f"{name}.png")
  drv.save_screenshot(path)
  drv.set_window_size(1400, 1000)
  print(f"screenshot: {path}")
  return path
