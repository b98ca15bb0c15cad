"""The default experiment's job in Qwen3's format: a small Qwen3-architecture model trained
from scratch with a byte-level BPE tokenizer made at run time.

tiny_bugfix (SFT on an imperfect demonstrator, then async GRPO on generated bug-fix tasks
in the sandbox), but every session is what a Qwen3 checkpoint reads and writes: the
`<|im_start|>` turns of its chat template, the tools declared as JSON signatures in the
system message, calls as `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (parsed
strictly; anything else is a counted malformed call) and observations in
`<tool_response>` blocks. The tokenizer is trained when the run starts
(`chat.bpe_vocab_size`: Qwen3's split regex, byte-level BPE and special tokens, learned
from the demonstrator's sessions of train tasks; workdir/tokenizer) -- nothing is
downloaded. The model is the Qwen3 architecture (RoPE, q/k RMSNorm, SwiGLU, GQA, tied
embeddings) at 2 layers x d_model 128.

Run:
  python launch/train.py --config=experiments/qwen3_bugfix.py --workdir=/tmp/qwen3_bugfix
A quick smoke run: --config=experiments/qwen3_bugfix.py:smoke
The last stdout line is a JSON summary: heldout_solve_rate_sft / _rl, gain_points, and the
sampled training reward over the first and last fifth of RL steps
(rl_reward_mean_first / rl_reward_mean_last). Results: BUILD_NOTES section 15.
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_bugfix  # noqa: E402  (experiments/ is not a package)


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  if variant not in ("default", "smoke"):
    raise ValueError(f"unknown variant {variant!r}; choose 'default' or 'smoke'")
  c = tiny_bugfix.get_config(variant)
  c.chat.update(format="qwen3", bpe_vocab_size=1024)
  # The tools a bug fix needs (submit is always there): the system message declares each
  # one's JSON signature, ~280 tokens for these three.
  c.env.tools = ("read_file", "edit")
  # A fixing session is ~610 tokens with this tokenizer (380 of them the system and task).
  c.model.max_seq_len = 768
  c.rl.max_turn_tokens = 128
  return c
