"""Continuous batching of many agent sessions over the engine's fixed decode slots.

One thread drives the engine: it admits ready sessions into free slots (prefilling only
their new tokens onto their saved KV cache), runs one decode step for every occupied slot,
and when a session's turn ends (it sampled <EOT>, or hit the per-turn budget) it copies the
session's cache out of the slot and hands the turn's text to a tool thread pool. Tool calls
therefore never block the decoding of other sessions. When the tool answers, the session's
observation tokens are appended and it waits for a slot again.

Weights: `set_params(params, version)` may be called from another thread (the trainer
factory) at any time; the runner applies it between decode steps. Tokens carry the version
that sampled them. So that every recorded log-prob is exactly reproducible by the trainer
under that version, a session's KV cache is never mixed across versions: sessions in slots
are re-prefilled under the new weights and saved caches of waiting sessions are dropped.

Context compaction (`RolloutConfig.compaction`, off by default; see
`composer_rl.rollout.compaction`): at a turn boundary where the context nears the model's
window, the observation is followed by an instruction (a user message) and the model
samples one summary turn, recorded like any turn. The session's cache is then dropped and
a new context (system, task, summary) is prefilled once from an empty cache, so the engine
always holds `traj.tokens[context_start:]` at cache positions from 0. The truncation
baseline (`CompactionConfig.mode='truncation'`) restarts the same way, from the system
prompt, the task and the most recent whole turns, with no summary turn.
"""
import concurrent.futures as cf
import dataclasses
import itertools
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

from composer_rl.rollout import compaction as compaction_lib
from composer_rl.rollout.chat import ChatFormat
from composer_rl.rollout.context_boundary import ContextBoundary
from composer_rl.rollout.session import LiveSession, Trajectory
from composer_rl.rollout.summary_judge import SummaryJudge, SummaryJudgeConfig
from composer_rl.sampling.batcher import SlotBatcher
from composer_rl.sampling.engine import Engine, Request

