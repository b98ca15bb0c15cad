"""Context compaction trained inside the RL loop (issue #7): a key gathered across a session
longer than the window.

The tiny_bugfix experiment on the "keychain" task family (key.py must return a key whose
parts sit in m1..m4; composer_rl/env/tasks/keychain.py) with a deliberately small window
(`model.max_seq_len=640`): a session that reads the four modules and writes the key takes
1.05-1.42x the window, so the parts read first are gone from the context by the time the
key is written, unless a summary carried them (`k1 = 'Q' k2 = 'H'`). SFT imitates the
`key_collector` demonstrator (it summarizes when asked and writes the key on 80 % of tasks,
else gives up) after a first stage of synthetic copy rows alone (a from-scratch model must
learn to copy before it can carry a part), with copy rows still mixed in; RL trains with
compaction on. Ablation result: trained compaction 23 %, compaction at evaluation only 21 %,
truncation 0 % of held-out tasks (BUILD_NOTES section 11, where the first design, on the
"multifile" family, also is).

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

from composer_rl.env.tasks import keychain

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
  c.tasks.family = "keychain"      # composer_rl.env.tasks.TASK_SOURCES name
  c.env.system_prompt = "Do the task, then submit."
  # The window (tiny_bugfix's): a context holds the task, a summary and ~2 module reads; a
  # session that reads all four does not fit (~810 tokens; the ablation's reference
  # evaluates with full_window_max_seq_len).
  c.model.max_seq_len = 640
  c.env.max_turns = 8              # 4 reads + edit + submit, with slack
  # Read and edit only: `run` could print a module's part (or a test failure could), and
  # `search` could grep them all at once, shortcuts around remembering what was read.
  c.env.tools = ("read_file", "edit")
  c.sft.demo_policy = "key_collector"
  # Writes the key on 80 % of tasks, else gives up: at 0.5 the greedy SFT policy gave up on
  # 93 % of held-out tasks, leaving RL little to start from.
  c.sft.demo_policy_args = dict(fix_prob=0.8, seed=0)
  # composer_rl.rollout.compaction.CompactionConfig fields.
  c.rl.compaction = ml_collections.ConfigDict(dict(
      enabled=True,
      mode="compaction",           # 'compaction' | 'truncation' | 'none' (the arms)
      # Fires at a turn boundary once the context with the pending observation holds 352
      # tokens: mostly after the second read and after the third (2.0 restarts per
      # demonstration, `python -m composer_rl.bench.long_sessions`).
      trigger_fraction=0.55,
      max_turns_per_context=0,
      max_compactions=3,
      summary_max_tokens=48,       # the demonstrator's summaries are <= 35 bytes
      instruction="Summarize your work so far.",
      # Truncation keeps the system prompt, the task and the newest turns in half the window.
      truncation_keep_fraction=0.5))
  # Sessions are ~3x tiny_bugfix's; 40 steps and 100 held-out tasks keep the three-arm
  # ablation near an hour on 2 CPU cores.
  # The optional rubric reward on summaries (composer_rl.rollout.summary_judge), off:
  # weight > 0 adds weight * the judge's mean summary score to each RL session's reward.
  c.rl.summary_judge = ml_collections.ConfigDict(dict(
      weight=0.0,
      judge="http",                # composer_rl.env.judge.JUDGES name
      # An OpenAI-compatible server, e.g. launch/serve.py with a judge model's checkpoint.
      judge_args=dict(base_url="http://127.0.0.1:8000/v1", model="", api_key_env=""),
      rubric=""))                  # '' = composer_rl.env.judge.SUMMARY_RUBRIC
  if not smoke:
    c.rl.steps, c.eval.num_heldout = 40, 100
    # 4 of each SFT batch's 10 rows are synthetic copy rows (composer_rl.data.copy_curriculum):
    # the demonstrations alone never taught this from-scratch model to copy a part it read
    # (1,500 steps: the copied characters stayed at chance, BUILD_NOTES section 11).
    # The first 600 SFT steps train on copy rows alone (sft.copy_only_steps): mixed in, they
    # are ~6 % of the trained tokens and 800 steps formed no copy; alone, the copy forms in
    # ~400-600 steps (python -m composer_rl.bench.copying --mode=probe --rows=typed_parts
    # --seq_len=640 --max_gap=120). Then 800 steps of demonstrations with 4 copy rows.
    c.sft.steps, c.sft.batch_size, c.sft.copy_rows, c.sft.copy_only_steps = 1400, 10, 4, 600
  # Copy rows in the family's own form (numbered module lines, then each part recalled by
  # name): general recall rows ("recall") left the SFT policy writing each part's most
  # common letter, never a copy (BUILD_NOTES section 11).
  c.sft.copy_rows_kind = "parts"   # composer_rl.data.copy_curriculum.COPY_ROWS name
  c.sft.copy_rows_args = dict(alphabets=keychain.PART_ALPHABETS)
  c.eval.context_mode = ""         # '' = as in RL; else a CompactionConfig mode
  c.eval.full_window_max_seq_len = 0  # > 0: also evaluate the RL policy with this window
  if smoke:
    c.model.max_seq_len = 512      # the smoke model is tiny; its sessions stay short
    c.rl.compaction.update(trigger_fraction=0.3, summary_max_tokens=16, max_compactions=2)
    c.rl.max_turn_tokens = 24
    c.sft.copy_rows = 1
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
  c.agent.eval.full_window_max_seq_len = 1024
  # arm -> [RL context mode, evaluation context mode]; every arm gets c.agent's budget.
  c.arms = ml_collections.ConfigDict({k: list(v) for k, v in ARMS.items()})
  return c
