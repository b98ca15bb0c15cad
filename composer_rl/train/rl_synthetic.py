"""A verifiable toy RL task for the trainer: the real Sampler, a rule-based reward.

Tasks are fixed random prompts; the reward of a completion is the fraction of its tokens
equal to `target_token`. The policy must learn to emit that token, which GRPO does in a few
dozen steps on a tiny model -- a seconds-long end-to-end check that sampling, behaviour
log-probs, advantages, the clipped objective and the update fit together.
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np

from composer_rl.sampling.sampler import Sampler, SamplingConfig
from composer_rl.train import advantages as adv_lib
from composer_rl.train.batch import TrainBatch, build_batch
from composer_rl.train.data import TaskGroup


def make_prompts(num: int, length: int, vocab_size: int, seed: int) -> List[List[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab_size, length).tolist() for _ in range(num)]


def reward(tokens: Sequence[int], target: int) -> float:
  return float(np.mean(np.asarray(tokens) == target)) if len(tokens) else 0.0


def rollout_batch(sampler: Sampler, groups: Sequence[TaskGroup], sampling: SamplingConfig,
                  target: int, estimator: str, seq_len: int, num_rows: int, version: int
                  ) -> Tuple[TrainBatch, Dict[str, float]]:
  """Samples every group's G completions, scores them and builds the TrainBatch."""
  prompts, seq_ids, group_ids = [], [], []
  for g in groups:
    for sid in g.seq_ids():
      prompts.append(list(g.task))
      seq_ids.append(sid)
      group_ids.append(g.group_id)
  samples = sampler.generate(prompts, seq_ids, sampling)
  records, rewards = [], []
  for p, s in zip(prompts, samples):
    rewards.append(reward(s.tokens, target))
    records.append(dict(tokens=p + s.tokens, loss_mask=[0] * len(p) + [1] * len(s.tokens),
                        logprobs=[0.0] * len(p) + s.logprobs.tolist(),
                        versions=[-1] * len(p) + [version] * len(s.tokens)))
  adv = np.asarray(adv_lib.compute_advantages(estimator, np.asarray(rewards, np.float32),
                                              np.asarray(group_ids, np.int32)))
  batch = build_batch(records, seq_len, num_rows=num_rows, advantages=adv,
                      temperature=sampling.temperature, top_k=sampling.top_k,
                      top_p=sampling.top_p)
  info = dict(reward_mean=float(np.mean(rewards)),
              completion_len=float(np.mean([len(s.tokens) for s in samples])))
  return batch, info
