"""Experiment config (ml_collections) -> validated dataclasses, with errors naming the field.

An experiment's `get_config()` returns a ConfigDict with these sections (see
`experiments/sft_tiny.py` for a complete, commented example):

  mode        'sft' (supervised on trajectories), 'pretrain' (next-token training on a
              packed code corpus) or 'rl_synthetic' (GRPO with the real sampler on a
              verifiable toy reward).
  seed        parameter init, data shuffling and sampling seed.
  init_checkpoint  optional: a directory written by `launch/convert_checkpoint.py` (a
              Hugging Face Qwen3 / Qwen3-MoE checkpoint converted to Orbax). Training starts
              from its weights, and its architecture fills `model`, where only fields that do
              not change the parameters (max_seq_len, compute_dtype, row_tile, attention
              blocks, ...) may be set; an architecture field that disagrees is an error.
  model       fields of `composer_rl.model.ModelConfig`.
  mesh        sizes of the mesh axes data / fsdp / tensor / expert (product = devices used;
              one axis may be -1: all remaining devices, e.g. data=-1 on a cluster).
  sharding_rules  ((logical_axis, mesh_axis or None), ...) for the parameters.
  optimizer   fields of `composer_rl.train.optimizer.OptimizerConfig`.
  loss        fields of `composer_rl.train.losses.LossConfig`.
  train       steps, batch_size (rows per step; RL: groups_per_step * group_size), seq_len,
              micro_batch_size, grad_reduce, log_every.
  checkpoint  every_steps, max_to_keep, async_save.
  data        SFT: jsonl (path; '' = synthetic), synthetic_num.
  corpus      pretrain: the code corpus and held-out evaluation (`composer_rl.train.pretrain`).
  rl          group_size, groups_per_step, num_prompts, prompt_len, max_new_tokens,
              temperature, target_token, advantage_estimator.
"""
import dataclasses
from typing import Any, Dict

from composer_rl.config import ConfigError
from composer_rl.model import sharding as shd
from composer_rl.model.config import ARCHITECTURE_FIELDS, ModelConfig  # noqa: F401  (re-exported)
from composer_rl.train import advantages, losses
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig

MODES = ("sft", "rl_synthetic", "pretrain")


# Top-level sections of a trainer experiment (`kind` '' or absent).
SECTIONS = ("kind", "mode", "seed", "init_checkpoint", "model", "mesh", "sharding_rules",
            "optimizer", "loss", "train", "checkpoint", "data", "corpus", "rl", "serve")


def _fields(section: str, cls, values: Dict[str, Any]):
  known = {f.name for f in dataclasses.fields(cls)}
  for k in values:
    if k not in known:
      raise ConfigError(f"config.{section}.{k}: unknown field; known: {sorted(known)}")
  try:
    return cls(**values)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.{section}: {e}") from None


# Fields of the trainer's plain sections (unknown ones are errors).
SECTION_FIELDS = {
    "train": ("steps", "batch_size", "seq_len", "micro_batch_size", "grad_reduce",
              "log_every"),
    "checkpoint": ("every_steps", "max_to_keep", "async_save"),
    "data": ("jsonl", "synthetic_num"),
    "rl": ("group_size", "groups_per_step", "num_prompts", "prompt_len", "max_new_tokens",
           "temperature", "target_token", "advantage_estimator"),
}


def _only(config, section: str) -> None:
  known = SECTION_FIELDS[section]
  for k in config.get(section, None) or {}:
    if k not in known:
      raise ConfigError(f"config.{section}.{k}: unknown field; known: {sorted(known)}")


def _need(config, path: str, kind):
  node = config
  for part in path.split("."):
    if part not in node:
      raise ConfigError(f"config.{path}: missing")
    node = node[part]
  if kind is float and isinstance(node, int) and not isinstance(node, bool):
    node = float(node)
  if not isinstance(node, kind) or (kind is int and isinstance(node, bool)):
    raise ConfigError(f"config.{path}: expected {kind.__name__}, got {node!r}")
  return node


@dataclasses.dataclass(frozen=True)
class Experiment:
  """The validated config."""
  mode: str
  seed: int
  model: ModelConfig
  mesh: Dict[str, int]
  rules: tuple
  train: TrainConfig
  raw: Any
  init_checkpoint: str = ""


