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


def _check_same_architecture(config) -> None:
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
  _check_same_architecture(config)
  os.makedirs(workdir, exist_ok=True)
  cpt_dir, after_dir, scratch_dir = (os.path.join(workdir, a) for a in ARMS)
  cpt = _stage(cpt_dir, lambda w: trainer.train(config.pretrain, w))
  after = _stage(after_dir, lambda w: agent_rl.run(
      config.agent, w, init_params=jax.device_get(trainer.final_params(config.pretrain,
                                                                         cpt_dir))))
  out = dict(seed=config.agent.seed,
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