# A job is (task_id, group_id, env) or (task_id, group_id, env, session_id); env has
# reset() -> str, step(text) -> result with .observation/.done/.info, grade() -> result with
# .reward, close(). The session id keys the sampling RNG (seed, session id, position): a
# caller that resumes work gives stable ids so that no two sessions share a random stream.
Job = Tuple[Any, ...]
# What `next_job` returns when it has no job *yet* (e.g. the caller bounds how far rollouts
# may run ahead of training); the runner keeps serving its sessions and asks again.
NOT_YET = object()


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Agent-loop limits and sampling.

  system_prompt: the system message (tool documentation) every session starts with.
  max_turns: model turns before the session is ended and graded as it stands.
  max_turn_tokens: tokens the model may sample in one turn before the turn is cut.
  temperature/top_k/top_p: the sampling transform (recorded log-probs are under it).
  seed: base RNG seed; a token's key is (seed, session id, position).
  tool_workers: threads executing tool calls and grading concurrently.
  decode_steps: engine decode steps per call (`Engine.generate_many`): one dispatch and one
    host sync per block instead of per token; a slot whose turn ends inside a block waits
    for the block's end. 1 = one step per call.
  compaction: context compaction (`composer_rl.rollout.compaction.CompactionConfig`);
    disabled by default, which leaves every session exactly as without the field.
  summary_judge: an LLM-judge reward on compaction summaries added to the session's
    reward (`composer_rl.rollout.summary_judge`); weight 0 (default) = off.
  """
  system_prompt: str = ""
  max_turns: int = 4
  max_turn_tokens: int = 64
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  tool_workers: int = 4
  decode_steps: int = 8
  compaction: compaction_lib.CompactionConfig = compaction_lib.CompactionConfig()
  summary_judge: SummaryJudgeConfig = SummaryJudgeConfig()


def _work_tree_diff(env) -> Optional[str]:
  """The env's diff of its work tree against the task (inspection only: never raises,
  None for an env without `work_tree_diff`)."""
  try:
    diff = getattr(env, "work_tree_diff", None)
    return diff() if callable(diff) else None
  except Exception as e:  # a record without its diff is better than a lost session
    return f"(diff unavailable: {type(e).__name__})"


class RolloutRunner(ContextBoundary):
  """Runs sessions to completion; see module docstring."""

  def __init__(self, engine: Engine, chat: ChatFormat, config: RolloutConfig, params,
               version: int = 0, session_ids: Optional[itertools.count] = None):
    self.engine, self.chat, self.cfg = engine, chat, config
    self._pending_params: Optional[Tuple[Any, int]] = None
    self._lock = threading.Lock()
    self._ids = session_ids or itertools.count()
    self.stats = dict(reprefills=0)
    self._batcher = SlotBatcher(engine, self, params, version, config.decode_steps,
                                chat.end_of_turn, self.stats)
    # session id -> where each model turn of its current context starts in traj.tokens
    # (what truncation cuts at: a turn runs to the next one's start, observation included).
    self._turn_starts: dict = {}
    # CompactionConfig.mode -> what a firing trigger does at a turn boundary: each handler
    # returns the tokens to append (or None: it cannot apply here; the session goes on as
    # without compaction). 'none' has no handler.
    self._boundary = {"compaction": self._ask_summary, "truncation": self._truncate}
    self._summary_judge = (SummaryJudge(config.summary_judge)
                           if config.summary_judge.weight else None)

  # ---- weights -------------------------------------------------------------------------
  def set_params(self, params, version: int) -> None:
    with self._lock:
      self._pending_params = (params, version)

  @property
  def params(self):
    return self._batcher.params

  @property
  def version(self) -> int:
    return self._batcher.version

  def _apply_pending_params(self, ready):
    """Installs new weights; in-flight sessions go back to the front of `ready` with their
    caches dropped, so they are re-prefilled under the new version."""
    with self._lock:
      pending, self._pending_params = self._pending_params, None
    if pending is not None:
      requeue = self._batcher.switch(*pending)
      self.stats["reprefills"] += len(requeue)
      ready[:0] = requeue

  # ---- the batcher's client (`composer_rl.sampling.batcher.SlotClient`) ----------------
  @staticmethod
  def context(s: LiveSession) -> List[int]:
    """The session's current context: what the engine's cache holds from position 0."""
    return s.traj.tokens[s.context_start:]

  def request(self, s: LiveSession) -> Request:
    c = self.cfg
    # Each restarted context samples with its own seed (positions restart at 0).
    seed = compaction_lib.segment_seed(c.seed, len(s.traj.segments))
    return Request(seq_id=s.traj.session_id, seed=seed, temperature=c.temperature,
                   top_k=c.top_k, top_p=c.top_p)

  def budget(self, s: LiveSession) -> int:
    """Tokens the turn may still sample: a slot stops exactly where _turn_over says so."""
    return min(self._turn_budget(s) - s.turn_tokens,
               self.engine.config.max_seq_len - 1 - self._context_len(s))

  def on_token(self, s: LiveSession, token: int, logprob: float, top_ids, top_logprobs,
               version: int) -> bool:
    del top_ids, top_logprobs  # rollouts record the sampled token only
    s.append(token, sampled=True, logprob=logprob, version=version)
    s.turn_tokens += 1
    return self._turn_over(s)

  @staticmethod
  def keep_cache(s: LiveSession) -> bool:
    # A summary turn ends its context: its cache is never used again.
    return not s.summarizing

  def _turn_budget(self, s: LiveSession) -> int:
    """Tokens the current turn may sample: the summary turn has its own budget."""
    return self.cfg.compaction.summary_max_tokens if s.summarizing else self.cfg.max_turn_tokens

  @staticmethod
  def _context_len(s: LiveSession) -> int:
    """Tokens in the session's current context (what the engine's cache holds)."""
    return len(s.traj.tokens) - s.context_start

  def _turn_over(self, s: LiveSession) -> bool:
    last = s.traj.tokens[-1]
    limit = self.engine.config.max_seq_len - 1
    return (last == self.chat.end_of_turn or s.turn_tokens >= self._turn_budget(s)
            or self._context_len(s) >= limit)

  def _end_turn_text(self, s: LiveSession) -> str:
    turn = s.traj.tokens[s.turn_start:]
    if turn and turn[-1] == self.chat.end_of_turn:
      turn = turn[:-1]
    else:  # cut by the budget: close the turn with an unsampled <EOT>
      s.append(self.chat.end_of_turn, sampled=False)
    return self.chat.tok.decode(turn)

  # ---- tool side (runs in the pool) ----------------------------------------------------
  def _tool(self, s: LiveSession, text: str):
    t0 = time.perf_counter()
    try:
      result = s.env.step(text)
      out = (result.observation, bool(result.done), dict(getattr(result, "info", {}) or {}))
    except Exception as e:  # a broken tool is an observation, never a dead trainer
      out = (f"error: the tool crashed: {type(e).__name__}: {e}", False, {"tool_crash": 1})
    s.traj.metrics["tool_seconds"] = s.traj.metrics.get("tool_seconds", 0.0) + (
        time.perf_counter() - t0)
    return out

  def _grade(self, s: LiveSession, reason: str) -> Trajectory:
    t = s.traj
    self._turn_starts.pop(t.session_id, None)
    t.finish_reason = reason
    for k, v in dict(getattr(s.env, "metrics", {}) or {}).items():
      if isinstance(v, (int, float)):  # e.g. malformed_calls, tool_errors from the harness
        t.metrics[k] = float(v)
    try:
      res = s.env.grade()
      t.reward = float(res.reward)
      info = res.to_dict() if hasattr(res, "to_dict") else dict(getattr(res, "__dict__", {}))
      t.reward_info = info
      if self._summary_judge is not None and t.segments:
        self._summary_judge.apply(t, getattr(s.env, "task", None),
                                  list(getattr(s.env, "trajectory", None) or []))
    except Exception as e:
      t.reward, t.reward_info = 0.0, {"error": f"grading failed: {type(e).__name__}: {e}"}
      t.finish_reason = "error"
    finally:
      t.final_diff = _work_tree_diff(s.env)  # before close() deletes the world
      try:
        s.env.close()
      except Exception:  # closing is best effort; the world is deleted by its owner
        pass
    return t

  # ---- the loop ------------------------------------------------------------------------
  def _start(self, job: Job) -> LiveSession:
    task_id, group_id, env = job[:3]
    sid = job[3] if len(job) > 3 else next(self._ids)
    traj = Trajectory(task_id=task_id, group_id=group_id, session_id=int(sid),
                      tokens=[], loss_mask=[], logprobs=[], versions=[])
    s = LiveSession(traj=traj, env=env)
    prompt = env.reset()
    s.extend_context(self.chat.start(self.cfg.system_prompt, prompt))
    s.turn_start = len(traj.tokens)
    self._turn_starts[traj.session_id] = [s.turn_start]
    # For inspection only (composer_rl.viewer): the texts the tokens above encode, and
    # what the environment says about its task (envs without a task leave it empty).
    traj.prompt, traj.system_prompt = prompt, self.cfg.system_prompt
    task = getattr(env, "task", None)
    traj.task_info = {k: str(getattr(task, k)) for k in ("id", "family", "split")
                      if isinstance(getattr(task, k, None), str)}
    return s

  def run_stream(self, next_job: Callable[[], Optional[Job]], emit: Callable[[Trajectory], None],
                 max_in_flight: int, stop: Optional[threading.Event] = None) -> None:
    """Keeps up to `max_in_flight` sessions going, pulling jobs until `next_job` returns None
    and every session has finished; `emit` receives each finished trajectory. `next_job`
    may return NOT_YET to be asked again later."""
    eng, batcher = self.engine, self._batcher
    batcher.reset()
    ready: List[LiveSession] = []
    tools: dict = {}
    grading: dict = {}
    in_flight, exhausted = 0, False
    with cf.ThreadPoolExecutor(self.cfg.tool_workers) as pool:
      while True:
        if stop is not None and stop.is_set():
          break
        self._apply_pending_params(ready)
        waiting = False
        while not exhausted and in_flight < max_in_flight:
          job = next_job()
          if job is None:
            exhausted = True
            break
          if job is NOT_YET:
            waiting = True
            break
          ready.append(self._start(job))
          in_flight += 1
        while batcher.free and ready:  # admit ready sessions into free slots, a batch at a time
          batch = [ready.pop(0) for _ in range(min(batcher.free, len(ready)))]
          for s in batcher.admit(batch):  # its first sampled token already ended the turn
            self._finish_turn(s, pool, tools, ready, grading)
        if batcher.busy:
          for s in batcher.decode():
            self._finish_turn(s, pool, tools, ready, grading)
        elif tools or grading:
          cf.wait(list(tools) + list(grading), timeout=1.0, return_when=cf.FIRST_COMPLETED)
        elif not ready:
          if waiting:  # nothing to do until the caller has a job for us
            time.sleep(0.01)
            continue
          break  # nothing in flight and no job left
        for fut in [f for f in tools if f.done()]:
          s = tools.pop(fut)
          obs, done, info = fut.result()
          s.traj.observations.append(obs)
          s.traj.metrics["tool_crashes"] = (s.traj.metrics.get("tool_crashes", 0)
                                            + int(info.get("tool_crash", 0)))
          if done or s.traj.turns >= self.cfg.max_turns:
            # The harness also ends a session when its own turn budget runs out, which is
            # not a submission (it says so with `budget_exhausted`).
            submitted = done and not info.get("budget_exhausted")
            grading[pool.submit(self._grade, s, "submitted" if submitted else "turn_budget")] = s
            continue
          obs_tokens = self.chat.observation(obs)
          if self._triggers(s, obs_tokens):
            obs_tokens = self._boundary[self.cfg.compaction.mode](s, obs, obs_tokens) or obs_tokens
          if self._context_len(s) + len(obs_tokens) + 2 >= eng.config.max_seq_len:
            grading[pool.submit(self._grade, s, "context_full")] = s
            continue
          s.extend_context(obs_tokens)
          s.turn_tokens, s.turn_start = 0, len(s.traj.tokens)
          self._turn_starts[s.traj.session_id].append(s.turn_start)
          ready.append(s)
        for fut in [f for f in grading if f.done()]:
          grading.pop(fut)
          emit(fut.result())
          in_flight -= 1
        if exhausted and in_flight == 0:
          break

  def _finish_turn(self, s: LiveSession, pool, tools, ready, grading) -> None:
    if s.summarizing:  # no tool call: the summary restarts the context
      if not self._restart_context(s, ready):
        grading[pool.submit(self._grade, s, "context_full")] = s
      return
    s.traj.turns += 1
    text = self._end_turn_text(s)
    s.traj.turn_texts.append(text)
    tools[pool.submit(self._tool, s, text)] = s

  def run(self, jobs: List[Job], max_in_flight: Optional[int] = None,
          on_result: Optional[Callable[[Trajectory], None]] = None) -> List[Trajectory]:
    """Runs all `jobs`; returns their trajectories in job order. `on_result` (e.g. a
    progress bar's update) sees each trajectory as it finishes."""
    it = iter(jobs)
    out: List[Trajectory] = []

    def emit(t: Trajectory) -> None:
      out.append(t)
      if on_result is not None:
        on_result(t)
    self.run_stream(lambda: next(it, None), emit, max_in_flight or len(jobs))
    return sorted(out, key=lambda t: t.session_id)
