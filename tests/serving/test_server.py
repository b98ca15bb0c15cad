"""The OpenAI-compatible server, driven with the official `openai` client.

One real server (launch/serve.py over experiments/serve_tiny.py, a freshly initialized
byte model, in a subprocess on a free port, with API keys) is shared by the module; the
SIGTERM and SIGKILL tests come last and the next user restarts it on the same records
directory. Tool-call responses need a model that writes calls, which a random tiny model
does not: those paths are driven in-process through the same app with a scripted generator.
"""
import concurrent.futures as cf
import dataclasses
import hashlib
import http.client
import importlib.util
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from composer_rl.data.byte_tokenizer import ByteTokenizer
from composer_rl.rollout.chat import ChatFormat
from composer_rl.serving import protocol
from composer_rl.serving.auth import KeyRing, RateLimiter, hash_key
from composer_rl.serving.chat_template import ChatTemplate
from composer_rl.serving.records import bits_float, read_records
from composer_rl.serving.jobs import ContentStream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = "serve_tiny"
KEY = "sk-test-alice-0123456789"
OTHER_KEY = "sk-test-bob-9876543210"
TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


def _env():
  env = dict(os.environ)
  flags = env.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")
  env["XLA_FLAGS"] = flags.strip()
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


class ServerProc:
  """launch/serve.py in a subprocess; `ensure()` (re)starts it if it is not running."""

  def __init__(self, workdir: str):
    self.records = os.path.join(workdir, "records")
    self.weights = os.path.join(workdir, "weights")
    self.keys = os.path.join(workdir, "keys.txt")
    with open(self.keys, "w") as f:
      f.write(f"# test keys\nalice:{hash_key(KEY)}\n{hash_key(OTHER_KEY)}\n")
    self.stderr_path = os.path.join(workdir, "server.stderr")
    self.proc = None
    self.url = None
    self.lines: "queue.Queue[str]" = queue.Queue()

  def ensure(self) -> "ServerProc":
    if self.proc is not None and self.proc.poll() is None:
      return self
    self.lines = queue.Queue()
    stderr = open(self.stderr_path, "a")
    self.proc = subprocess.Popen(
        [sys.executable, "launch/serve.py", "--config=experiments/serve_tiny.py", "--port=0",
         f"--records_dir={self.records}", f"--api_key_file={self.keys}",
         f"--weights_dir={self.weights}"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
    stderr.close()
    threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()
    deadline = time.time() + 180
    while time.time() < deadline:
      try:
        line = self.lines.get(timeout=1)
      except queue.Empty:
        if self.proc.poll() is not None:
          break
        continue
      m = re.search(r"ready at (http://\S+/v1)", line)
      if m:
        self.url = m.group(1)
        return self
    self.stop()
    with open(self.stderr_path) as f:
      raise RuntimeError("server did not start:\n" + f.read()[-4000:])

  @staticmethod
  def _pump(proc, lines):
    for line in proc.stdout:
      lines.put(line)

  def stop(self):
    if self.proc is not None and self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()

  def client(self, key=KEY, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60, **kw)

  def records_by_id(self):
    return {r["id"]: r for r in read_records(self.records)}


@pytest.fixture(scope="module")
def server_proc(tmp_path_factory):
  s = ServerProc(str(tmp_path_factory.mktemp("serve")))
  yield s
  s.stop()


@pytest.fixture
def server(server_proc):
  return server_proc.ensure()


# ---- the real server --------------------------------------------------------------------

def test_models_list(server):
  c = server.client()
  assert [m.id for m in c.models.list().data] == [MODEL]
  assert c.models.retrieve(MODEL).id == MODEL


def test_chat_with_tools_is_a_valid_chat_completion(server):
  c = server.client()
  r = c.chat.completions.create(
      model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Read a.py"}],
      tools=TOOLS, tool_choice="auto", max_completion_tokens=16, temperature=0.7, top_p=0.9)
  assert isinstance(r, ChatCompletion)
  ChatCompletion.model_validate(r.model_dump())
  assert r.object == "chat.completion" and r.model == MODEL and len(r.choices) == 1
  ch = r.choices[0]
  assert ch.message.role == "assistant" and ch.finish_reason in ("stop", "length", "tool_calls")
  for call in ch.message.tool_calls or []:  # a random model rarely writes one
    assert call.function.name == "read_file"
    json.loads(call.function.arguments)
  assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0
  rec = server.records_by_id()[f"{r.id}:0"]
  assert rec["endpoint"] == "chat" and rec["sampling"]["top_p"] == pytest.approx(0.9)
  assert rec["key_id"] == "alice" and rec["consent"] is None
  assert len(rec["completion_ids"]) == r.usage.completion_tokens == len(rec["logprobs_bits"])


def test_token_in_token_out_and_conversation_id(server):
  c = server.client()
  history = [{"role": "user", "content": "first turn"}]
  r1 = c.chat.completions.create(model=MODEL, messages=history, max_tokens=12, seed=1)
  history += [{"role": "assistant", "content": r1.choices[0].message.content},
              {"role": "user", "content": "second turn"}]
  raw = c.chat.completions.with_raw_response.create(
      model=MODEL, messages=history, max_tokens=4, seed=2,
      extra_headers={"X-Training-Consent": "true"})
  r2 = raw.parse()
  recs = server.records_by_id()
  a, b = recs[f"{r1.id}:0"], recs[f"{r2.id}:0"]
  # The second prompt extends the first prompt + the exact sampled ids.
  n = len(a["prompt_ids"]) + len(a["completion_ids"])
  assert b["prompt_ids"][:n] == a["prompt_ids"] + a["completion_ids"]
  assert a["conversation_id"] == b["conversation_id"]
  assert raw.headers["x-conversation-id"] == b["conversation_id"]
  assert b["consent"] is True
  # An explicit conversation id wins.
  r3 = c.chat.completions.create(model=MODEL, messages=history, max_tokens=2,
                                 extra_headers={"X-Conversation-Id": "my-conv-1"})
  assert server.records_by_id()[f"{r3.id}:0"]["conversation_id"] == "my-conv-1"


def test_tool_call_history_round_trip(server):
  """An assistant tool_calls message sent back is rendered in the training tool format,
  and that text parses back into the same call."""
  call = {"id": "call_7", "type": "function",
          "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}
  messages = [{"role": "user", "content": "Read a.py"},
              {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "call_7", "content": "print(1)"}]
  r = server.client().chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                              max_tokens=4)
  rec = server.records_by_id()[f"{r.id}:0"]
  text = bytes(i for i in rec["prompt_ids"] if i < 256).decode()
  written = '<tool>{"name": "read_file", "args": {"path": "a.py"}}</tool>'
  assert written in text and "print(1)" in text
  assert rec["messages"][1]["tool_calls"][0]["id"] == "call_7"
  content, calls = ChatTemplate(ChatFormat(ByteTokenizer())).parse("ok " + written, TOOLS)
  assert content == "ok" and calls[0]["function"]["name"] == "read_file"
  assert json.loads(calls[0]["function"]["arguments"]) == {"path": "a.py"}


def test_streaming_with_usage(server):
  c = server.client()
  chunks = list(c.chat.completions.create(
      model=MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=10,
      stream=True, stream_options={"include_usage": True}, seed=3))
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
  assert all(ch.usage is None for ch in chunks[:-1])
  assert chunks[0].choices[0].delta.role == "assistant"
  text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices
            and ch.choices[0].finish_reason]
  assert finish and finish[0] in ("stop", "length")
  rec = server.records_by_id()[f"{chunks[0].id}:0"]
  assert rec["response"]["content"] == text
  assert len(rec["completion_ids"]) == chunks[-1].usage.completion_tokens
  # The same request without streaming gives the same completion (same seed).
  r = c.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                        "content": "stream please"}],
                                max_tokens=10, seed=3)
  assert r.choices[0].message.content == text


