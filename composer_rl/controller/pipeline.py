"""Continued pretraining -> SFT -> RL as one experiment, compared with SFT -> RL alone.

`run(config, workdir)` is what `launch/train.py` runs for `kind='pipeline'`
(`experiments/tiny_pipeline.py`):
  stage 1  `config.pretrain` (a trainer experiment, mode 'pretrain') in workdir/stage1_cpt:
           next-token training on a code corpus, held-out perplexity before and after;
  stage 2+3  `config.agent` (an agent-RL experiment) in workdir/stage23_after_cpt, its SFT
           starting from stage 1's final weights: SFT, held-out solve rate, RL, solve rate;
  baseline the same agent experiment from a fresh initialization in workdir/stage23_scratch
           (when `compare_without_pretraining`), so the two arms differ only in stage 1.
Every stage resumes from its own workdir; a finished stage is read back from its
summary.json, so re-running the command after a kill continues where it stopped.

`config.init_checkpoint` (a converted Hugging Face checkpoint) starts the experiment from a
real model instead of a fresh one: stage 1 continues pretraining its weights on the corpus
tokenized with its tokenizer, stages 2+3 run in its chat format ('qwen3') from stage 1's
weights, and the baseline arm from the checkpoint's own weights. Both stages then have the
checkpoint's architecture (the experiment's from-scratch architecture fields are dropped).
"""
import json
import os
from typing import Any, Dict

import jax

from composer_rl.controller import agent_rl
from composer_rl.controller import config as kinds
from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import ModelConfig
from composer_rl.train import config as config_lib
from composer_rl.train import trainer

ARMS = ("stage1_cpt", "stage23_after_cpt", "stage23_scratch")


def with_checkpoint(config):
  """The pipeline's stage configs with `config.init_checkpoint` applied (a copy; `config`
  itself when there is none). The checkpoint decides what only it can: the corpus
  tokenizer ('hf'), the chat format ('qwen3' for a byte-format agent) and the
  architecture. A stage that names another checkpoint is an error."""
  ckpt = config.init_checkpoint
  if not ckpt:
    return config
  config = config.copy_and_resolve_references()
  for stage in ("pretrain", "agent"):
    own = config[stage].get("init_checkpoint", "")
    if own and own != ckpt:
      raise config_lib.ConfigError(
          f"config.{stage}.init_checkpoint={own!r} differs from config.init_checkpoint="
          f"{ckpt!r}: the pipeline starts every arm from config.init_checkpoint")
  with config.unlocked():
    config.pretrain.init_checkpoint = ckpt
    config.pretrain.corpus.tokenizer = "hf"
    for field in config_lib.ARCHITECTURE_FIELDS:
      if field in config.pretrain.model:
        del config.pretrain.model[field]
    config.agent.init_checkpoint = ckpt
    if config.agent.chat.format == "byte":
      config.agent.chat.format = "qwen3"
  return config


def _check_same_architecture(config) -> None:
  if config.init_checkpoint:  # both stages take the checkpoint's
    return
  pre = config_lib.build(config.pretrain).model
  agent = ModelConfig(**dict(config.agent.model), vocab_size=ByteTokenizer().vocab_size)
  for field in config_lib.ARCHITECTURE_FIELDS:
    if getattr(pre, field) != getattr(agent, field):
      raise config_lib.ConfigError(
          f"config.pretrain.model.{field}={getattr(pre, field)!r} differs from "
          f"config.agent.model.{field}={getattr(agent, field)!r}: stage 2 starts from stage "
          "1's weights, so the architectures must be equal")


def _stage(workdir: str, fn) -> Dict[str, Any]:
  """Runs (or resumes) one stage; a finished stage's summary.json is read back instead."""
  path = os.path.join(workdir, "summary.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  summary = fn(workdir)
  with open(path + ".tmp", "w") as f:
    json.dump(summary, f)
  os.replace(path + ".tmp", path)
  return summary


def run(config, workdir: str) -> Dict[str, Any]:
  kinds.validate(config, "pipeline")
  config = with_checkpoint(config)
  _check_same_architecture(config)
  os.makedirs(workdir, exist_ok=True)
  cpt_dir, after_dir, scratch_dir = (os.path.join(workdir, a) for a in ARMS)
  cpt = _stage(cpt_dir, lambda w: trainer.train(config.pretrain, w))
  after = _stage(after_dir, lambda w: agent_rl.run(
      config.agent, w, init_params=jax.device_get(trainer.final_params(config.pretrain,
                                                                         cpt_dir))))
  out = dict(seed=config.agent.seed, init_checkpoint=config.init_checkpoint,
             heldout_perplexity_before_cpt=cpt["heldout_perplexity_before"],
             heldout_perplexity_after_cpt=cpt["heldout_perplexity_after"],
             cpt_steps=cpt["steps"], corpus_train_files=cpt["corpus"]["train_files"],
             corpus_heldout_files=cpt["corpus"]["heldout_files"],
             heldout_solve_rate_sft=after["heldout_solve_rate_sft"],
             heldout_solve_rate_rl=after["heldout_solve_rate_rl"])
  if config.compare_without_pretraining:
    scratch = _stage(scratch_dir, lambda w: agent_rl.run(config.agent, w))
    out.update(no_cpt_heldout_solve_rate_sft=scratch["heldout_solve_rate_sft"],
               no_cpt_heldout_solve_rate_rl=scratch["heldout_solve_rate_rl"],
               cpt_gain_points_sft=100 * (out["heldout_solve_rate_sft"]
                                          - scratch["heldout_solve_rate_sft"]),
               cpt_gain_points_rl=100 * (out["heldout_solve_rate_rl"]
                                         - scratch["heldout_solve_rate_rl"]))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(out, f)
  print(json.dumps(out), flush=True)
  return out
