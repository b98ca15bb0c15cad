"""Context compaction trained inside the RL loop (issue #7): long bug-fix sessions, small window.

The tiny_bugfix experiment on the "multifile" task family (the buggy function hides in one
of 5 modules; reading them all takes ~1.1-1.5k tokens) with a deliberately small window
(`model.max_seq_len=1024`), so sessions that must read far carry "which modules are ruled
out / which one holds the function" through summaries. SFT imitates the `long_weak_oracle`
demonstrator (it summarizes when asked, and fixes the bug on 40 % of tasks); RL trains
with compaction on.

Variants (`--config=experiments/tiny_compaction.py:VARIANT`):
  default / smoke           one agent-RL run, compaction in training and evaluation
  truncation                one run, truncation in training and evaluation (arm c)
  no_compaction_train       one run, context_mode 'none' in training, compaction at
                            evaluation only (arm b)
  ablation / ablation_smoke the three arms above (a, b, c) with the same training budget
                            (composer_rl.controller.ablation, kind 'compaction_ablation'),
                            each also evaluated with a full window (`eval.full_window_max_seq_len`,
                            the reference: same parameters, a window the sessions fit in)

Run:
  python launch/train.py --config=experiments/tiny_compaction.py:ablation --workdir=/tmp/tiny_compaction
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_bugfix  # noqa: E402  (experiments/ is not a package)

# arm name -> (context mode in RL rollouts, context mode at evaluation)
ARMS = {
    "compaction": ("compaction", "compaction"),            # (a) trained in the loop
    "compaction_eval_only": ("none", "compaction"),        # (b) not trained, used at eval
    "truncation": ("truncation", "truncation"),            # (c) the baseline
}


def agent_config(smoke: bool = False) -> ml_collections.ConfigDict:
  """The single-run agent-RL config (arm a)."""
  c = tiny_bugfix.get_config("smoke" if smoke else "default")
  c.tasks.family = "multifile"     # composer_rl.env.tasks.TASK_SOURCES name
  # The window: a context holds the task, a summary and ~2 module reads; a session that
  # reads every module does not fit (ablation reference: full_window_max_seq_len).
  c.model.max_seq_len = 1024
  c.env.max_turns = 10             # 5 reads + a re-read + edit + submit, with slack
  # No `search`: one grep for `def f(` would find the module without reading (and
  # remembering) anything, the shortcut this family exists to rule out.
  c.env.tools = ("list_dir", "read_file", "edit", "write_file", "run")
  c.sft.demo_policy = "long_weak_oracle"
  c.sft.demo_policy_args = dict(fix_prob=0.4, run_tests=False, seed=0)
  # composer_rl.rollout.compaction.CompactionConfig fields.
  c.rl.compaction = ml_collections.ConfigDict(dict(
      enabled=True,
      mode="compaction",           # 'compaction' | 'truncation' | 'none' (the arms)
      # Fires with the pending observation included: 0.55 leaves room for one more module
      # (<= ~330 tokens) plus the instruction and a summary, and a context restarted with a
      # summary can re-read a module without firing again.
      trigger_fraction=0.55,
      max_turns_per_context=0,
      max_compactions=4,
      summary_max_tokens=64,       # the demonstrator's summaries are <= ~45 bytes
      instruction="Summarize your work so far.",
      truncation_keep_fraction=0.5))
  c.eval.context_mode = ""         # '' = as in RL; else a CompactionConfig mode
  c.eval.full_window_max_seq_len = 0  # > 0: also evaluate the RL policy with this window
  if smoke:
    c.model.max_seq_len = 512      # the smoke model is tiny; its sessions stay short
    c.rl.compaction.update(trigger_fraction=0.3, summary_max_tokens=16, max_compactions=2)
    c.rl.max_turn_tokens = 24
    c.env.max_turns = 3
  return c


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  smoke = variant.endswith("smoke")
  base = variant[:-len("_smoke")] if variant.endswith("_smoke") else variant
  if variant == "smoke":
    base = "default"
  if base in ("default", "truncation", "no_compaction_train"):
    c = agent_config(smoke)
    train_mode, eval_mode = {"default": ARMS["compaction"], "truncation": ARMS["truncation"],
                             "no_compaction_train": ARMS["compaction_eval_only"]}[base]
    c.rl.compaction.mode, c.eval.context_mode = train_mode, eval_mode
    return c
  if base != "ablation":
    raise ValueError(f"unknown variant {variant!r}; choose default, smoke, truncation, "
                     "no_compaction_train, ablation or ablation_smoke (any with _smoke)")
  c = ml_collections.ConfigDict()
  c.kind = "compaction_ablation"   # composer_rl.controller.ablation
  c.agent = agent_config(smoke)
  c.agent.eval.full_window_max_seq_len = 2048 if not smoke else 1024
  # arm -> [RL context mode, evaluation context mode]; every arm gets c.agent's budget.
  c.arms = ml_collections.ConfigDict({k: list(v) for k, v in ARMS.items()})
  return c