def test_logprobs_match_the_record(server):
  r = server.client().chat.completions.create(
      model=MODEL, messages=[{"role": "user", "content": "logprobs"}], max_tokens=8,
      logprobs=True, top_logprobs=3, seed=4)
  content = r.choices[0].logprobs.content
  assert len(content) == r.usage.completion_tokens
  rec = server.records_by_id()[f"{r.id}:0"]
  assert [e.logprob for e in content] == pytest.approx(bits_float(rec["logprobs_bits"]),
                                                       abs=0, rel=1e-7)
  for e in content:
    assert len(e.top_logprobs) == 3
    assert e.top_logprobs[0].logprob >= e.logprob - 1e-6
    assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob


def test_n_and_seed_are_reproducible(server):
  c = server.client()
  args = dict(model=MODEL, messages=[{"role": "user", "content": "many"}], max_tokens=12,
              n=3, seed=123, logprobs=True)

  def tokens(r):
    return [[e.logprob for e in ch.logprobs.content] for ch in r.choices]
  a, b = c.chat.completions.create(**args), c.chat.completions.create(**args)
  assert [ch.index for ch in a.choices] == [0, 1, 2]
  assert [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices]
  assert tokens(a) == tokens(b)
  other = c.chat.completions.create(**{**args, "seed": 124})
  assert tokens(other) != tokens(a)
  recs = server.records_by_id()
  assert all(f"{a.id}:{i}" in recs for i in range(3))  # every choice is recorded


