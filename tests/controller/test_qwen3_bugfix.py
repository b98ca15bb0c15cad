"""experiments/qwen3_bugfix.py: a from-scratch model in Qwen3's chat format with a byte-level
BPE tokenizer trained when the run starts (`chat.bpe_vocab_size`), end to end at smoke size;
the tokenizer learned from train tasks only, reused (never retrained) by a resumed run or a
rollout worker; settings that cannot go together are named."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("tokenizers")

from composer_rl.config import ConfigError  # noqa: E402
from composer_rl.controller import agent_eval, agent_setup, config as kinds  # noqa: E402
from composer_rl.env import get_task  # noqa: E402
from composer_rl.env.harness import make_env  # noqa: E402
from composer_rl.env.policies import make_policy  # noqa: E402
from composer_rl.rollout import formats  # noqa: E402
from composer_rl.rollout.scripted import scripted_trajectory  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import qwen3_bugfix  # noqa: E402


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def test_the_tokenizer_is_made_from_train_sessions_and_then_reused(tmp_path):
  c = qwen3_bugfix.get_config()
  wd = str(tmp_path / "run")
  s = agent_setup.Setup(c, wd)
  path = os.path.join(wd, formats.TRAINED_TOKENIZER_DIR, "tokenizer.json")
  assert json.load(open(os.path.join(wd, formats.RUN_CHAT_FILE)))["tokenizer"] == (
      os.path.dirname(path))
  tok = s.tok
  assert 600 < tok.vocab_size <= c.chat.bpe_vocab_size + 6  # + the added tokens
  assert s.model_config.vocab_size == tok.vocab_size and s.env_config.call_syntax == "qwen3"
  # A held-out session in this format: Qwen3's turns and calls, a third of a token per
  # byte or less, the fix rewarded in the sandbox.
  task = get_task("generated", "heldout", 3)
  policy = make_policy("weak_oracle", fix_prob=1.0, run_tests=False)
  traj = scripted_trajectory(policy, task, make_env(task, s.env_config), s.chat,
                             system_prompt=c.env.system_prompt)
  assert traj.reward == 1.0
  assert traj.tokens[0] == tok.token_id("<|im_start|>")
  assert tok.decode(traj.tokens).startswith("system\nFix the bug")
  assert traj.turns == 3 and all(t.startswith("<tool_call>\n{") for t in traj.turn_texts)
  assert len(traj.tokens) < len(tok.decode(traj.tokens).encode()) / 3  # learned merges
  assert len(traj.tokens) < c.model.max_seq_len
  # The evaluation's "attempted a fix" reads calls in the run's syntax.
  assert agent_eval.changed_code(traj, "qwen3")
  give_up = scripted_trajectory(make_policy("weak_oracle", fix_prob=0.0, run_tests=False),
                                task, make_env(task, s.env_config), s.chat)
  assert give_up.reward == 0.0 and not agent_eval.changed_code(give_up, "qwen3")
  # Made once: a second Setup (a resumed run) reads the same file, not a retrained one.
  before = (os.stat(path).st_mtime_ns, open(path).read())
  agent_setup.Setup(c, wd)
  assert (os.stat(path).st_mtime_ns, open(path).read()) == before
  # The same corpus gives the same tokenizer (what a remote worker that trains before the
  # trainer publishes would make), and its corpus holds no held-out task.
  other = agent_setup.Setup(c, str(tmp_path / "again"))
  assert open(os.path.join(str(tmp_path / "again"), formats.TRAINED_TOKENIZER_DIR,
                           "tokenizer.json")).read() == before[1]
  heldout = get_task("generated", "heldout", 0)
  texts = "\n".join(other.session_texts("qwen3", num_sessions=8))
  assert heldout.prompt not in texts and get_task("generated", "train", 0).prompt in texts


def test_settings_that_bring_their_own_tokenizer_are_refused(tmp_path, qwen3_tokenizer):
  c = qwen3_bugfix.get_config("smoke")
  c.chat.format = "byte"
  with pytest.raises(ValueError, match=r"chat\.bpe_vocab_size=1024 .*chat\.format is 'byte'"):
    agent_setup.Setup(c, str(tmp_path / "a"))
  c = qwen3_bugfix.get_config("smoke")
  c.chat.tokenizer = qwen3_tokenizer
  with pytest.raises(ValueError, match="cannot be combined with chat.tokenizer"):
    agent_setup.Setup(c, str(tmp_path / "b"))
  c.chat.update(tokenizer="", bpe_vocab_size=-1)
  with pytest.raises(ConfigError, match="bpe_vocab_size"):
    kinds.validate(c)
  # Only agent RL trains a tokenizer: the library call of another kind names it.
  c.chat.bpe_vocab_size = 512
  with pytest.raises(ValueError, match="does not train a tokenizer"):
    formats.from_config(c.chat)


@pytest.mark.slow  # ~57 s; the guide test runs the Qwen3 agent loop in the default suite
def test_the_experiment_runs_end_to_end_at_smoke_size(tmp_path):
  wd = tmp_path / "wd"
  out = subprocess.run(
      [sys.executable, os.path.join(ROOT, "launch", "train.py"),
       f"--config={os.path.join(ROOT, 'experiments', 'qwen3_bugfix.py')}:smoke",
       f"--workdir={wd}"], capture_output=True, text=True, timeout=600, check=True).stdout
  summary = json.loads(out.strip().splitlines()[-1])
  assert {"gain_points", "rl_reward_mean_first", "rl_reward_mean_last"} <= set(summary)
  tok = formats.make_chat("qwen3", str(wd / formats.TRAINED_TOKENIZER_DIR)).tok
  rl = sorted(p for p in os.listdir(wd / "rollouts") if p.startswith("rl_step_"))
  for traj in _rows(wd / "rollouts" / rl[-1]):
    assert traj["tokens"][0] == tok.token_id("<|im_start|>")
    assert max(traj["tokens"]) < tok.vocab_size and traj["logprobs_are_uint32_bits"]
