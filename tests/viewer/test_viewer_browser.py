"""The rollout viewer in a real browser (headless Chromium via selenium), on a REAL short
run (`launch/train.py ...:smoke`, built with `launch/view.py`), plus synthetic runs for
untrusted-text rendering and step comparison. What the page shows is checked against the
record files. Screenshots are saved under the pytest temp dir (paths printed)."""
import json
import os

try:
  from selenium.common.exceptions import NoAlertPresentException
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import Select
except ImportError:  # the `drv` fixture fails every test with the install command
  NoAlertPresentException = By = Select = None

import viewer_helpers as vh
from composer_rl.bench.viewer import synthetic_run
from composer_rl.env.tool_call_format import ToolCallError, format_tool_call, parse_tool_call
from composer_rl.rollout.session import Trajectory
from composer_rl.viewer import build, serve


def _css(drv, sel):
  return drv.find_elements(By.CSS_SELECTOR, sel)


def _calls(rec):
  out = []
  for text in rec["turn_texts"]:
    try:
      out.append(parse_tool_call(text))
    except ToolCallError as e:
      out.append(e)
  return out


def test_real_run_records_carry_the_viewer_fields(real_run):
  """The runner fills the optional Trajectory fields the viewer shows."""
  recs = vh.record_files(real_run)["rl_step_00000"]
  for r in recs:
    t = Trajectory.from_json(r)
    assert t.prompt and "Task:" in t.prompt
    assert t.task_info["family"] and t.task_info["split"] == "train"
    assert isinstance(t.final_diff, str)
    tests = t.reward_info["info"]["tests"]
    assert any(x["hidden"] for x in tests.values()) and any(not x["hidden"] for x in tests.values())
    assert len(tests) == t.reward_info["info"]["n_total"]


def test_overview_lists_every_record_file_and_draws_the_curves(drv, real_run, real_url,
                                                             tmp_path_factory):
  files = vh.record_files(real_run)
  vh.open_page(drv, real_url, "#/", "overview")
  rows = _css(drv, "table.steps tbody tr")
  assert len(rows) == len(files)
  labels = {"eval_sft": "held-out eval (sft)", "eval_rl": "held-out eval (rl)"}
  for row in rows:
    cells = row.find_elements(By.TAG_NAME, "td")
    name = next(n for n in files if cells[9].text.split("/")[-1].startswith(n))
    assert cells[0].text == labels.get(name, cells[0].text)
    assert int(cells[1].text) == len(files[name])  # sessions
    assert int(cells[2].text) == len({r["group_id"] for r in files[name]})  # groups
  rl_steps = sum(n.startswith("rl_step_") for n in files)
  assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows][1:1 + 1] == [
      "held-out eval (sft)"]  # order: demos, eval before RL, RL steps, eval after
  charts = {c.get_attribute("data-chart"): c for c in _css(drv, "figure.chart")}
  assert {"reward by RL step", "solve rate by RL step", "throughput (tokens/s)",
          "staleness (policy versions)"} <= set(charts)
  assert len(charts["reward by RL step"].find_elements(By.TAG_NAME, "circle")) == 2 * rl_steps
  assert _css(drv, "code.tb")[0].text == os.path.join(real_run, "tensorboard")
  vh.screenshot(drv, tmp_path_factory, "overview")


def test_step_group_session_show_what_the_records_hold(drv, real_run, real_url,
                                                       tmp_path_factory):
  recs = vh.record_files(real_run)["rl_step_00000"]
  vh.open_page(drv, real_url, "#/", "overview")
  vh.follow(drv, drv.find_element(By.LINK_TEXT, "RL step 0"), "step")
  assert len(_css(drv, "table.groups tbody tr")) == len({r["group_id"] for r in recs})
  vh.follow(drv, drv.find_element(By.LINK_TEXT, "open group"), "group")
  gid = int(drv.find_element(By.TAG_NAME, "h1").text.split()[1])
  group = [r for r in recs if r["group_id"] == gid]
  cards = _css(drv, ".card")
  assert len(cards) == len(group)
  for card, r in zip(cards, group):
    assert float(card.find_element(By.CSS_SELECTOR, ".reward").text) == r["reward"]
    assert card.find_element(By.TAG_NAME, "h3").text == f"session {r['session_id']}"
  vh.screenshot(drv, tmp_path_factory, "group")
  rec = group[0]
  vh.follow(drv, cards[0].find_element(By.TAG_NAME, "a"), "session")
  assert rec["task_id"] in drv.find_element(By.TAG_NAME, "h1").text
  assert float(drv.find_element(By.ID, "session-reward").text) == rec["reward"]
  turns = _css(drv, "#turns .turn")
  assert len(turns) == len(rec["turn_texts"])
  for box, call in zip(turns, _calls(rec)):  # what the harness parsed, turn by turn
    if isinstance(call, ToolCallError):
      assert f"malformed call: {call.kind}" in box.text
    else:
      assert box.find_element(By.CSS_SELECTOR, "code.name").text == call.name
  assert _css(drv, "pre.prompt")[-1].get_attribute("textContent") == rec["prompt"]
  tests = rec["reward_info"]["info"]["tests"]
  shown = {}
  for row in _css(drv, "table.tests tbody tr"):
    tid, vis, outcome = [c.get_attribute("textContent") for c in row.find_elements(By.TAG_NAME, "td")]
    shown[tid] = (vis, outcome)
  assert shown == {k: ("hidden" if v["hidden"] else "visible", v["outcome"]) for k, v in tests.items()}
  assert len(_css(drv, "#token-view .tok")) == len(rec["tokens"])
  assert len(_css(drv, "#token-view .tok.gen")) == sum(rec["loss_mask"])
  Select(drv.find_element(By.ID, "token-mode")).select_by_value("advantage")
  assert _css(drv, "#token-view .tokens")[0].get_attribute("data-mode") == "advantage"
  vh.screenshot(drv, tmp_path_factory, "session")