def test_completions_endpoint(server):
  c = server.client()
  r = c.completions.create(model=MODEL, prompt="def f():", max_tokens=6, logprobs=2, seed=5)
  assert isinstance(r, Completion) and r.object == "text_completion"
  assert len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens
  r2 = c.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3, n=2)
  assert sorted(ch.index for ch in r2.choices) == [0, 1, 2, 3]
  chunks = list(c.completions.create(model=MODEL, prompt="def f():", max_tokens=6, seed=5,
                                     stream=True))
  assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text
  rec = server.records_by_id()[f"{r.id}:0"]
  assert rec["endpoint"] == "completions" and rec["prompt"] == "def f():"


def test_feedback(server):
  c = server.client()
  r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "fb"}],
                                max_tokens=3)
  out = c.post("/feedback", cast_to=object,
               body={"completion_id": r.id, "signal": "thumbs_up"},
               options={"headers": {"X-Training-Consent": "false"}})
  assert out["recorded"] is True
  fb = server.records_by_id()[out["id"]]
  conv = server.records_by_id()[f"{r.id}:0"]["conversation_id"]
  assert fb["kind"] == "feedback" and fb["signal"] == "thumbs_up" and fb["consent"] is False
  assert fb["conversation_id"] == conv  # filled in from the completion
  out = c.post("/feedback", cast_to=object, body={
      "conversation_id": conv, "signal": "correction", "text": "the right answer"})
  assert server.records_by_id()[out["id"]]["text"] == "the right answer"
  c.post("/feedback", cast_to=object, body={"conversation_id": conv,
                                             "signal": "task_outcome", "value": 1.0})
  with pytest.raises(openai.BadRequestError) as e:
    c.post("/feedback", cast_to=object, body={"conversation_id": conv, "signal": "meh"})
  assert e.value.param == "signal"
  with pytest.raises(openai.BadRequestError):
    c.post("/feedback", cast_to=object, body={"signal": "correction",
                                               "conversation_id": conv})


