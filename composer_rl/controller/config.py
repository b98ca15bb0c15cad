"""The config schema of each controller kind, and `validate(config)` for any kind.

`launch/train.py` validates the whole config before any work starts, and each kind's
`run` does it again (library callers get the same errors): an unknown field, a value of
the wrong type or out of range is a `ConfigError` naming it. Missing optional fields are
filled in with the defaults below, which are the only place those defaults live.
Kinds: 'agent_rl', 'compaction_ablation', 'pipeline', 'online_rl', and '' (the trainer
alone: `composer_rl.train.config.build`).
"""
from typing import Optional

from composer_rl.config import ConfigError, Dataclass, Field, Free, Section, describe
from composer_rl.config import validate as _validate


def _names(module: str, attr: str):
  """Allowed values: the names in registry `module.attr`, read at validation time."""
  def names():
    import importlib  # pylint: disable=g-import-not-at-top
    return list(getattr(importlib.import_module(module), attr))
  return names


def _model_config():
  from composer_rl.model.config import ModelConfig  # pylint: disable=g-import-not-at-top
  return ModelConfig


def _compaction_config():
  from composer_rl.rollout.compaction import CompactionConfig  # pylint: disable=g-import-not-at-top
  return CompactionConfig


def _judge_config():
  from composer_rl.rollout.summary_judge import SummaryJudgeConfig  # pylint: disable=g-import-not-at-top
  return SummaryJudgeConfig


def _serve_settings():
  from composer_rl.serving.settings import ServeSettings  # pylint: disable=g-import-not-at-top
  return ServeSettings


def _context_modes():
  from composer_rl.rollout.compaction import CONTEXT_MODES  # pylint: disable=g-import-not-at-top
  return CONTEXT_MODES


POS, NONNEG = dict(min=1), dict(min=0)


def _policy_update(advantage: str, learning_rate: float, temperature_doc: str):
  """The fields of an RL update (agent RL's `rl`, online RL's `online`)."""
  return dict(
      advantage=Field(advantage, str, "advantage estimator",
                      choices=_names("composer_rl.train.advantages", "ESTIMATORS")),
      policy_loss=Field("ppo_clip", str, "policy loss",
                        choices=_names("composer_rl.train.losses", "POLICY_LOSSES")),
      clip_eps=Field(0.2, float, "PPO clip, lower side", min=0.0),
      clip_eps_high=Field(0.28, float, "PPO clip, upper side", min=0.0),
      learning_rate=Field(learning_rate, float, "learning rate", min=0.0),
      temperature=Field(1.0, float, temperature_doc, min=0.0))


MODEL = Dataclass(_model_config, "fields of composer_rl.model.ModelConfig; vocab_size comes "
                  "from the tokenizer", exclude=("vocab_size",))

INIT_CHECKPOINT = Field("", str, "a converted Hugging Face checkpoint "
                        "(launch/convert_checkpoint.py): its architecture, weights and "
                        "tokenizer (hf_files/) start the run; config.model then sets only "
                        "runtime fields (max_seq_len, compute_dtype, ...)")
_CHAT_FIELDS = dict(
    format=Field("byte", str, "tokenizer, session layout and tool-call syntax",
                 choices=_names("composer_rl.rollout.formats", "CHAT_FORMATS")),
    tokenizer=Field("", str, "directory with the tokenizer.json of formats that read "
                    "one ('qwen3')"),
    enable_thinking=Field(False, bool, "qwen3: turns may open with reasoning (False: "
                          "each opens with an empty <think> block, as Qwen3's "
                          "enable_thinking=False prompt does)"))
CHAT = Section(_CHAT_FIELDS)
# Agent RL can also make its tokenizer: from-scratch models in a real chat format.
AGENT_CHAT = Section(dict(_CHAT_FIELDS, bpe_vocab_size=Field(
    0, int, "qwen3 without a tokenizer or checkpoint: train a byte-level BPE tokenizer "
    "shaped like Qwen3's of at most this many tokens (fewer when no pair of its corpus "
    "repeats) at run time, on the demonstrator's sessions of train tasks, into "
    "workdir/tokenizer (0 = off)", **NONNEG)))