def test_tool_calls_and_observations_as_the_harness_saw_them(drv, real_run, real_url,
                                                              tmp_path_factory):
  files = vh.record_files(real_run)
  name = next(n for n in files if n.startswith("demos_"))  # scripted, well-formed calls
  i, rec = next((i, r) for i, r in enumerate(files[name])
                if any(not isinstance(c, ToolCallError) and c.args for c in _calls(r)))
  vh.open_page(drv, real_url, f"#/session/{name}/{i}", "session")  # the permalink
  for k, (call, obs) in enumerate(zip(_calls(rec), rec["observations"])):
    box = drv.find_element(By.ID, f"turn-{k + 1}")
    assert box.find_element(By.CSS_SELECTOR, "code.name").text == call.name
    args = {tr.get_attribute("data-arg"): tr.find_element(By.TAG_NAME, "pre").get_attribute("textContent")
            for tr in box.find_elements(By.CSS_SELECTOR, "table.args tr")}
    assert args == {a: v if isinstance(v, str) else json.dumps(v) for a, v in call.args.items()}
    assert box.find_element(By.CSS_SELECTOR, "pre.obs").get_attribute("textContent") == obs
  vh.screenshot(drv, tmp_path_factory, "session_tool_calls")


def test_search_and_filters(drv, real_run, real_url, tmp_path_factory):
  files = vh.record_files(real_run)
  every = [r for recs in files.values() for r in recs]

  def count():
    return int(drv.find_element(By.ID, "search-status").text.split()[0])

  vh.open_page(drv, real_url, "#/search?rmin=1", "search")
  assert count() == sum(r["reward"] >= 1 for r in every) > 0
  assert len(_css(drv, "table.results tbody tr")) == count()
  vh.open_page(drv, real_url, "#/search", "search")
  Select(drv.find_element(By.NAME, "src")).select_by_value("rl_step_00001")
  vh.follow(drv, drv.find_element(By.CSS_SELECTOR, "form.filters button"), "search")
  assert count() == len(files["rl_step_00001"])
  family = files["rl_step_00001"][0]["task_info"]["family"]
  vh.open_page(drv, real_url, "#/search?fam=" + family, "search")
  assert count() == sum(r.get("task_info", {}).get("family") == family for r in every)
  vh.open_page(drv, real_url, "#/search", "search")  # filters combine: start afresh
  drv.find_element(By.NAME, "q").send_keys("read_file")
  vh.follow(drv, drv.find_element(By.CSS_SELECTOR, "form.filters button"), "search")
  assert count() == sum(any(getattr(c, "name", "") == "read_file" for c in _calls(r))
                        for r in every) > 0
  # full-text search in transcripts: a line of code the demonstrator read
  needle = next(o for r in files[next(n for n in files if n.startswith("demos_"))]
                for o in r["observations"] if o.startswith("1|")).splitlines()[0][2:]
  vh.open_page(drv, real_url, "#/search?deep=1&q=" + needle.replace(" ", "%20"), "search")
  want = sum(needle.lower() in "\n".join([r.get("prompt") or "", r.get("final_diff") or ""]
                                         + r["turn_texts"] + r["observations"]).lower()
             for r in every)
  assert count() == want > 0
  vh.screenshot(drv, tmp_path_factory, "search")


PAYLOADS = ('<script>window.__pwned = 1; document.title = "pwned"</script>',
            '<img src=x onerror="window.__pwned = 2">',
            '<a href="javascript:window.__pwned=3">click</a>',
            '"><svg onload="window.__pwned=4">')


