"""The optional LLM-judge reward on compaction summaries (issue #7): each summary is judged
on the work it replaces, the weighted mean score is added to the session's reward (the task
reward is kept beside it), a failing judge costs the term and never the session, and the
'http' judge speaks the OpenAI chat-completions protocol."""
import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from composer_rl.env import judge as judge_lib
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.runner import RolloutRunner
from composer_rl.rollout.session import Trajectory
from composer_rl.rollout.summary_judge import SummaryJudge, SummaryJudgeConfig
from tests.rollout.test_compaction import CFG, TURNS
from tests.rollout.test_runner import CountingEnv


class JudgeServer:
  """A local OpenAI-compatible endpoint standing in for a judge model: answers every chat
  completion with `answer` (or HTTP `status`), and records the requests it got."""

  def __init__(self, answer="Good.\nSCORE: 7", status=200, key=""):
    self.answer, self.status, self.key, self.requests = answer, status, key, []
    outer = self

    class Handler(BaseHTTPRequestHandler):
      def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        outer.requests.append(dict(path=self.path, body=body,
                                   auth=self.headers.get("Authorization", "")))
        ok = outer.status == 200 and (not outer.key
                                      or self.headers.get("Authorization") == f"Bearer {outer.key}")
        reply = ({"choices": [{"message": {"role": "assistant", "content": outer.answer}}]}
                 if ok else {"error": {"message": "no"}})
        data = json.dumps(reply).encode()
        self.send_response(200 if ok else (outer.status if outer.status != 200 else 401))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *a):
        pass

    self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


class _Task:
  prompt = "count bytes"


STEPS = [dict(turn=i, action=f"act{i}", observation=f"obs{i}") for i in range(1, 7)]


def _traj(segments, reward=1.0):
  t = Trajectory("t", 0, 0, [], [], [], [])
  t.reward, t.reward_info, t.segments = reward, {"passed": True}, segments
  return t


def test_each_summary_is_judged_on_the_work_it_replaces():
  prompts = []

  def judge(prompt):
    prompts.append(prompt)
    return "SCORE: 10" if "S1" in prompt.split("SUMMARY:")[-1] else "meh\nSCORE: 4"

  j = SummaryJudge(SummaryJudgeConfig(weight=0.5), judge=judge)
  # Restarts after turns 2 (summary S1), 4 (truncation: no summary) and 5 (summary S3).
  t = _traj([dict(turn=2, token=10, summary="S1"),
             dict(turn=4, token=20, summary="", dropped_turns=1),
             dict(turn=5, token=30, summary="S3")])
  j.apply(t, _Task(), STEPS)
  assert len(prompts) == 2  # the truncation restart is not judged
  first, second = prompts
  assert judge_lib.SUMMARY_RUBRIC in first and "TASK:\ncount bytes" in first
  assert "act1" in first and "act2" in first and "act3" not in first
  assert first.endswith("SUMMARY:\nS1")
  # The task's own words are shown as written, whatever they contain.
  class Odd:
    prompt = "see TRAJECTORY: below"
  assert "TASK:\nsee TRAJECTORY: below\n" in judge_lib.build_summary_prompt("r", Odd(), [], "s")
  # S3 replaces the context that began after the truncation restart: turn 5 only.
  assert "act5" in second and "act4" not in second and "act6" not in second
  assert t.reward == pytest.approx(1.0 + 0.5 * (1.0 + 0.4) / 2)
  info = t.reward_info
  assert info["task_reward"] == 1.0 and info["passed"] is True
  assert [s["score"] for s in info["summary_judge"]["summaries"]] == [1.0, 0.4]
  assert t.metrics["summary_judge_score"] == pytest.approx(0.7)
  assert t.metrics["summary_judge_errors"] == 0
  # No summaries: nothing is asked and nothing changes.
  t = _traj([dict(turn=2, token=10, summary="", dropped_turns=1)], reward=0.0)
  j.apply(t, _Task(), STEPS)
  assert len(prompts) == 2 and t.reward == 0.0 and "summary_judge" not in t.reward_info


