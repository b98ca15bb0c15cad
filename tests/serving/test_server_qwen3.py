"""The server in Qwen3's chat format: a converted checkpoint (architecture, weights and
tokenizer, made on the spot by tests/qwen3_artifacts.py) behind /v1, driven by the
official `openai` client. Prompts are the training layout and the reference chat
template's rendering, token for token; sampled log-probs are the trainer's, bit for bit;
several `<tool_call>` blocks of one turn come back as OpenAI `tool_calls`."""
import json
import os

import ml_collections
import numpy as np
import pytest

pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")


from composer_rl.model import hf_qwen3  # noqa: E402
from composer_rl.online import ingest  # noqa: E402
from composer_rl.rollout import formats, qwen3_chat  # noqa: E402
from composer_rl.sampling.head import RowSampling  # noqa: E402
from composer_rl.serving import loading  # noqa: E402
from composer_rl.serving.chat_template import ChatTemplate  # noqa: E402
from composer_rl.serving.records import RecordLog, read_records  # noqa: E402
from composer_rl.serving.service import ServingService  # noqa: E402
from composer_rl.serving.settings import ServeSettings  # noqa: E402
from composer_rl.serving.threaded import ThreadedServer  # noqa: E402
from composer_rl.train.scoring import score_tokens  # noqa: E402
from tests.serving.test_server import ScriptedGenerator  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TEMPLATE = os.path.join(os.path.dirname(__file__), "..", "data", "qwen3_chat_template.jinja")
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} tool",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}} for name in ("read_file", "list_dir")]


def _config(checkpoint, enable_thinking=True):
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.init_checkpoint = checkpoint
  c.model = ml_collections.ConfigDict(dict(max_seq_len=1024, compute_dtype="float32",
                                           row_tile=16))
  c.chat = ml_collections.ConfigDict(dict(format="qwen3", enable_thinking=enable_thinking))
  c.serve = ml_collections.ConfigDict(dict(model_name="qwen3_tiny", slots=2,
                                           prefill_chunk=64, top_logprobs=3))
  return c


@pytest.fixture(scope="module")
def served(qwen3_checkpoint, tmp_path_factory):
  records = str(tmp_path_factory.mktemp("qwen3_records"))
  service = loading.build_service(_config(qwen3_checkpoint), records_dir=records)
  server = ThreadedServer(service)
  client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
  yield service, client, records
  server.stop()
  service.close()


def test_prompts_are_the_training_layout_and_the_reference_template(served, qwen3_tokenizer):
  transformers = pytest.importorskip("transformers")
  service, _, _ = served
  tok = service.tok
  assert service.tok.vocab_size < service.generator.engine.config.vocab_size == 1024
  # What a training session starts with (no tools: the server declares the request's).
  train = formats.make_chat("qwen3", qwen3_tokenizer, tools=None, enable_thinking=True)
  assert service.template.render([{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "hi"}]) == train.start(
                                      "Be brief.", "hi")
  # A tool-using history (not produced here, so rendered from its text) is what the
  # published template renders, encoded with its special tokens.
  msgs = [{"role": "system", "content": "You fix bugs."},
          {"role": "user", "content": "Read a.py and list src."},
          {"role": "assistant", "content": "Looking.", "tool_calls": [
              {"id": "c0", "type": "function", "function": {
                  "name": "read_file", "arguments": json.dumps({"path": "a.py"})}},
              {"id": "c1", "type": "function", "function": {
                  "name": "list_dir", "arguments": json.dumps({"path": "src"})}}]},
          {"role": "tool", "tool_call_id": "c0", "content": "x = 1"},
          {"role": "tool", "tool_call_id": "c1", "content": "b.py"}]
  with open(TEMPLATE) as f:
    ref = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(qwen3_tokenizer, "tokenizer.json"), chat_template=f.read())
  ref_msgs = [dict(m, tool_calls=[dict(c, function=dict(
      c["function"], arguments=json.loads(c["function"]["arguments"])))
      for c in m["tool_calls"]]) if "tool_calls" in m else m for m in msgs]
  want = ref.apply_chat_template(ref_msgs, tools=TOOLS, tokenize=False,
                                 add_generation_prompt=True)
  assert "<tool_response>\nx = 1\n</tool_response>\n<tool_response>\nb.py" in want
  assert service.template.render(msgs, TOOLS) == tok.encode_markup(want)