def _hostile_run(wd):
  """A run whose records carry markup everywhere the model or tools can put text."""
  synthetic_run(str(wd), sessions=8, group_size=4, groups_per_step=2)
  path = wd / "rollouts" / "rl_step_00000.jsonl"
  recs = vh.read_records(str(path))
  evil = "".join(PAYLOADS)
  r = recs[0]
  r["task_id"] = PAYLOADS[0]
  r["prompt"] = "Task: " + evil
  r["turn_texts"] = ["thinking " + PAYLOADS[1] + format_tool_call("run", {"cmd": "echo " + evil}),
                     PAYLOADS[3]] + r["turn_texts"][2:]
  r["observations"] = [evil, PAYLOADS[0]] + r["observations"][2:]
  r["final_diff"] = "+" + evil + "\n"
  r["task_info"]["family"] = PAYLOADS[1]
  r["reward_info"]["info"]["tests"] = {PAYLOADS[2]: {"outcome": PAYLOADS[3], "hidden": True}}
  r["reward_info"]["hack_attempts"] = [{"turn": 1, "kind": PAYLOADS[0], "tool": "run",
                                        "detail": evil}]
  r["segments"] = [{"turn": 2, "token": 10, "summary": evil}]
  with open(path, "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in recs)
  return recs[0]


def _assert_nothing_ran(drv):
  assert drv.execute_script("return window.__pwned") is None
  assert drv.title == vh.TITLE
  try:
    drv.switch_to.alert
    raise AssertionError("an alert opened")
  except NoAlertPresentException:
    pass
  scripts = [s.get_attribute("src") for s in _css(drv, "script")]
  assert len(scripts) == 7 and all(s.startswith("http://127.0.0.1:") for s in scripts)
  assert not _css(drv, "#app img, #app svg[onload], #app iframe")
  for a in _css(drv, "#app a"):
    assert a.get_attribute("href").split("#")[0].startswith("http://127.0.0.1:")
  assert not drv.execute_script(
      "return [...document.querySelectorAll('#app *')].some(e => [...e.attributes]"
      ".some(a => a.name.startsWith('on')))")


def test_untrusted_text_renders_as_text_and_runs_nothing(drv, tmp_path, tmp_path_factory):
  rec = _hostile_run(tmp_path)
  build.build(str(tmp_path))
  server, _ = serve.serve_in_thread(str(tmp_path / "viewer"))
  url = f"http://127.0.0.1:{server.server_port}/index.html"
  try:
    vh.open_page(drv, url, "#/session/rl_step_00000/0", "session")
    _assert_nothing_ran(drv)
    meta = _css(drv, "meta[http-equiv='Content-Security-Policy']")[0].get_attribute("content")
    assert "script-src 'self'" in meta
    text = drv.find_element(By.ID, "app").get_attribute("textContent")
    for p in PAYLOADS:
      assert p in text  # shown literally
    assert rec["turn_texts"][0] in text
    cmd = drv.find_element(By.CSS_SELECTOR, "#turn-1 table.args pre")  # parsed by the harness
    assert cmd.get_attribute("textContent") == "echo " + "".join(PAYLOADS)
    assert "compaction boundary" in text
    vh.screenshot(drv, tmp_path_factory, "untrusted_session")
    for fragment, view in (("#/", "overview"), ("#/step/rl_step_00000", "step"),
                           ("#/group/rl_step_00000/0", "group"),
                           ("#/search?deep=1&q=script", "search")):
      vh.open_page(drv, url, fragment, view)
      _assert_nothing_ran(drv)
    assert int(drv.find_element(By.ID, "search-status").text.split()[0]) == 1
  finally:
    server.shutdown()


def test_compare_two_steps_of_one_task(drv, tmp_path, tmp_path_factory):
  synthetic_run(str(tmp_path), sessions=48, group_size=4, groups_per_step=6, num_tasks=3)
  build.build(str(tmp_path))
  recs = vh.record_files(str(tmp_path))
  server, _ = serve.serve_in_thread(str(tmp_path / "viewer"))
  try:
    url = f"http://127.0.0.1:{server.server_port}/index.html"
    vh.open_page(drv, url, "#/group/rl_step_00000/0", "group")
    task = recs["rl_step_00000"][0]["task_id"]
    link = drv.find_element(By.PARTIAL_LINK_TEXT, "rl_step_0000")
    other = link.text
    vh.follow(drv, link, "compare")
    cols = _css(drv, ".compare-col")
    assert [c.get_attribute("data-src") for c in cols] == ["rl_step_00000", other]
    for col in cols:
      want = [r for r in recs[col.get_attribute("data-src")] if r["task_id"] == task]
      assert len(col.find_elements(By.CSS_SELECTOR, ".card")) == len(want)
    vh.screenshot(drv, tmp_path_factory, "compare")
  finally:
    server.shutdown()
