"""Supervised fine-tuning (SFT / mid-training) on expert trajectories.

The same train step as RL with policy_loss='sft' (token-mean negative log-likelihood), and
the same masking: only tokens the *agent* produced (loss_mask 1) are trained on; the
system prompt, the task, tool observations and padding only condition. Scoring uses the
plain distribution (temperature 1, no top-k / top-p). Checkpoints, mesh and parameters are
those of the RL run, so an experiment continues from SFT into RL on the same state.
"""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model.config import ModelConfig
from composer_rl.train import losses
from composer_rl.train.batch import TrainBatch, build_batch
from composer_rl.train.optimizer import OptimizerConfig
from composer_rl.train.train_step import TrainConfig, TrainStep, make_train_step


def sft_train_config(optimizer: OptimizerConfig, micro_batch_size: int = 1,
                     grad_reduce: str = "tree") -> TrainConfig:
  return TrainConfig(optimizer=optimizer, micro_batch_size=micro_batch_size,
                     grad_reduce=grad_reduce,
                     loss=losses.LossConfig(policy_loss="sft", aggregation="token_mean"))


def make_sft_step(model_config: ModelConfig, optimizer: OptimizerConfig, mesh,
                  micro_batch_size: int = 1, rules=None) -> TrainStep:
  cfg = sft_train_config(optimizer, micro_batch_size)
  return make_train_step(model_config, cfg, mesh, *(() if rules is None else (rules,)))


def sft_batch(records: Sequence[Any], seq_len: int, num_rows: Optional[int] = None
              ) -> TrainBatch:
  """Records with tokens + loss_mask (e.g. oracle `Trajectory`s) -> a TrainBatch."""
  return build_batch(records, seq_len, num_rows=num_rows)


# ---- a synthetic expert: deterministic string tasks in the chat layout -----------------
_OPS = {"reverse": lambda s: s[::-1], "upper": str.upper, "double": lambda s: s + s}


def synthetic_records(num: int, seed: int, max_word: int = 6) -> List[Dict[str, Any]]:
  """Oracle trajectories of a toy string-transform agent, in `rollout.chat` layout:

    <BOS><SYS>you transform strings<EOT><USER>reverse: abc<EOT><ASSISTANT>cba<EOT>

  loss_mask is 1 on the assistant's tokens (its answer and the closing <EOT>) only.
  """
  tok = ByteTokenizer()
  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghij"))
  out = []
  for _ in range(num):
    op = list(_OPS)[int(rng.integers(len(_OPS)))]
    word = "".join(rng.choice(letters, int(rng.integers(2, max_word + 1))))
    prompt = ([tok.BOS, tok.SYS] + tok.encode("you transform strings") + [tok.EOT, tok.USER]
              + tok.encode(f"{op}: {word}") + [tok.EOT, tok.ASSISTANT])
    answer = tok.encode(_OPS[op](word)) + [tok.EOT]
    out.append(dict(tokens=prompt + answer, loss_mask=[0] * len(prompt) + [1] * len(answer)))
  return out
