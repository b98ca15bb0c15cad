"""Real tokenizer (`tokenizer.json`) and Qwen3's chat / tool-call format, token-in/token-out.

A small byte-level BPE tokenizer shaped like Qwen3's is trained here
(`composer_rl.data.bpe.train_qwen3_style`: its pre-tokenizer regex, special and added
tokens); the reference rendering is transformers' `apply_chat_template` with the Qwen3 chat template in
tests/data/qwen3_chat_template.jinja (written from memory of the published template).
"""
import json
import os

import pytest

tokenizers = pytest.importorskip("tokenizers")

from composer_rl.data import bpe  # noqa: E402
from composer_rl.data.byte_tokenizer import ByteTokenizer  # noqa: E402
from composer_rl.data.hf_tokenizer import HfTokenizer  # noqa: E402
from composer_rl.env import tool_call_format as tcf  # noqa: E402
from composer_rl.rollout import qwen3_chat as qc  # noqa: E402

TEMPLATE = os.path.join(os.path.dirname(__file__), "..", "data", "qwen3_chat_template.jinja")
CORPUS = ["def add(a, b):\n    return a + b\n", "The tests in test_math.py fail.",
          '{"name": "read_file", "arguments": {"path": "src/app.py"}}',
          "I will read the file first, then fix the bug and run the tests.",
          "$ pytest -q\n3 passed in 0.01s\n", "Ünïcödé text, ok? 'quoted' \"double\""] * 20


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
  return bpe.train_qwen3_style(CORPUS, 400, str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def tok(tok_path):
  return HfTokenizer(os.path.dirname(tok_path))


def _reference(tok_path):
  transformers = pytest.importorskip("transformers")
  with open(TEMPLATE) as f:
    template = f.read()
  return transformers.PreTrainedTokenizerFast(tokenizer_file=tok_path, chat_template=template)


def test_tokenizer_is_a_drop_in_for_the_byte_tokenizer(tok):
  for name in ("encode", "decode", "is_special", "name", "vocab_size", "EOT"):
    assert hasattr(ByteTokenizer(), name) and hasattr(tok, name)
  text = "Ünïcödé <think>\nhm\n</think> def add(a, b): <tool_call>"
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.token_id("<tool_call>") in ids and not tok.is_special(tok.token_id("<tool_call>"))
  assert tok.is_special(tok.EOT) and tok.name(tok.EOT) == "<|im_end|>"
  # Control tokens spelled in text stay text; decode drops real ones and unknown ids.
  forged = tok.encode("a<|im_end|>b")
  assert tok.EOT not in forged and tok.decode(forged) == "a<|im_end|>b"
  assert tok.encode_markup("a<|im_end|>b").count(tok.EOT) == 1
  assert tok.decode([tok.EOT] + tok.encode("ok") + [tok.vocab_size + 5]) == "ok"


def _conversation(fmt):
  """(messages for the reference template, our per-turn token chunks, our text chunks)."""
  system, task = "You fix bugs in Python repositories.", "Make test_math.py pass."
  turns = [
      ("First read it.", [{"name": "read_file", "arguments": {"path": "src/ä.py", "start": 1}}],
       "I need to see the code."),
      ("", [{"name": "edit", "arguments": {"path": "src/ä.py", "old": "a - b",
                                          "new": "a + b"}},
            {"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 30}}],
       "The bug is the minus sign.\nFix and test."),
  ]
  observations = [["def add(a, b):\n    return a - b"], ["edited", "3 passed in 0.01s"]]
  messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
  chunks, texts = [fmt.start(system, task)], [fmt.start_text(system, task)]
  for (content, calls, reasoning), obs in zip(turns, observations):
    text = qc.assistant_text(content, calls, reasoning)
    chunks.append(fmt.assistant(text))
    texts.append(text + qc.IM_END)
    chunks.append(fmt.observation(obs))
    texts.append(fmt.observation_text(obs))
    messages.append({"role": "assistant",
                     "content": f"<think>\n{reasoning}\n</think>\n\n{content}",
                     "tool_calls": [{"type": "function", "function": c} for c in calls]})
    messages += [{"role": "tool", "content": o} for o in obs]
  return messages, chunks, texts


def test_rendering_matches_the_reference_template(tok, tok_path):
  fmt = qc.Qwen3ChatFormat(tok)
  messages, _, texts = _conversation(fmt)
  want = _reference(tok_path).apply_chat_template(messages, tools=qc.env_tools(),
                                                  tokenize=False, add_generation_prompt=True)
  assert "".join(texts) == want
  assert '<tool_call>\n{"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 30}}' in want
  assert "<|im_start|>user\n<tool_response>\nedited\n</tool_response>\n<tool_response>" in want
  # No tools and no system prompt: just the user turn and the generation prompt.
  plain = qc.Qwen3ChatFormat(tok, tools=None)
  assert plain.start_text("", "hi") == _reference(tok_path).apply_chat_template(
      [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)


def test_turn_tokens_are_appended_once_and_equal_the_full_encoding(tok):
  fmt = qc.Qwen3ChatFormat(tok)
  _, chunks, texts = _conversation(fmt)
  stream = []
  for k, c in enumerate(chunks):
    before = list(stream)
    stream += c
    assert stream[:len(before)] == before  # earlier turns' ids never change
    assert tok.encode_markup("".join(texts[:k + 1])) == stream
  assert stream.count(fmt.end_of_turn) == 2 + 2 * 2
  # Thinking off: every turn's header carries the empty think block, kept in the stream.
  off = qc.Qwen3ChatFormat(tok, enable_thinking=False)
  assert off.observation_text("x").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_signatures_follow_the_environment_schemas():
  sigs = {t["function"]["name"]: t["function"] for t in qc.env_tools()}
  assert list(sigs) == list(tcf.TOOL_SCHEMAS)
  assert sigs["read_file"]["parameters"]["required"] == ["path"]
  assert sigs["read_file"]["parameters"]["properties"]["start"]["type"] == "integer"
  assert sigs["run"]["parameters"]["properties"]["timeout"]["type"] == "number"
  json.dumps(sigs)


def test_parser_reads_calls_and_reports_malformed_ones():
  text = qc.assistant_text("Reading.", [{"name": "read_file", "arguments": {"path": "a.py"}}],
                           reasoning="maybe <tool_call> here is not a call")
  call = qc.parse_tool_call(text)
  assert (call.name, call.args) == ("read_file", {"path": "a.py", "start": 1, "end": None})
  assert qc.to_env_text(text) == tcf.format_tool_call("read_file", call.args)
  assert tcf.parse_tool_call(qc.to_env_text(text)) == tcf.ToolCall("read_file", call.args)
  two = qc.assistant_text("", [{"name": "ls", "arguments": {}}, {"name": "submit"}])
  assert [c.name for c in qc.parse_tool_calls(two)] == ["list_dir", "submit"]
  string_args = '<tool_call>\n{"name": "run", "arguments": "{\\"cmd\\": \\"ls\\"}"}\n</tool_call>'
  assert qc.parse_tool_call(string_args).args == {"cmd": "ls", "timeout": None}
  bad = {
      "no tool call": ("just text", "no_call"),
      "ended inside": ("<think>\nstill thinking", "no_call"),
      "exactly one": (two, "multiple_calls"),
      "must end with": ('<tool_call>\n{"name": "submit"}', "unterminated"),
      "opened again": ("<tool_call><tool_call>{}</tool_call>", "unterminated"),
      "invalid JSON": ('<tool_call>\n{"name": "submit",}\n</tool_call>', "bad_json"),
      "duplicate key": ('<tool_call>{"name": "ls", "name": "ls"}</tool_call>', "bad_json"),
      "JSON object": ('<tool_call>["ls"]</tool_call>', "bad_shape"),
      '"arguments" must': ('<tool_call>{"name": "ls", "arguments": [1]}</tool_call>',
                           "bad_shape"),
      "unknown tool": ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown_tool"),
      "missing required": ('<tool_call>{"name": "edit", "arguments": {}}</tool_call>',
                           "bad_args"),
      "must be int": ('<tool_call>{"name": "read_file", "arguments": {"path": "a", '
                      '"start": true}}</tool_call>', "bad_type"),
      "nothing may follow": ('<tool_call>{"name": "submit"}</tool_call> and more',
                             "trailing_text"),
  }
  for message, (text, kind) in bad.items():
    with pytest.raises(tcf.ToolCallError, match=message) as e:
      qc.parse_tool_call(text)
    assert e.value.kind == kind, message
  with pytest.raises(tcf.ToolCallError):
    qc.parse_tool_call(None)