def _raw(url, path, data=None, headers=None, method=None):
  req = urllib.request.Request(url + path, data=data, headers=headers or {}, method=method)
  try:
    with urllib.request.urlopen(req, timeout=30) as resp:
      return resp.status, json.loads(resp.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def _announce_big_body(url, size):
  """Sends only the headers of a `size`-byte POST and reads the answer."""
  host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
  conn = http.client.HTTPConnection(host, int(port), timeout=30)
  conn.putrequest("POST", "/v1/chat/completions")
  conn.putheader("Authorization", f"Bearer {KEY}")
  conn.putheader("Content-Type", "application/json")
  conn.putheader("Content-Length", str(size))
  conn.endheaders()
  resp = conn.getresponse()
  out = resp.status, json.loads(resp.read())
  conn.close()
  return out


def test_errors_in_openai_format(server):
  c = server.client()
  msgs = [{"role": "user", "content": "x"}]
  with pytest.raises(openai.BadRequestError) as e:  # malformed JSON
    c.post("/chat/completions", cast_to=object, content=b'{"model": ',
           options={"headers": {"Content-Type": "application/json"}})
  assert e.value.type == "invalid_request_error" and "JSON" in e.value.message
  with pytest.raises(openai.NotFoundError) as e:
    c.chat.completions.create(model="gpt-4o", messages=msgs)
  assert e.value.code == "model_not_found" and e.value.param == "model"
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model=MODEL, messages=msgs, temperature=-1)
  assert e.value.param == "temperature"
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model=MODEL, messages=msgs, n=0)
  assert e.value.param == "n"
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model=MODEL, messages=msgs, top_logprobs=2)
  assert e.value.param == "top_logprobs"
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])
  assert e.value.param == "messages"
  with pytest.raises(openai.BadRequestError) as e:  # the context is 256 tokens
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "y" * 300}])
  assert e.value.code == "context_length_exceeded"
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=250)
  assert e.value.code == "context_length_exceeded"
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model=MODEL, messages=msgs, frequency_penalty=0.5)
  assert e.value.param == "frequency_penalty"
  with pytest.raises(openai.AuthenticationError) as e:
    server.client(key="sk-wrong").models.list()
  assert e.value.code == "invalid_api_key"
  assert [m.id for m in server.client(key=OTHER_KEY).models.list().data] == [MODEL]
  status, body = _raw(server.url, "/models")  # no Authorization header at all
  assert status == 401 and set(body["error"]) == {"message", "type", "param", "code"}
  status, body = _announce_big_body(server.url, 2 << 20)  # refused before it is read
  assert status == 413 and body["error"]["type"] == "invalid_request_error"
  status, body = _raw(server.url, "/nope", headers={"Authorization": f"Bearer {KEY}"})
  assert status == 404 and "error" in body
  status, body = _raw(server.url.rsplit("/v1", 1)[0], "/health")
  assert status == 200 and body["status"] == "ok"


def test_client_disconnect_cancels_generation(server):
  """A client that goes away (streaming or not) stops its completions: of 64 queued ones
  (about 3 s of decoding on 4 slots) few are finished, and none is recorded."""
  host, port = re.match(r"http://([^:/]+):(\d+)", server.url).groups()
  root = server.url.rsplit("/v1", 1)[0]
  body = {"model": MODEL, "prompt": [f"p{i}" for i in range(8)], "max_tokens": 240, "n": 8,
          "seed": 1}
  for stream in (False, True):
    before = _raw(root, "/health")[1]["completions"]
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=stream)),
                 headers={"Content-Type": "application/json",
                          "Authorization": f"Bearer {KEY}"})
    if stream:
      resp = conn.getresponse()
      cid = json.loads(resp.readline()[len(b"data: "):])["id"]
    else:
      time.sleep(0.3)
    conn.sock.close()
    conn.close()
    # A later request waits behind whatever of the job was not cancelled (FIFO).
    server.client().completions.create(model=MODEL, prompt="after", max_tokens=2)
    finished = _raw(root, "/health")[1]["completions"] - before - 1
    assert finished < 32, (stream, finished)
    if stream:
      assert not any(k.startswith(cid) for k in server.records_by_id())


