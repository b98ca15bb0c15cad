"""GRPO on a verifiable toy reward with the real sampler (reward = fraction of generated
tokens equal to `rl.target_token`); the reward rises within a few dozen steps on CPU.

Run (CPU, about a minute):
  python launch/train.py --config=experiments/rl_synthetic_tiny.py --workdir=/tmp/rl_tiny
DAPO-style clip-higher: add --config.loss.clip_eps_high=0.28; Dr. GRPO:
  --config.rl.advantage_estimator=dr_grpo --config.loss.aggregation=seq_mean_token_sum_norm
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sft_tiny import base_config  # noqa: E402  (experiments/ is not a package)


def get_config():
  c = base_config()
  c.mode = "rl_synthetic"
  c.loss.policy_loss = "ppo_clip"
  c.optimizer.learning_rate = 1e-2
  c.optimizer.warmup_steps = 0
  c.optimizer.total_steps = 40
  c.train.steps = 40
  c.train.batch_size = 16  # rl.groups_per_step * rl.group_size
  c.train.seq_len = 16
  c.train.micro_batch_size = 4
  c.train.log_every = 5
  c.checkpoint.every_steps = 10
  return c