def test_a_failing_judge_costs_the_term_with_its_reason():
  def broken(prompt):
    raise ConnectionError("judge down")

  for judge, why in [(broken, "judge raised ConnectionError: judge down"),
                     (lambda p: "no score here", "expected exactly one SCORE line, found 0"),
                     (lambda p: "SCORE: 11", "score 11.0 outside [0, 10]")]:
    t = _traj([dict(turn=1, token=5, summary="S")], reward=1.0)
    SummaryJudge(SummaryJudgeConfig(weight=1.0), judge=judge).apply(t, _Task(), STEPS)
    assert t.reward == 1.0 and t.metrics["summary_judge_errors"] == 1
    assert t.reward_info["summary_judge"]["summaries"][0]["error"] == why


def test_config_is_checked():
  with pytest.raises(ValueError, match="weight"):
    SummaryJudgeConfig(weight=-1.0)
  with pytest.raises(ValueError, match="choose one of"):
    SummaryJudgeConfig(weight=1.0, judge="oracle")
  SummaryJudgeConfig(weight=0.0, judge="oracle")  # off: the judge is never built
  with pytest.raises(ValueError, match="http"):
    judge_lib.make_judge("http", base_url="localhost:8000")
  with pytest.raises(ValueError, match="NO_SUCH_JUDGE_KEY"):
    judge_lib.make_judge("http", base_url="http://127.0.0.1:1/v1", api_key_env="NO_SUCH_JUDGE_KEY")


def test_http_judge_speaks_chat_completions(monkeypatch):
  server = JudgeServer(key="sekret")
  try:
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "sekret")
    judge = judge_lib.make_judge("http", base_url=server.base_url, model="judge-1",
                                 api_key_env="JUDGE_KEY_FOR_TEST", max_tokens=32)
    r = judge_lib.score_prompt(judge, "rate this")
    assert (r.score, r.error) == (0.7, None)
    req, = server.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sekret"
    assert req["body"]["model"] == "judge-1" and req["body"]["temperature"] == 0
    assert req["body"]["messages"] == [{"role": "user", "content": "rate this"}]
    # A refused request (wrong key) and a server error are error scores with the reason.
    bad = judge_lib.make_judge("http", base_url=server.base_url)
    assert "HTTP 401" in judge_lib.score_prompt(bad, "x").error
    server.status = 500
    assert "HTTP 500" in judge_lib.score_prompt(judge, "x").error
  finally:
    server.close()
  gone = judge_lib.score_prompt(judge, "x")  # nobody listening any more
  assert gone.score == judge_lib.ERROR_SCORE and gone.error.startswith("judge raised")


class _JudgedEnv(CountingEnv):
  """CountingEnv with what the harness exposes to the judge: its task and its steps."""

  task = _Task()

  def __init__(self, turns):
    super().__init__(turns=turns, delay=0.0)
    self.trajectory = []

  def step(self, text):
    r = super().step(text)
    self.trajectory.append(dict(turn=len(self.seen), action=text, observation=r.observation))
    return r


def test_runner_adds_the_judged_term_to_compacted_sessions(window_160):
  tok, model, eng = window_160
  server = JudgeServer(answer="SCORE: 8")
  try:
    cfg = dataclasses.replace(CFG, summary_judge=SummaryJudgeConfig(
        weight=0.5, judge="http", judge_args=dict(base_url=server.base_url)))
    trajs = RolloutRunner(eng, ChatFormat(tok), cfg, eng.load_params()).run(
        [(f"t{i}", i, _JudgedEnv(n)) for i, n in enumerate(TURNS)], max_in_flight=3)
  finally:
    server.close()
  summaries = [s for t in trajs for s in t.segments]
  assert len(server.requests) == len(summaries) > 0
  for t in trajs:
    if t.segments:
      task_reward = t.reward_info["task_reward"]
      assert t.reward == pytest.approx(task_reward + 0.5 * 0.8)
      assert t.metrics["summary_judge_score"] == pytest.approx(0.8)
    else:  # never compacted: the task reward alone, no judge call
      assert "summary_judge" not in t.reward_info and "summary_judge_score" not in t.metrics
  asked = [r["body"]["messages"][0]["content"] for r in server.requests]
  assert sorted(p.split("SUMMARY:\n")[-1] for p in asked) == sorted(s["summary"] for s in summaries)
