"""Rollout-viewer load benchmark: a synthetic run of N sessions, its viewer built and served,
and the page's load time in headless Chromium. Prints one JSON object.

  python -m composer_rl.bench.viewer [--sessions=10000] [--baseline_sessions=100] [--repeats=5]

load_ms: navigation start -> the overview rendered (`window.__viewerFirstRender`, set by
  the page's router once the overview is in the document), HTTP cache disabled, median of
  `repeats` fresh navigations; search_ms: the same to the search view with a filter applied
  over every session (`window.__viewerReadyAt`; it needs the whole session table). The baseline (a run of
  `baseline_sessions`) is measured in the same process and browser, so `load_ratio` is
  trustworthy on a shared machine when absolute times are not.
Needs Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`)
and the `selenium` package (the `test` extra).
"""
import json
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Dict, List

from absl import app, flags

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.env.tool_call_format import format_tool_call
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.session import Trajectory

_SESSIONS = flags.DEFINE_integer("sessions", 10000, "sessions in the measured run")
_BASELINE = flags.DEFINE_integer("baseline_sessions", 100, "sessions in the baseline run")
_REPEATS = flags.DEFINE_integer("repeats", 5, "page loads per measurement (median)")
_KEEP = flags.DEFINE_string("keep_dir", "", "build the runs here and keep them (default: temp)")

FAMILIES = ("off_by_one", "wrong_operator", "swapped_args", "wrong_constant", "inverted_cond")
_TRUNC = "\n[... observation truncated: 1234 chars omitted ...]\n"


def _session(rng: random.Random, chat: ChatFormat, task: int, gid: int, sid: int,
             version: int, p_solve: float) -> Trajectory:
  """One plausible session: a few tool calls (some malformed), observations, grading."""
  tok = chat.tok
  path = f"mod{task % 7}.py"
  prompt = f"Fix the bug, then submit.\nTask: Fix the bug in `f{task}` in {path}.\n"
  t = Trajectory(task_id=str(task), group_id=gid, session_id=sid, tokens=[], loss_mask=[],
                 logprobs=[], versions=[], prompt=prompt, system_prompt="",
                 task_info={"id": f"gen-{task:06d}", "family": FAMILIES[task % len(FAMILIES)],
                            "split": "train"})
  ctx = lambda ids: [(t.tokens.append(i), t.loss_mask.append(0), t.logprobs.append(0.0),
                      t.versions.append(-1)) for i in ids]
  ctx(chat.start("", prompt))
  solved = rng.random() < p_solve
  calls = [format_tool_call("read", {"path": path}, compact=True),
           format_tool_call("edit", {"path": path, "old": "i - 1", "new": "i"}, compact=True),
           format_tool_call("submit", compact=True)]
  if rng.random() < 0.3:
    calls.insert(1, "<t>[\"read\",")  # malformed (unterminated)
  for k, text in enumerate(calls):
    for i in tok.encode(text) + [tok.EOT]:
      t.tokens.append(i)
      t.loss_mask.append(1)
      t.logprobs.append(-rng.expovariate(2.0))
      t.versions.append(version)
    obs = (f"1|def f{task}(xs):\n2|    return xs[i - 1]" + (_TRUNC if rng.random() < 0.1 else "")
           if k == 0 else "edited" if "edit" in text else "submitted" if "submit" in text
           else "error: tool call must end with </t>")
    t.turn_texts.append(text)
    t.observations.append(obs)
    if k < len(calls) - 1:
      ctx(chat.observation(obs))
  t.turns = len(calls)
  t.finish_reason = "submitted"
  t.reward = 1.0 if solved else 0.0
  tests = {f"test_f{task}_{i}": {"outcome": "passed" if solved else "failed", "hidden": False}
           for i in range(3)}
  tests.update({f"test_hidden_{i}": {"outcome": "passed" if solved else "failed", "hidden": True}
                for i in range(6)})
  t.reward_info = {"reward": t.reward, "breakdown": {"tests": t.reward}, "hack_attempts": [],
                   "passed": solved, "reason": "all checks passed" if solved else "check failed",
                   "info": {"n_passed": 9 if solved else 0, "n_total": 9, "tests": tests}}
  t.metrics = {"malformed_calls": float(len(calls) - 3), "turns": float(len(calls))}
  t.final_diff = (f"--- a/{path}\n+++ b/{path}\n@@ -1,2 +1,2 @@\n def f{task}(xs):\n"
                  f"-    return xs[i - 1]\n+    return xs[i]\n")
  return t


