"""SFT on oracle sessions, then async GRPO on generated bug-fix tasks in the sandbox.

Run (the README's main job):
  python launch/train.py --config=experiments/tiny_bugfix.py --workdir=/tmp/tiny_bugfix
A quick smoke run: --config=experiments/tiny_bugfix.py:smoke
The last stdout line is a JSON summary with heldout_solve_rate_sft / heldout_solve_rate_rl.
"""
import ml_collections


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "agent_rl"   # which controller launch/train.py runs
  c.seed = 0
  # A converted Hugging Face checkpoint to start from (launch/convert_checkpoint.py; with
  # chat.format='qwen3' its tokenizer comes along); '' = this from-scratch byte model.
  c.init_checkpoint = ""
  # Byte-level model (vocab = the tokenizer's 264). max_seq_len bounds a whole session.
  c.model = ml_collections.ConfigDict(dict(
      d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, d_ff=384,
      max_seq_len=640, row_tile=32, compute_dtype="float32"))
  # How the controller splits the host's devices (composer_rl.controller.placement): with
  # one device (a laptop CPU) training and sampling share it.
  c.mesh = ml_collections.ConfigDict(dict(
      train_fraction=0.5,     # share of devices in the train mesh
      inference_meshes=1,     # engines, one per inference mesh, each running whole groups
      train_fsdp=1))          # parameters split this many ways in the train step (-1: all)
  # Tokenizer, session layout and tool-call syntax (composer_rl.rollout.formats): 'byte'
  # for this from-scratch model; 'qwen3' with chat.tokenizer = a directory holding a
  # Qwen3-style tokenizer.json (e.g. composer_rl.data.bpe.train_qwen3_style's).
  c.chat = ml_collections.ConfigDict(dict(format="byte", tokenizer="", enable_thinking=False))
  c.env = ml_collections.ConfigDict(dict(
      max_turns=4,            # tool calls before a session ends without submitting
      grade_timeout_s=30.0,   # wall clock of one grading run
      # Every byte is a token for this model, so the instructions are terse ({tools} would
      # insert the 200-byte tool description).
      system_prompt="Fix the bug, then submit."))
  c.tasks = ml_collections.ConfigDict(dict(
      seed=0,                 # generator seed (splits are disjoint)
      family="generated",     # composer_rl.env.tasks.TASK_SOURCES name
      dir=""))                # family='dir': your repository's tasks (launch/make_tasks.py)
  c.sft = ml_collections.ConfigDict(dict(
      # The demonstrator (composer_rl.env.policies registry): an imperfect expert that fixes
      # the bug on `fix_prob` of the tasks and gives up on the rest, as a weaker model's
      # transcripts would. SFT imitates both; RL has to find out which one earns reward.
      demo_policy="weak_oracle",
      demo_policy_args=dict(fix_prob=0.4, run_tests=False, seed=0),
      num_demos=2000,         # demonstrator sessions (train split), cached in the workdir
      steps=600, batch_size=8, learning_rate=2e-3, warmup_steps=20, log_every=25))
  c.rl = ml_collections.ConfigDict(dict(
      mode="async",           # 'async' (factories overlap) or 'sync' (no overlap)
      steps=60,
      group_size=8,           # G rollouts per task: the group the advantage is relative to
      groups_per_step=4,      # task visits per train step
      num_train_tasks=2000,   # tasks are drawn from the first N of the train split
      slots=16,               # decode slots of the engine
      decode_steps=8,         # engine decode steps per call (one host sync per block)
      prefill_chunk=64,
      max_in_flight=48,       # sessions alive at once (slots + those waiting on tools)
      queue_groups=8,         # complete groups buffered before the rollout factory pauses
      # Groups whose oldest token is more than this many versions old are dropped; the
      # factory runs at most (max_staleness + 1) * groups_per_step groups ahead of training.
      max_staleness=2,
      max_turn_tokens=160,    # tokens per model turn before the turn is cut
      temperature=1.0, top_k=0, top_p=1.0,
      learning_rate=1e-4, policy_loss="ppo_clip", clip_eps=0.2, clip_eps_high=0.28,
      advantage="grpo",       # composer_rl.train.advantages registry name
      tool_workers=2,
      checkpoint_every=5,     # RL steps between checkpoints (weights + rollout ledger)
      # 'local': rollouts in this process; 'remote': worker processes
      # (launch/rollout_worker.py) follow the published weights in shared_dir and send
      # back complete groups through it.
      rollouts="local", shared_dir="", worker_lease_s=60.0))
  c.eval = ml_collections.ConfigDict(dict(num_heldout=200))
  if variant == "smoke":  # seconds-scale end-to-end check
    c.model.update(d_model=32, d_ff=64, head_dim=8, num_heads=2, num_kv_heads=1)
    c.sft.update(num_demos=4, steps=2, batch_size=2, log_every=1)
    c.rl.update(steps=2, group_size=2, groups_per_step=1, slots=4, max_in_flight=4,
                queue_groups=2, max_turn_tokens=24)
    c.env.update(max_turns=2)
    c.eval.update(num_heldout=2)
  elif variant != "default":
    raise ValueError(f"unknown variant {variant!r}; choose 'default' or 'smoke'")
  return c
