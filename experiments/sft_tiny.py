"""SFT of the tiny model on synthetic expert trajectories (string transforms, chat layout).

Run (CPU, about a minute):
  python launch/train.py --config=experiments/sft_tiny.py --workdir=/tmp/sft_tiny
From JSONL trajectories ({"tokens": [...], "loss_mask": [...]} per line):
  python launch/train.py --config=experiments/sft_tiny.py --workdir=/tmp/sft \
      --config.data.jsonl=/path/to/oracle.jsonl
Re-running with the same workdir resumes from the newest good checkpoint.
Starting from a converted Hugging Face checkpoint: experiments/sft_from_hf.py.
"""
import ml_collections

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.model import sharding


def base_config() -> ml_collections.ConfigDict:
  """Fields shared by the trainer's experiments (every field is documented in
  `composer_rl.train.config`)."""
  c = ml_collections.ConfigDict()
  c.mode = "sft"
  c.seed = 0
  c.init_checkpoint = ""  # '' = random init; else a launch/convert_checkpoint.py output dir
  # The byte tokenizer's vocabulary (256 bytes + 8 specials = 264) sizes the model.
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=ByteTokenizer().vocab_size, d_model=64, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=16, d_ff=128, max_seq_len=64, row_tile=16,
      compute_dtype="bfloat16", exact_numerics=True))
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1, expert=1))
  c.sharding_rules = tuple(sharding.DEFAULT_RULES)
  c.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=3e-3, warmup_steps=10, total_steps=150, end_lr_ratio=0.1,
      weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0))
  c.loss = ml_collections.ConfigDict(dict(
      policy_loss="sft", clip_eps_low=0.2, clip_eps_high=0.2, tis_cap=2.0, kl_coef=0.0,
      kl_estimator="k3", entropy_coef=0.0, aggregation="token_mean", norm_length=0))
  c.train = ml_collections.ConfigDict(dict(
      steps=150, batch_size=16, seq_len=64, micro_batch_size=8, grad_reduce="tree",
      log_every=25))
  c.checkpoint = ml_collections.ConfigDict(dict(every_steps=50, max_to_keep=3,
                                                async_save=True))
  c.data = ml_collections.ConfigDict(dict(jsonl="", synthetic_num=2000))
  c.rl = ml_collections.ConfigDict(dict(
      group_size=8, groups_per_step=2, num_prompts=32, prompt_len=4, max_new_tokens=8,
      temperature=1.0, target_token=ord("a"), advantage_estimator="grpo"))
  return c


def get_config() -> ml_collections.ConfigDict:
  return base_config()