def test_non_loopback_without_keys_refuses_to_start(tmp_path):
  out = subprocess.run(
      [sys.executable, "launch/serve.py", "--config=experiments/serve_tiny.py",
       "--host=0.0.0.0", "--port=0", f"--records_dir={tmp_path}"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "refusing" in out.stderr
  assert not os.listdir(tmp_path)  # nothing was built or written


def test_follows_published_weights(server):
  """Versions published under --weights_dir are served without a restart."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from composer_rl.model import Transformer, inference_copy  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.loading import chat_and_model  # pylint: disable=import-outside-toplevel
  from composer_rl.sync.publisher import WeightPublisher  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location(
      "serve_tiny", os.path.join(ROOT, "experiments", "serve_tiny.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  mc = chat_and_model(module.get_config())[1]
  c = server.client()
  args = dict(model=MODEL, messages=[{"role": "user", "content": "weights"}], max_tokens=6,
              seed=9, logprobs=True)
  before = c.chat.completions.create(**args)
  publisher = WeightPublisher(server.weights)
  for seed in (5, 6):
    publisher.publish(inference_copy(nnx.to_pure_dict(nnx.split(
        Transformer(mc, rngs=nnx.Rngs(seed)))[1]), mc))
  deadline = time.time() + 60
  while True:
    after = c.chat.completions.create(**args)
    if after.system_fingerprint == "fp_v1" or time.time() > deadline:
      break
    time.sleep(0.3)
  assert after.system_fingerprint == "fp_v1"
  assert server.records_by_id()[f"{after.id}:0"]["policy_version"] == 1
  lps = lambda r: [e.logprob for e in r.choices[0].logprobs.content]
  assert lps(after) != lps(before)


def test_sigterm_finishes_in_flight_requests(server):
  c = server.client()
  stream = c.chat.completions.create(
      model=MODEL, messages=[{"role": "user", "content": "a long one"}], max_tokens=120,
      n=4, seed=11, stream=True)
  it = iter(stream)
  first = next(it)  # the response has started: the request is in flight
  server.proc.send_signal(signal.SIGTERM)
  rest = list(it)  # ends normally: every choice finishes
  assert sum(bool(ch.choices and ch.choices[0].delta.content) for ch in rest) > 4
  finishes = {ch.choices[0].index for ch in rest if ch.choices and ch.choices[0].finish_reason}
  assert finishes == {0, 1, 2, 3}
  assert server.proc.wait(timeout=60) == 0
  recs = server.records_by_id()
  assert all(f"{first.id}:{i}" in recs for i in range(4))


def test_sigkill_loses_no_acknowledged_record(server):
  acked, lock, stop = [], threading.Lock(), threading.Event()

  def client_loop(w):
    c = server.client()
    k = 0
    while not stop.is_set():
      try:
        if k % 3 == 0:
          r = c.chat.completions.create(model=MODEL, messages=[
              {"role": "user", "content": f"load {w} {k}"}], max_tokens=12, n=2)
          got = [f"{r.id}:{ch.index}" for ch in r.choices]
        elif k % 3 == 1:
          chunks = list(c.chat.completions.create(model=MODEL, messages=[
              {"role": "user", "content": f"stream {w} {k}"}], max_tokens=12, stream=True))
          assert chunks and any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
          got = [f"{chunks[0].id}:0"]
        else:
          out = c.post("/feedback", cast_to=object,
                       body={"conversation_id": f"conv-{w}", "signal": "accepted"})
          got = [out["id"]]
      except Exception:  # pylint: disable=broad-except  (the server was killed)
        return
      with lock:
        acked.extend(got)
      k += 1

  threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(4)]
  for t in threads:
    t.start()
  deadline = time.time() + 60
  while len(acked) < 16 and time.time() < deadline:
    time.sleep(0.05)
  server.proc.send_signal(signal.SIGKILL)
  stop.set()
  for t in threads:
    t.join(timeout=60)
  server.proc.wait()
  with lock:
    acknowledged = set(acked)
  assert len(acknowledged) >= 16
  ids = set(server.records_by_id())
  assert acknowledged <= ids, sorted(acknowledged - ids)[:5]


def test_restore_params_from_train_checkpoint(tmp_path):
  """--checkpoint reads only state.params of a train checkpoint (newest good step)."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from composer_rl.model import ModelConfig, sharding  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.loading import restore_params  # pylint: disable=import-outside-toplevel
  from composer_rl.train.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  from composer_rl.train.train_step import TrainConfig, make_train_step  # pylint: disable=import-outside-toplevel
  mc = ModelConfig(vocab_size=264, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                   head_dim=8, d_ff=32, max_seq_len=32, row_tile=8, compute_dtype="float32")
  step = make_train_step(mc, TrainConfig(), sharding.make_mesh({"data": 1},
                                                               jax.devices()[:1]))
  ckpt = Checkpointer(str(tmp_path / "checkpoints"))
  ckpt.save(3, step.init_state(7))
  ckpt.save(5, step.init_state(8))
  ckpt.close()
  os.remove(tmp_path / "checkpoints" / "5" / "meta" / "metadata")  # a damaged newest step
  params, got_step = restore_params(str(tmp_path), mc)
  assert got_step == 3
  want = step.init_state(7).params
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                  jax.tree.leaves(want)))
  with pytest.raises(FileNotFoundError, match="no readable"):
    restore_params(str(tmp_path), dataclasses.replace(mc, d_model=32, head_dim=16))