AGENT_RL = Section(dict(
    kind=Field("agent_rl", str, "what launch/train.py runs", choices=("agent_rl",)),
    seed=Field(0, int, "parameter init, task order and sampling seed", **NONNEG),
    init_checkpoint=INIT_CHECKPOINT,
    model=MODEL,
    mesh=Section(dict(
        train_fraction=Field(0.5, float, "share of the host's devices in the train mesh (one "
                             "device: training and sampling share it)", min=0.0, max=1.0),
        inference_meshes=Field(1, int, "engines, one per inference mesh", **POS),
        train_fsdp=Field(1, int, "ways the train step splits parameters, AdamW moments and "
                         "gradients over the train devices (FSDP; -1 = all of them); the "
                         "rest are data-parallel",
                         check=lambda v: None if v == -1 or v >= 1 else "use -1 or >= 1"))),
    chat=AGENT_CHAT,
    env=Section(dict(
        max_turns=Field(4, int, "tool calls before a session ends without submitting", **POS),
        grade_timeout_s=Field(30.0, float, "wall clock of one grading run", min=1e-3),
        system_prompt=Field("", str, "the system message of every session"),
        tools=Field((), tuple, "the harness's tools (empty = all)",
                    choices=_names("composer_rl.env.tool_call_format", "TOOL_SCHEMAS")))),
    tasks=Section(dict(
        seed=Field(0, int, "task generator seed (splits are disjoint)", **NONNEG),
        family=Field("generated", str, "task source",
                     choices=_names("composer_rl.env.tasks", "TASK_SOURCES")),
        dir=Field("", str, "the 'dir' source's tasks (a launch/make_tasks.py --out)"))),
    sft=Section(dict(
        demo_policy=Field("weak_oracle", str, "the demonstrator",
                          choices=_names("composer_rl.env.policies", "POLICIES")),
        demo_policy_args=Free("keyword arguments of the demonstrator"),
        num_demos=Field(2000, int, "demonstrator sessions (train split)", **POS),
        steps=Field(600, int, "SFT steps", **NONNEG),
        batch_size=Field(8, int, "rows per SFT step", **POS),
        learning_rate=Field(2e-3, float, "peak learning rate", min=0.0),
        warmup_steps=Field(20, int, "linear warm-up steps", **NONNEG),
        log_every=Field(25, int, "steps between metric rows", **POS),
        copy_rows=Field(0, int, "synthetic copy rows mixed into each batch", **NONNEG),
        copy_rows_kind=Field("recall", str, "what the copy rows teach",
                             choices=_names("composer_rl.data.copy_curriculum", "COPY_ROWS")),
        copy_rows_args=Free("keyword arguments of the copy-row builder"),
        copy_only_steps=Field(0, int, "leading steps of copy rows only", **NONNEG))),
    rl=Section(dict(
        mode=Field("async", str, "'async': rollouts and training overlap; 'sync': in turn",
                   choices=("async", "sync")),
        rollouts=Field("local", str, "where rollouts run: engines in this process, or remote "
                       "workers (launch/rollout_worker.py)", choices=("local", "remote")),
        steps=Field(60, int, "RL steps", **NONNEG),
        group_size=Field(8, int, "rollouts per task (the advantage's group)", **POS),
        groups_per_step=Field(4, int, "task visits per train step", **POS),
        num_train_tasks=Field(2000, int, "train tasks groups are drawn from", **POS),
        **_policy_update("grpo", 1e-4, "sampling temperature"),
        top_k=Field(0, int, "top-k sampling (0 = off)", **NONNEG),
        top_p=Field(1.0, float, "nucleus sampling (1 = off)", min=1e-6, max=1.0),
        slots=Field(16, int, "decode slots of each engine", **POS),
        prefill_chunk=Field(64, int, "prompt tokens per prefill call", **POS),
        decode_steps=Field(8, int, "decode steps per engine call", **POS),
        max_turn_tokens=Field(160, int, "sampled tokens per model turn", **POS),
        max_in_flight=Field(48, int, "sessions alive at once per engine", **POS),
        queue_groups=Field(8, int, "complete groups buffered before the factory pauses",
                           **POS),
        max_staleness=Field(2, int, "policy versions a group may lag (older groups are "
                            "dropped; None = unbounded)", optional=True, **NONNEG),
        tool_workers=Field(2, int, "threads running tools and grading", **POS),
        checkpoint_every=Field(5, int, "RL steps between checkpoints", **POS),
        shared_dir=Field("", str, "rl.rollouts='remote': the directory shared with workers"),
        worker_lease_s=Field(60.0, float, "a remote worker's group lease", min=1e-3),
        compaction=Dataclass(_compaction_config, "context compaction (off by default)"),
        summary_judge=Dataclass(_judge_config, "LLM judge on summaries (off by default)"))),
    eval=Section(dict(
        num_heldout=Field(200, int, "held-out tasks of the greedy evaluations", **NONNEG),
        context_mode=Field("", str, "evaluation's context mode ('' = as in RL)",
                           choices=lambda: ("",) + tuple(_context_modes())),
        full_window_max_seq_len=Field(0, int, "also evaluate with this window (0 = off)",
                                      **NONNEG))),
))


def _check_arms(arms) -> None:
  if not hasattr(arms, "keys") or not arms:
    raise ConfigError(f"config.arms: expected a mapping arm -> [rl mode, eval mode], got "
                      f"{arms!r}")
  for name, modes in arms.items():
    modes = tuple(modes) if isinstance(modes, (list, tuple)) else (modes,)
    if len(modes) != 2 or any(m not in _context_modes() for m in modes):
      raise ConfigError(f"config.arms.{name}: expected [rl mode, eval mode] from "
                        f"{list(_context_modes())}, got {modes!r}")


