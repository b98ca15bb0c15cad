"""Online RL through the server (issue #11): a scripted user's feedback teaches a preference.

The policy (a tiny byte model) is first trained on demonstrations that answer "which
function does this code define?" correctly but mostly verbosely. It is then served by the
OpenAI-compatible server; a scripted user (a separate process with the official `openai`
client) works through tasks over the API and accepts an answer only when it is the bare
function name, rejecting the rest. The trainer learns from the server's records and
feedback (composer_rl.controller.online_rl) and publishes weights the server follows; the
summary reports the held-out preference rate (greedy, held-out function names) before and
after.

Run:
  python launch/train.py --config=experiments/online_rl.py --workdir=/tmp/online_rl
Smoke (a minute, tests): --config=experiments/online_rl.py:smoke
"""
import ml_collections


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  if variant not in ("default", "smoke"):
    raise ValueError(f"unknown variant {variant!r}; choose default or smoke")
  smoke = variant == "smoke"
  c = ml_collections.ConfigDict()
  c.kind = "online_rl"       # composer_rl.controller.online_rl
  c.seed = 0
  # A converted Hugging Face checkpoint (launch/convert_checkpoint.py) to start from: its
  # architecture, weights and tokenizer; config.model then sets only runtime fields.
  c.init_checkpoint = ""
  # Tokenizer and chat layout: 'byte' (this model), or 'qwen3' (the checkpoint's tokenizer).
  c.chat = ml_collections.ConfigDict(dict(format="byte", tokenizer="", enable_thinking=False))
  c.model = ml_collections.ConfigDict(dict(
      d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=192,
      max_seq_len=192, row_tile=32, compute_dtype="float32"))
  c.tasks = ml_collections.ConfigDict(dict(seed=0))
  c.sft = ml_collections.ConfigDict(dict(
      num_demos=2000,
      verbose_share=0.75,  # share of demonstrations answering verbosely (the habit to unlearn)
      steps=600, batch_size=16, learning_rate=3e-3, warmup_steps=20, log_every=100))
  c.serve = ml_collections.ConfigDict(dict(
      model_name="online_rl", slots=8, prefill_chunk=32, top_logprobs=5,
      default_max_tokens=48,
      rate_limit_per_minute=0,  # one local user on loopback
      system_prompt="Answer the question.",
      poll_s=0.2))           # how soon the server serves a newly published version
  c.online = ml_collections.ConfigDict(dict(
      steps=30,              # trainer steps, one published version each
      batch_size=32,         # sessions per step
      num_train_tasks=2000,  # the scripted user cycles through these
      user_workers=8,        # the user's concurrent conversations
      temperature=1.0,       # the user's sampling temperature (recorded per completion)
      max_tokens=48,
      # composer_rl.online.ingest.RewardSpec weights: the user's signals -> reward.
      reward_weights=dict(accepted=1.0, rejected=0.0),
      advantage="rloo",      # online sessions of a step share one leave-one-out baseline
      max_online_staleness=4,  # versions an online session may lag the trainer
      sim_fraction=0.0,      # share of each batch from simulated rollouts of the same tasks
      sim_group_size=4,
      learning_rate=1e-3, policy_loss="ppo_clip", clip_eps=0.2, clip_eps_high=0.28,
      anchor_every=10))      # a full weight anchor every N published versions
  c.eval = ml_collections.ConfigDict(dict(num_heldout=200))
  if smoke:
    c.model.update(d_model=32, num_heads=2, num_kv_heads=1, head_dim=16, d_ff=64)
    c.sft.update(num_demos=64, steps=4, batch_size=8, log_every=1)
    c.online.update(steps=2, batch_size=8, num_train_tasks=16, user_workers=4,
                    sim_fraction=0.25, max_tokens=16)
    c.eval.num_heldout = 8
  return c