def build(config) -> Experiment:
  """Validates `config` and builds the dataclasses; raises ConfigError naming the field."""
  for k in config:
    if k not in SECTIONS:
      raise ConfigError(f"config.{k}: unknown field; known: {sorted(SECTIONS)}")
  for section in SECTION_FIELDS:
    _only(config, section)
  mode = _need(config, "mode", str)
  if mode not in MODES:
    raise ConfigError(f"config.mode: {mode!r}; choose one of {MODES}")
  seed = _need(config, "seed", int)
  init = config.get("init_checkpoint", "") or ""
  model = _model(config, init)
  mesh = dict(config.mesh)
  for k, v in mesh.items():
    if k not in shd.MESH_AXES:
      raise ConfigError(f"config.mesh.{k}: unknown mesh axis; known: {shd.MESH_AXES}")
    if not isinstance(v, int) or isinstance(v, bool) or not (v > 0 or v == -1):
      raise ConfigError(f"config.mesh.{k}: expected a positive int (or -1: all remaining "
                        f"devices), got {v!r}")
  if list(mesh.values()).count(-1) > 1:
    raise ConfigError(f"config.mesh: at most one axis may be -1, got {mesh}")
  rules = tuple(tuple(r) for r in config.sharding_rules)
  for r in rules:
    if len(r) != 2 or (r[1] is not None and r[1] not in shd.MESH_AXES):
      raise ConfigError(f"config.sharding_rules: bad rule {r!r}; want (logical, mesh axis "
                        f"in {shd.MESH_AXES} or None)")
  opt = _fields("optimizer", OptimizerConfig, dict(config.optimizer))
  loss = _fields("loss", losses.LossConfig, dict(config.loss))
  for name, kind in (("steps", int), ("batch_size", int), ("seq_len", int),
                     ("micro_batch_size", int), ("grad_reduce", str), ("log_every", int)):
    _need(config, f"train.{name}", kind)
  t = config.train
  try:
    train = TrainConfig(optimizer=opt, loss=loss, micro_batch_size=t.micro_batch_size,
                        grad_reduce=t.grad_reduce)
  except ValueError as e:
    raise ConfigError(f"config.train: {e}") from None
  if t.steps <= 0 or t.batch_size <= 0:
    raise ConfigError(f"config.train.steps / batch_size must be positive, got {t.steps}, "
                      f"{t.batch_size}")
  if not 2 <= t.seq_len <= model.max_seq_len:
    raise ConfigError(f"config.train.seq_len={t.seq_len} must be in [2, model.max_seq_len="
                      f"{model.max_seq_len}]")
  _need(config, "checkpoint.every_steps", int)
  _need(config, "checkpoint.max_to_keep", int)
  _need(config, "checkpoint.async_save", bool)
  if mode == "rl_synthetic":
    for name, kind in (("group_size", int), ("groups_per_step", int), ("num_prompts", int),
                       ("prompt_len", int), ("max_new_tokens", int), ("temperature", float),
                       ("target_token", int), ("advantage_estimator", str)):
      _need(config, f"rl.{name}", kind)
    r = config.rl
    if r.advantage_estimator not in advantages.ESTIMATORS:
      raise ConfigError(f"config.rl.advantage_estimator: {r.advantage_estimator!r}; known: "
                        f"{sorted(advantages.ESTIMATORS)}")
    if r.group_size * r.groups_per_step != t.batch_size:
      raise ConfigError(f"config.train.batch_size={t.batch_size} must equal rl.group_size * "
                        f"rl.groups_per_step = {r.group_size * r.groups_per_step}")
    if r.prompt_len + r.max_new_tokens > t.seq_len:
      raise ConfigError(f"config.rl.prompt_len + rl.max_new_tokens = "
                        f"{r.prompt_len + r.max_new_tokens} exceeds train.seq_len={t.seq_len}")
    if not 0 <= r.target_token < model.vocab_size:
      raise ConfigError(f"config.rl.target_token={r.target_token} outside the vocabulary")
  if mode in ("sft", "pretrain") and loss.policy_loss != "sft":
    raise ConfigError(f"config.loss.policy_loss must be 'sft' in mode {mode!r}, got "
                      f"{loss.policy_loss!r}")
  if mode == "pretrain":
    _check_corpus(config, model, t.seq_len)
  return Experiment(mode=mode, seed=seed, model=model, mesh=mesh, rules=rules, train=train,
                    raw=config, init_checkpoint=init)


def _check_corpus(config, model: ModelConfig, seq_len: int) -> None:
  from composer_rl.train import pretrain  # pylint: disable=g-import-not-at-top
  if "corpus" not in config:
    raise ConfigError("config.corpus: missing (mode 'pretrain' reads a code corpus)")
  section = dict(config.corpus)
  known = set(pretrain.CORPUS_FIELDS) | set(pretrain.SHARD_SOURCES) | {
      "dirs", "tokenizer", "eval_max_rows"}
  for k in section:
    if k not in known:
      raise ConfigError(f"config.corpus.{k}: unknown field; known: {sorted(known)}")
  tok = section.get("tokenizer", "byte")
  if tok not in pretrain.TOKENIZERS:
    raise ConfigError(f"config.corpus.tokenizer: {tok!r}; known: {sorted(pretrain.TOKENIZERS)}")
  if int(section.get("eval_max_rows", 64)) <= 0:
    raise ConfigError("config.corpus.eval_max_rows must be positive")
  align = pretrain.alignment(model)
  if seq_len % align:
    raise ConfigError(f"config.train.seq_len={seq_len} must be a multiple of "
                      f"the model's attention key block {align} (packed documents start on key "
                      "blocks, which keeps packing bitwise)")
  try:
    pretrain.corpus_settings(section, 0)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.corpus: {e}") from None


def _model(config, init: str) -> ModelConfig:
  given = dict(config.model)
  if not init:
    return _fields("model", ModelConfig, given)
  from composer_rl.model import hf_qwen3  # pylint: disable=g-import-not-at-top
  try:
    base = dataclasses.asdict(hf_qwen3.load_model_config(init))
  except (OSError, ValueError) as e:
    raise ConfigError(f"config.init_checkpoint={init!r}: {e}") from None
  norm = lambda k, v: tuple(v or ()) if k == "moe_layers" else v
  for k in ARCHITECTURE_FIELDS:
    if k in given and norm(k, given[k]) != norm(k, base[k]):
      raise ConfigError(f"config.model.{k}={given[k]!r} disagrees with the checkpoint "
                        f"{init} ({base[k]!r}); leave it out to take the checkpoint's")
  return _fields("model", ModelConfig, {**base, **given})