ONLINE_RL = Section(dict(
    kind=Field("online_rl", str, "what launch/train.py runs", choices=("online_rl",)),
    seed=Field(0, int, "parameter init and sampling seed", **NONNEG),
    init_checkpoint=INIT_CHECKPOINT,
    model=MODEL,
    chat=CHAT,
    serve=Dataclass(_serve_settings, "the server's settings (composer_rl.serving.service)"),
    tasks=Section(dict(seed=Field(0, int, "task generator seed", **NONNEG))),
    eval=Section(dict(num_heldout=Field(200, int, "held-out questions evaluated", **NONNEG))),
    sft=Section(dict(
        num_demos=Field(2000, int, "demonstration answers", **POS),
        verbose_share=Field(0.75, float, "share of verbose demonstrations", min=0.0, max=1.0),
        steps=Field(600, int, "SFT steps", **NONNEG),
        batch_size=Field(16, int, "rows per SFT step", **POS),
        learning_rate=Field(3e-3, float, "peak learning rate", min=0.0),
        warmup_steps=Field(20, int, "linear warm-up steps", **NONNEG),
        log_every=Field(100, int, "steps between metric rows", **POS))),
    online=Section(dict(
        steps=Field(30, int, "online RL steps", **NONNEG),
        batch_size=Field(32, int, "sessions per step", **POS),
        num_train_tasks=Field(2000, int, "questions the simulated users ask", **POS),
        **_policy_update("rloo", 1e-3, "the simulated users' sampling temperature"),
        max_tokens=Field(48, int, "tokens per reply", **POS),
        max_online_staleness=Field(4, int, "weight versions a served session may lag",
                                   **NONNEG),
        anchor_every=Field(10, int, "a full weight anchor every this many versions", **POS),
        reward_weights=Free("feedback kind -> reward"),
        sim_fraction=Field(0.0, float, "share of each batch from simulated sessions",
                           min=0.0, max=1.0),
        sim_group_size=Field(4, int, "simulated sessions per task", **POS),
        user_workers=Field(8, int, "simulated users' threads", **POS))),
))

SCHEMAS = {"agent_rl": AGENT_RL, "online_rl": ONLINE_RL}
KINDS = ("agent_rl", "compaction_ablation", "pipeline", "online_rl", "")


def main(argv) -> None:
  """python -m composer_rl.controller.config --kind=agent_rl: each field, default, meaning."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  for path, text in describe(SCHEMAS[flags.FLAGS.kind]).items():
    print(f"{path} = {text}")


def _check_tasks(tasks) -> None:
  if tasks.family == "dir" and not tasks.dir:
    raise ConfigError("config.tasks.dir: the 'dir' task source needs the directory "
                      "launch/make_tasks.py --out wrote")
  if tasks.dir and tasks.family != "dir":
    raise ConfigError(f"config.tasks.dir is set but config.tasks.family={tasks.family!r}; "
                      "use family='dir' to train on that directory's tasks")


def validate(config, kind: Optional[str] = None) -> None:
  """Validates an experiment config in place (defaults filled in). `kind`: the kind it
  must be (default: its `kind` field; a pipeline's `agent` section has none)."""
  if kind is None:
    kind = config.get("kind", "") if hasattr(config, "get") else None
  if kind not in KINDS:
    raise ConfigError(f"config.kind: {kind!r}; choose one of {list(KINDS)}")
  if kind in SCHEMAS:
    _validate(config, SCHEMAS[kind])
    if kind == "agent_rl":
      _check_tasks(config.tasks)
  elif kind == "compaction_ablation":
    _validate(config, Section(dict(kind=Field(kind, str), agent=AGENT_RL, arms=Free())))
    _check_tasks(config.agent.tasks)
    _check_arms(config.arms)
  elif kind == "pipeline":
    from composer_rl.train import config as train_config  # pylint: disable=g-import-not-at-top
    _validate(config, Section(dict(
        kind=Field(kind, str), agent=AGENT_RL, pretrain=Free(),
        init_checkpoint=Field("", str, "a converted Hugging Face checkpoint every arm starts "
                              "from (its weights, tokenizer, chat format, architecture); "
                              "'' = a fresh model"),
        compare_without_pretraining=Field(True, bool, "also run stages 2+3 without stage 1"))))
    _check_tasks(config.agent.tasks)
    try:
      train_config.build(config.pretrain)
    except ConfigError as e:
      raise ConfigError(str(e).replace("config.", "config.pretrain.", 1)) from None
  else:
    from composer_rl.train import config as train_config  # pylint: disable=g-import-not-at-top
    train_config.build(config)


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_enum("kind", "agent_rl", sorted(SCHEMAS), "the kind whose fields to list")
  app.run(main)