# ---- scripted generator: tool calls through the same app --------------------------------

class ScriptedGenerator:
  """The Generator interface, answering every request with `text` then the end of turn, in
  any served tokenizer (byte or a real one)."""

  def __init__(self, text: str, tok):
    from composer_rl.serving.generator import Choice, TokenEvent
    self.Choice, self.TokenEvent = Choice, TokenEvent
    self.text, self.tok = text, tok
    self.version, self.max_seq_len, self.max_top_logprobs = 7, 4096, 5
    self.pool = cf.ThreadPoolExecutor(2)

  def submit(self, prompt, sp, on_token=None):
    def work():
      choices = []
      for i in range(sp.n):
        ids = self.tok.encode(self.text)[:sp.max_tokens]
        if len(ids) < sp.max_tokens:
          ids.append(self.tok.EOT)
        for t in ids:
          if on_token:
            on_token(self.TokenEvent(i, t, -0.5, [(t, -0.5)][:sp.top_logprobs],
                                     self.tok.token_bytes(t).decode("utf-8", "replace")))
        choices.append(self.Choice(i, ids, [-0.5] * len(ids), [[]] * len(ids),
                                   self.tok.decode(ids),
                                   "stop" if ids[-1] == self.tok.EOT else "length",
                                   self.version, dict(queued_s=0.0, ttft_s=0.0, total_s=0.0)))
      return choices
    return self.pool.submit(work)

  def cancel(self, future):
    future.cancel()

  def set_params(self, params, version):
    self.version = version

  def close(self):
    self.pool.shutdown()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
  import uvicorn  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.app import AppSettings, create_app  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.records import RecordLog  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.service import ServingService  # pylint: disable=import-outside-toplevel
  from composer_rl.serving.settings import ServeSettings  # pylint: disable=import-outside-toplevel
  tok = ByteTokenizer()
  text = 'I will read it. <tool>{"name": "read_file", "args": {"path": "a.py"}}</tool>'
  records = str(tmp_path_factory.mktemp("scripted"))
  service = ServingService(ScriptedGenerator(text, tok), ChatTemplate(ChatFormat(tok)),
                           RecordLog(records), ServeSettings(model_name="scripted"), tok)
  app = create_app(service, AppSettings(keys=None, rate_limit_per_minute=0))
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  port = sock.getsockname()[1]
  srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
  thread = threading.Thread(target=srv.run, kwargs=dict(sockets=[sock]), daemon=True)
  thread.start()
  while not srv.started:
    time.sleep(0.02)
  client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                         max_retries=0, timeout=30)
  yield client, records
  srv.should_exit = True
  thread.join(timeout=30)