def test_completions_are_recorded_with_the_trainers_logprobs(served, qwen3_checkpoint):
  service, client, records = served
  conv = {"X-Conversation-Id": "q3", "X-Training-Consent": "true"}
  msgs = [{"role": "user", "content": "def add(a, b):"}]
  first = client.chat.completions.create(model="qwen3_tiny", messages=msgs, max_tokens=10,
                                         temperature=0.9, seed=1, logprobs=True,
                                         extra_headers=conv)
  msgs += [first.choices[0].message.model_dump(exclude_none=True),
           {"role": "user", "content": "and subtract?"}]
  chunks = list(client.chat.completions.create(
      model="qwen3_tiny", messages=msgs, max_tokens=10, temperature=0.9, seed=2,
      stream=True, extra_headers=conv))
  streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  client.post("/feedback", cast_to=object, body={"conversation_id": "q3",
                                                  "signal": "accepted"})
  recs = [r for r in read_records(records) if r["kind"] == "completion"]
  assert len(recs) == 2
  mc = service.generator.engine.config
  model = hf_qwen3.build_model(mc, hf_qwen3.load_params(qwen3_checkpoint))
  for r in recs:  # the trainer's log-probs of what was sampled, bit for bit
    s = r["sampling"]
    toks = np.asarray(r["prompt_ids"] + r["completion_ids"], np.int32)[None]
    lp = np.asarray(score_tokens(model, toks, RowSampling.broadcast(
        1, s["temperature"], s["top_k"], s["top_p"])).logprobs[0])[len(r["prompt_ids"]) - 1:]
    assert np.array_equal(lp.view(np.uint32), np.asarray(r["logprobs_bits"], np.uint32))
    assert max(r["completion_ids"]) < service.tok.vocab_size  # padded rows never sampled
  assert streamed == service.tok.decode(recs[1]["completion_ids"])
  # Token-in/token-out: the second prompt extends the first prompt + completion, so the
  # conversation is one trajectory for online RL.
  src = ingest.OnlineSessionSource(records, ingest.RewardSpec(),
                                   ingest.IngestLimits(max_tokens=10**6, max_age_versions=10),
                                   current_version=0)
  (t,) = [src[i] for i in range(len(src)) if src[i].task_id == "q3"]
  assert t.turns == 2 and t.reward == 1.0 and sum(t.loss_mask) == sum(len(r["completion_ids"]) for r in recs)


def test_several_tool_calls_per_turn_reach_the_client(qwen3_tokenizer, tmp_path):
  chat = formats.make_chat("qwen3", qwen3_tokenizer, tools=None, enable_thinking=False)
  text = qwen3_chat.assistant_text("Let me look.", [
      {"name": "read_file", "arguments": {"path": "a.py"}},
      {"name": "list_dir", "arguments": {"path": "src"}}])
  service = ServingService(ScriptedGenerator(text, chat.tok), ChatTemplate(chat),
                           RecordLog(str(tmp_path)), ServeSettings(model_name="scripted",
                                                                   warmup=False), chat.tok)
  server = ThreadedServer(service)
  try:
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "Look around."}]
    r = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Let me look."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in
            ch.message.tool_calls] == [("read_file", {"path": "a.py"}),
                                       ("list_dir", {"path": "src"})]
    # The reply sent back is rendered as the ids it was sampled as (token-in/token-out).
    (rec,) = [x for x in read_records(str(tmp_path)) if x["kind"] == "completion"]
    back = msgs + [ch.message.model_dump(exclude_none=True),
                   {"role": "tool", "content": "x"}, {"role": "tool", "content": "b.py"}]
    ids = service.template.render(back, TOOLS)
    assert ids[:len(rec["prompt_ids"]) + len(rec["completion_ids"])] == (
        rec["prompt_ids"] + rec["completion_ids"])
    # A call of a tool the request did not offer is plain content, as the model wrote it.
    r = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS[:1])
    assert r.choices[0].message.tool_calls is None
    assert "<tool_call>" in r.choices[0].message.content
  finally:
    server.stop()
    service.close()


def test_bad_serve_settings_are_named(tmp_path, qwen3_checkpoint):
  c = _config(qwen3_checkpoint)
  c.init_checkpoint = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="init_checkpoint=.*no model_config.json"):
    loading.build_service(c, records_dir=str(tmp_path / "r"))
  c = _config(qwen3_checkpoint)
  c.chat.format = "llama"
  with pytest.raises(ValueError, match="unknown chat format 'llama'"):
    loading.build_service(c, records_dir=str(tmp_path / "r"))

