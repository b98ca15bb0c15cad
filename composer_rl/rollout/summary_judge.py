"""An LLM-judge reward on compaction summaries: an auxiliary term, off by default (issue #7).

The task reward says whether the whole session succeeded; it credits a summary only
through that outcome. A rubric judge (`composer_rl.env.judge`) can also score each summary
directly -- did it keep what the task still needs? -- and `weight * mean(scores)` is added
to the session's reward. Summaries remain policy actions trained like any other tokens;
this only shapes the reward they earn.

Each summary is judged on the work it replaces: the tool calls and observations of the
context it ends (`traj.segments[k]["turn"]` counts the model turns before restart k), with
the task prompt and `rubric` (default `SUMMARY_RUBRIC`). Truncation restarts have no
summary and are not judged. A judge that fails or answers without one valid `SCORE:` line
scores `ERROR_SCORE` (0), with the reason kept in `traj.reward_info["summary_judge"]`.

Config (`config.rl.summary_judge`, `RolloutConfig.summary_judge`):
  weight      the term's weight; 0 (default) turns it off and calls no judge.
  judge       a `composer_rl.env.judge.JUDGES` name ('http': an OpenAI-compatible server).
  judge_args  that judge's keyword arguments (e.g. base_url, model, api_key_env).
  rubric      '' = SUMMARY_RUBRIC.
The controller applies it to RL rollouts only: evaluation reports the task reward.
"""
import dataclasses
from typing import Any, Callable, Dict, List, Optional

from composer_rl.env import judge as judge_lib


@dataclasses.dataclass(frozen=True)
class SummaryJudgeConfig:
  weight: float = 0.0
  judge: str = "http"
  judge_args: Dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
  rubric: str = ""

  def __post_init__(self):
    if self.weight < 0:
      raise ValueError(f"summary_judge.weight must be >= 0, got {self.weight}")
    if self.weight and self.judge not in judge_lib.JUDGES:
      raise ValueError(f"summary_judge.judge={self.judge!r}: choose one of "
                       f"{judge_lib.JUDGES.names()}")


class SummaryJudge:
  """Scores a finished session's summaries and adds the weighted mean to its reward."""

  def __init__(self, cfg: SummaryJudgeConfig, judge: Optional[Callable[[str], str]] = None):
    self.cfg = cfg
    self.rubric = cfg.rubric or judge_lib.SUMMARY_RUBRIC
    self.judge = judge or judge_lib.make_judge(cfg.judge, **dict(cfg.judge_args))

  def score(self, task, steps: List[dict], segments: List[dict]) -> List[dict]:
    """One {"summary", "score", "error"} per summary, in order."""
    out, start = [], 0
    for seg in segments:
      end = int(seg["turn"])
      if seg.get("summary") is not None and "dropped_turns" not in seg:
        work = [st for st in steps if start < int(st.get("turn", 0)) <= end]
        r = judge_lib.score_prompt(self.judge, judge_lib.build_summary_prompt(
            self.rubric, task, work, seg["summary"]))
        out.append(dict(summary=seg["summary"], score=r.score, error=r.error))
      start = end
    return out

  def apply(self, traj, task, steps: List[dict]) -> None:
    """Adds `weight * mean(score)` to `traj.reward` (no summaries: no change)."""
    scored = self.score(task, steps, traj.segments)
    if not scored:
      return
    mean = sum(r["score"] for r in scored) / len(scored)
    traj.reward_info = dict(traj.reward_info or {}, task_reward=traj.reward,
                            summary_judge=dict(weight=self.cfg.weight, mean=mean,
                                               summaries=scored))
    traj.metrics["summary_judge_score"] = mean
    traj.metrics["summary_judge_errors"] = float(sum(r["error"] is not None for r in scored))
    traj.reward = float(traj.reward + self.cfg.weight * mean)
