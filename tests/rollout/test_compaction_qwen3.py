"""Context compaction in Qwen3's chat format: the instruction and the restarted context
are Qwen3 turns (what the layout renders, encoded with its special tokens), and the
long-session demonstrator summarizes and fixes inside a window its sessions outgrow."""
import pytest

pytest.importorskip("tokenizers")

from composer_rl.env.harness import EnvConfig, make_env  # noqa: E402
from composer_rl.env.policies import make_policy  # noqa: E402
from composer_rl.env.tasks import multifile  # noqa: E402
from composer_rl.rollout import compaction as cl  # noqa: E402
from composer_rl.rollout import formats, qwen3_chat as qc  # noqa: E402
from composer_rl.rollout.scripted import scripted_trajectory  # noqa: E402

WINDOW = 1536  # the Qwen3 tools block alone is ~700 tokens of this tokenizer
COMP = cl.CompactionConfig(enabled=True, trigger_fraction=0.55, max_compactions=4,
                           summary_max_tokens=64)
ENV = EnvConfig(call_syntax="qwen3", max_turns=10, system_prompt="Fix the bug, then submit.")


@pytest.fixture(scope="module")
def chat(qwen3_tokenizer):
  return formats.make_chat("qwen3", qwen3_tokenizer, enable_thinking=False)


def test_compaction_turns_are_qwen3_turns(chat):
  tok = chat.tok
  got = cl.instruction_tokens(chat, "3 passed", "Summarize your progress.")
  want = ("\n<|im_start|>user\n<tool_response>\n3 passed\n</tool_response><|im_end|>\n"
          "<|im_start|>user\nSummarize your progress.<|im_end|>\n"
          f"<|im_start|>assistant\n{qc.EMPTY_THINK}")
  assert got == tok.encode_markup(want)
  summary = tok.encode("add: fixed the sign")
  restart = cl.restart_tokens(chat, "sys", "Fix it.", summary)
  assert tok.decode(restart) == tok.decode(chat.start("sys", "Fix it.")[:-len(
      chat.generation_ids())] + tok.encode("user\nadd: fixed the sign\n"
                                           f"assistant\n{qc.EMPTY_THINK}"))
  assert restart[-len(chat.generation_ids()):] == chat.generation_ids()
  assert restart.count(tok.EOT) == chat.start("sys", "Fix it.").count(tok.EOT) + 1


def test_demonstrator_summarizes_and_fixes_in_qwen3_format(chat):
  tok = chat.tok
  compacted = 0
  for i in range(3):
    task = multifile.generate("train", i)
    t = scripted_trajectory(make_policy("long_weak_oracle", fix_prob=1.0, run_tests=False),
                            task, make_env(task, ENV), chat, ENV.system_prompt,
                            compaction=COMP, max_seq_len=WINDOW)
    assert t.reward == 1.0 and t.finish_reason == "submitted", (i, t.finish_reason)
    assert t.metrics["malformed_calls"] == 0
    bounds = cl.segment_bounds(t)
    assert len(t.tokens) > WINDOW and all(b - a <= WINDOW for a, b in bounds)
    for k, seg in enumerate(t.segments):
      a = bounds[k + 1][0]
      ids = tok.encode(seg["summary"])
      start = cl.restart_tokens(chat, ENV.system_prompt, t.prompt, ids)
      assert t.tokens[a:a + len(start)] == start
      # The summary turn closes the previous context on <|im_end|> and is trained.
      end = a - 1
      assert t.tokens[end] == tok.EOT and t.tokens[end - len(ids):end] == ids
      assert all(t.loss_mask[end - len(ids):end])
    compacted += bool(t.segments)
  assert compacted == 3