def test_tool_calls_in_responses_and_streams(scripted):
  client, records = scripted
  msgs = [{"role": "user", "content": "Read a.py"}]
  r = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS)
  ch = r.choices[0]
  assert ch.finish_reason == "tool_calls" and ch.message.content == "I will read it."
  call = ch.message.tool_calls[0]
  assert call.type == "function" and call.function.name == "read_file"
  assert json.loads(call.function.arguments) == {"path": "a.py"}
  # Streamed: content before the tag, then the call; what was streamed is what is kept.
  chunks = list(client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS,
                                               stream=True))
  content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
  assert content == "I will read it. " and calls[0].function.name == "read_file"
  assert chunks[-1].choices[0].finish_reason == "tool_calls"
  # tool_choice="none": the call stays text.
  r = client.chat.completions.create(model="scripted", messages=msgs, tools=TOOLS,
                                     tool_choice="none")
  assert r.choices[0].message.tool_calls is None and "<tool>" in r.choices[0].message.content
  recs = {x["id"]: x for x in read_records(records)}
  assert recs[f"{chunks[0].id}:0"]["response"]["content"] == "I will read it. "
  assert recs[f"{chunks[0].id}:0"]["finish_reason"] == "tool_calls"
  assert recs[f"{chunks[0].id}:0"]["policy_version"] == 7


# ---- pure pieces ------------------------------------------------------------------------

def test_content_stream_holds_back_tool_tags():
  s = ContentStream(parse_tools=True)
  assert s.feed("Let me look <") == "Let me look "
  assert s.feed("to") == ""
  assert s.feed('ol>{"name"') == ""
  assert s.streamed == "Let me look "
  s = ContentStream(parse_tools=True)
  assert s.feed("a < b") == "a < b"
  assert ContentStream(parse_tools=False).feed("x <tool>") == "x <tool>"


def test_key_file_and_rate_limiter(tmp_path):
  path = tmp_path / "keys"
  path.write_text(f"alice:{hash_key('k1')}\n\n# comment\n{hash_key('k2')}\n")
  ring = KeyRing.from_file(str(path))
  assert ring.check("k1") == "alice"
  assert ring.check("k2") == hashlib.sha256(b"k2").hexdigest()[:12]
  assert ring.check("k3") is None and ring.check(None) is None
  path.write_text("k1-in-plain-text\n")
  with pytest.raises(ValueError, match="SHA-256"):
    KeyRing.from_file(str(path))
  now = [0.0]
  rl = RateLimiter(per_minute=60, burst=2, clock=lambda: now[0])
  assert rl.acquire("a")[0] and rl.acquire("a")[0]
  ok, wait = rl.acquire("a")
  assert not ok and wait == pytest.approx(1.0)
  assert rl.acquire("b")[0]  # buckets are per key
  now[0] = 1.0
  assert rl.acquire("a")[0]


def test_protocol_validation_messages():
  ok = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
  req = protocol.parse_chat_request({**ok, "temperature": 0, "stop": "END",
                                     "max_completion_tokens": 5})
  assert req.sampling.engine_settings() == (1.0, 1, 1.0)  # greedy
  assert req.sampling.stop == ("END",) and req.sampling.max_tokens == 5
  for bad, param in [({"top_p": 0}, "top_p"), ({"n": 99}, "n"), ({"seed": "x"}, "seed"),
                     ({"stop": ["a"] * 5}, "stop"), ({"logit_bias": {"1": 5}}, "logit_bias"),
                     ({"stream_options": {"include_usage": True}}, "stream_options"),
                     ({"tool_choice": {"type": "function", "function": {"name": "nope"}},
                       "tools": TOOLS}, "tool_choice"),
                     ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
                      "tools[0].function.name")]:
    with pytest.raises(protocol.OpenAIError) as e:
      protocol.parse_chat_request({**ok, **bad})
    assert e.value.status == 400 and e.value.param == param, bad
  with pytest.raises(protocol.OpenAIError) as e:
    protocol.parse_chat_request([1, 2])
  assert e.value.status == 400
  with pytest.raises(protocol.OpenAIError) as e:
    protocol.parse_completion_request({"model": "m", "prompt": [1, 999]}, vocab_size=264)
  assert e.value.param == "prompt"