def synthetic_run(workdir: str, sessions: int, group_size: int = 8, groups_per_step: int = 12,
                  num_tasks: int = 60, seed: int = 0) -> Dict:
  """Writes a run's rollout files (`rollouts/rl_step_*.jsonl`, the controller's format)
  and `metrics.jsonl` with `sessions` sessions; tasks repeat across steps."""
  rng = random.Random(seed)
  chat = ChatFormat(ByteTokenizer())
  per_step = group_size * groups_per_step
  steps = math.ceil(sessions / per_step)
  os.makedirs(os.path.join(workdir, "rollouts"), exist_ok=True)
  sid = 0
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as metrics:
    for step in range(steps):
      n = min(per_step, sessions - step * per_step)
      p = min(0.9, 0.1 + 0.8 * step / max(steps - 1, 1))
      trajs = []
      for g in range(math.ceil(n / group_size)):
        gid, task = step * groups_per_step + g, rng.randrange(num_tasks)
        for _ in range(min(group_size, n - g * group_size)):
          trajs.append(_session(rng, chat, task, gid, sid, max(step - rng.randrange(2), 0), p))
          sid += 1
      with open(os.path.join(workdir, "rollouts", f"rl_step_{step:05d}.jsonl"), "w") as f:
        for t in trajs:
          f.write(json.dumps(t.to_json()) + "\n")
      rewards = [t.reward for t in trajs]
      metrics.write(json.dumps(dict(
          step=step, phase="rl", time=step * 10.0, reward_mean=sum(rewards) / len(rewards),
          solve_rate=sum(r >= 1 for r in rewards) / len(rewards), staleness_mean=0.5,
          generated_tokens=float(sum(t.num_generated for t in trajs)), step_seconds=10.0,
          trained_tokens_per_s=float(sum(t.num_generated for t in trajs)) / 6.0)) + "\n")
  return dict(sessions=sid, steps=steps)


def chromium_driver(width: int = 1400, height: int = 1000):
  """Headless Chromium from Debian's packages through selenium (never downloads a browser:
  the driver path is given, so Selenium Manager is not asked)."""
  from selenium import webdriver  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.chrome.options import Options  # pylint: disable=g-import-not-at-top
  from selenium.webdriver.chrome.service import Service  # pylint: disable=g-import-not-at-top
  browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
  if not browser or not driver:
    raise RuntimeError("the viewer needs Debian's chromium and chromium-driver: "
                       "apt-get install -y chromium chromium-driver")
  opts = Options()
  opts.binary_location = browser
  for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--window-size={width},{height}", "--disable-extensions", "--no-first-run"):
    opts.add_argument(a)
  opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
  return webdriver.Chrome(options=opts, service=Service(driver))


def wait_ready(drv, view: str, timeout: float = 20.0) -> None:
  """Waits until the page's router says `view` is rendered (body[data-ready])."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if drv.execute_script("return document.body && document.body.dataset.ready") == view:
      return
    time.sleep(0.02)
  raise TimeoutError(f"view {view!r} not rendered: "
                     f"{drv.execute_script('return document.body.dataset.ready')}")


def _load_ms(drv, url: str, view: str, repeats: int) -> List[float]:
  out = []
  for _ in range(repeats):
    drv.get("about:blank")
    drv.get(url)
    wait_ready(drv, view, timeout=60)
    if view == "overview":
      out.append(drv.execute_script("return window.__viewerFirstRender"))
    else:
      out.append(drv.execute_script("return window.__viewerReadyAt"))
  return [round(x, 1) for x in out]


def measure(drv, root: str, sessions: int, repeats: int) -> Dict:
  from composer_rl.viewer import build, serve  # pylint: disable=g-import-not-at-top
  wd = os.path.join(root, f"run_{sessions}")
  t0 = time.time()
  info = synthetic_run(wd, sessions)
  gen_s = time.time() - t0
  stats = build.build(wd)
  noop = build.build(wd)
  server, _ = serve.serve_in_thread(stats["out"])
  try:
    base = f"http://127.0.0.1:{server.server_port}/index.html"
    load = _load_ms(drv, base + "#/", "overview", repeats)
    search = _load_ms(drv, base + "#/search?rmin=1", "search", repeats)
  finally:
    server.shutdown()
  shards = len(os.listdir(os.path.join(stats["out"], "data", "shards")))
  return dict(sessions=info["sessions"], steps=info["steps"], load_ms=statistics.median(load),
              load_ms_all=load, search_ms=statistics.median(search),
              index_bytes=stats["index_bytes"], sessions_bytes=stats["sessions_bytes"],
              shards=shards, build_seconds=stats["seconds"],
              rebuild_unchanged_seconds=noop["seconds"], generate_seconds=round(gen_s, 2))


def main(argv):
  del argv
  root = _KEEP.value or tempfile.mkdtemp(prefix="viewer_bench_")
  drv = chromium_driver()
  try:
    drv.execute_cdp_cmd("Network.enable", {})
    drv.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    base = measure(drv, root, _BASELINE.value, _REPEATS.value)
    big = measure(drv, root, _SESSIONS.value, _REPEATS.value)
  finally:
    drv.quit()
    if not _KEEP.value:
      shutil.rmtree(root, ignore_errors=True)
  print(json.dumps(dict(big, baseline=base,
                        load_ratio_vs_baseline=round(big["load_ms"] / base["load_ms"], 3),
                        under_2s=big["load_ms"] < 2000)))


if __name__ == "__main__":
  app.run(main)
