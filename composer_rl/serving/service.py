"""`ServingService`: the model behind the OpenAI-compatible server, without HTTP.

It owns the `Generator` (continuous batching over the exact engine), the `ChatTemplate`
(OpenAI messages <-> the training token layout), the `RecordLog` (durable session records)
and, with a weights directory, a follower thread that serves each newly published weight
version without a restart. `composer_rl.serving.app` turns HTTP requests into calls here:

  job = service.prepare_chat(request, ctx)       # render, check lengths, conversation id
  futures = service.submit(job, on_token)        # one future per prompt (n choices each)
  done = service.complete(job, results)          # parse tool calls, remember ids, RECORD
  done.chat_response() / done.completion_response()

`complete` appends one record per choice and returns only once they are on stable storage,
so a response (or a stream's final event) is never sent for a completion that is not
recorded. Record format: `composer_rl.serving.records`.

Conversation ids: the `X-Conversation-Id` header when given; otherwise, for chat, a hash
of the rendered conversation up to and including its first user message (with the
system prompt and tools): every turn of one agent session shares it. For /v1/completions,
a hash of the whole prompt.

`composer_rl.serving.loading.build_service(config, ...)` builds one from an experiment config.
"""
import concurrent.futures as cf
import hashlib
import json
import random
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence

from composer_rl.serving import protocol
from composer_rl.serving.chat_template import ChatTemplate
from composer_rl.serving.generator import (Choice, Generator, QueueFullError, SamplingParams,
                                           TokenEvent)
from composer_rl.serving.jobs import Finished, FinishedChoice, Job, RequestContext
from composer_rl.serving.protocol import OpenAIError
from composer_rl.serving.records import RecordLog, float_bits
from composer_rl.serving.settings import ServeSettings


def _new_id(prefix: str) -> str:
  return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _hash_ids(kind: str, ids: Sequence[int]) -> str:
  h = hashlib.sha256(kind.encode() + b"\0" + json.dumps(list(ids)).encode()).hexdigest()
  return f"conv-{h[:32]}"


class ServingService:
  """See the module docstring. `model_created`: unix time reported by /v1/models."""

  def __init__(self, generator: Generator, template: ChatTemplate, records: RecordLog,
               settings: ServeSettings, tokenizer, follower=None):
    self.generator, self.template, self.records = generator, template, records
    self.settings, self.tok = settings, tokenizer
    self.model_name = settings.model_name
    self.model_created = int(time.time())
    self.follower = follower
    self._conv_of: "OrderedDict[str, str]" = OrderedDict()  # completion id -> conversation
    self._conv_lock = threading.Lock()
    self._closed = False
    self.counters = dict(requests=0, records=0, feedback=0)

  # ---- info ----------------------------------------------------------------------------
  @property
  def fingerprint(self) -> str:
    """The version served now (a stream's chunks; a finished response reports the version
    that sampled it, and the record's policy_version is authoritative)."""
    return f"fp_v{self.generator.version}"

  @property
  def max_top_logprobs(self) -> int:
    return min(20, self.generator.max_top_logprobs)

  def models(self) -> Dict[str, Any]:
    return protocol.model_list([protocol.model_card(self.model_name, self.model_created)])

  def model(self, name: str) -> Dict[str, Any]:
    self.check_model(name)
    return protocol.model_card(self.model_name, self.model_created)

  def check_model(self, name: str) -> None:
    if name != self.model_name:
      raise protocol.model_not_found(name)

  def health(self) -> Dict[str, Any]:
    stats = getattr(self.generator, "stats", {})
    return {"status": "ok", "model": self.model_name,
            "policy_version": self.generator.version,
            "completions": int(stats.get("completions", 0)),
            "generated_tokens": int(stats.get("generated_tokens", 0))}

  # ---- requests ------------------------------------------------------------------------
  def parse_chat(self, body: Any) -> protocol.ChatRequest:
    req = protocol.parse_chat_request(body, max_n=self.settings.max_n,
                                      max_top_logprobs=self.max_top_logprobs)
    self.check_model(req.model)
    return req

  def parse_completion(self, body: Any) -> protocol.CompletionRequest:
    req = protocol.parse_completion_request(
        body, vocab_size=self.tok.vocab_size, max_n=self.settings.max_n,
        max_top_logprobs=min(5, self.max_top_logprobs), max_prompts=self.settings.max_prompts)
    self.check_model(req.model)
    return req

  def _budget(self, s: protocol.Sampling, prompt_len: int, param: str) -> int:
    """max_tokens for a prompt, or a 400 when the context cannot hold the request."""
    ctx = self.generator.max_seq_len
    room = ctx - 1 - prompt_len  # what the generator can sample after this prompt
    if room < 1:
      raise protocol.context_length_exceeded(ctx, prompt_len, None, param)
    if s.max_tokens is None:
      return min(self.settings.default_max_tokens, room)
    if s.max_tokens > room:
      raise protocol.context_length_exceeded(ctx - 1, prompt_len, s.max_tokens, param)
    return s.max_tokens

  def _params(self, s: protocol.Sampling, budget: int) -> SamplingParams:
    temperature, top_k, top_p = s.engine_settings()
    # A request without a seed gets one here, so that its record can be replayed.
    seed = s.seed if s.seed is not None else random.getrandbits(31)
    return SamplingParams(max_tokens=budget, temperature=temperature, top_p=top_p,
                          top_k=top_k, seed=seed, stop=s.stop, n=s.n,
                          top_logprobs=s.top_logprobs if s.logprobs else 0)

  def _conversation_id(self, ctx: RequestContext, messages, tools, prompt) -> str:
    if ctx.conversation_id:
      return ctx.conversation_id
    if messages is not None:
      first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
      if first_user is not None:
        try:
          return _hash_ids("chat", self.template.render(messages[:first_user + 1], tools))
        except ValueError:
          pass
    return _hash_ids("prompt", prompt)

  def prepare_chat(self, req: protocol.ChatRequest, ctx: RequestContext) -> Job:
    try:
      prompt = self.template.render(req.messages, req.tools)
    except ValueError as e:
      raise protocol.bad_request(str(e), "messages") from None
    budget = self._budget(req.sampling, len(prompt), "messages")
    conv = self._conversation_id(ctx, req.messages, req.tools, prompt)
    return Job(endpoint="chat", completion_id=_new_id("chatcmpl"), created=time.time(),
               model=self.model_name, prompts=[prompt], sampling=req.sampling,
               params=self._params(req.sampling, budget), conversation_ids=[conv], ctx=ctx,
               request=req)

  def prepare_completion(self, req: protocol.CompletionRequest, ctx: RequestContext) -> Job:
    prompts = []
    for p in req.prompts:
      ids = self.template.render_text(p) if isinstance(p, str) else [int(x) for x in p]
      prompts.append(ids)
    budgets = [self._budget(req.sampling, len(p), "prompt") for p in prompts]
    convs = [self._conversation_id(ctx, None, None, p) for p in prompts]
    # One budget for every prompt of a request keeps the request's settings one record.
    return Job(endpoint="completions", completion_id=_new_id("cmpl"), created=time.time(),
               model=self.model_name, prompts=prompts, sampling=req.sampling,
               params=self._params(req.sampling, min(budgets)), conversation_ids=convs,
               ctx=ctx, request=req)

  def submit(self, job: Job,
             on_token: Optional[Callable[[int, TokenEvent], None]] = None) -> List[cf.Future]:
    """Queues the job's completions; `on_token(prompt_index, event)` streams tokens (from
    the engine thread). Maps the generator's refusals to OpenAI errors."""
    if self._closed:
      raise protocol.overloaded("the server is shutting down")
    self.counters["requests"] += 1
    futures = []
    try:
      for k, prompt in enumerate(job.prompts):
        cb = None if on_token is None else (lambda ev, k=k: on_token(k, ev))
        futures.append(self.generator.submit(prompt, job.params, cb))
    except QueueFullError as e:
      self.cancel(futures)
      raise OpenAIError(429, f"The server is at capacity ({e}); retry shortly.",
                        "server_error", None, "server_overloaded",
                        headers={"Retry-After": "1"}) from None
    except ValueError as e:
      self.cancel(futures)
      raise protocol.bad_request(str(e), "messages" if job.endpoint == "chat" else "prompt",
                                 "context_length_exceeded" if "context" in str(e) else None
                                 ) from None
    except RuntimeError as e:  # closed
      self.cancel(futures)
      raise protocol.overloaded(f"the server is shutting down ({e})") from None
    job.futures = futures
    return futures

  def cancel(self, futures: Sequence[cf.Future]) -> None:
    for f in futures:
      if not f.done():
        self.generator.cancel(f)

  def complete(self, job: Job, results: List[List[Choice]],
               streamed: Optional[Dict[int, str]] = None) -> Finished:
    """Parses, remembers and durably records every choice; blocking (fsync). `streamed`:
    for a stream, the content text each choice index already sent (the message content
    the client will hold)."""
    out: List[FinishedChoice] = []
    for k, choices in enumerate(results):
      for c in choices:
        index = k * job.n + c.index
        if job.endpoint == "chat":
          content, calls = (self.template.parse(c.text, job.request.tools)
                            if job.parse_tools else (c.text, []))
          if streamed is not None and calls:
            content = streamed.get(index) or None
          elif streamed is not None:
            content = c.text
          reason = "tool_calls" if calls else c.finish_reason
          message = protocol.assistant_message(content, calls)
          self.template.remember(c.token_ids, message)
          out.append(FinishedChoice(index, c, content, calls, reason, message))
        else:
          out.append(FinishedChoice(index, c, c.text, [], c.finish_reason, None))
    prompt_tokens = sum(len(p) for p in job.prompts)
    done = Finished(job=job, choices=out, prompt_tokens=prompt_tokens,
                    completion_tokens=sum(len(fc.choice.token_ids) for fc in out),
                    service=self)
    self._record(done)
    return done

  def _record(self, done: Finished) -> None:
    job = done.job
    p = job.params
    sampling = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
                "seed": p.seed, "max_tokens": p.max_tokens, "stop": list(p.stop)}
    for fc in done.choices:
      k = fc.index // job.n
      c = fc.choice
      rec = {
          "kind": "completion", "id": f"{job.completion_id}:{fc.index}",
          "completion_id": job.completion_id, "choice": fc.index,
          "conversation_id": job.conversation_ids[k], "created": job.created,
          "model": job.model, "prompt_ids": list(job.prompts[k]),
          "completion_ids": [int(t) for t in c.token_ids],
          "logprobs_bits": float_bits(c.logprobs), "policy_version": int(c.version),
          "sampling": sampling, "finish_reason": fc.finish_reason,
          "timings": {**{k2: float(v) for k2, v in c.timings.items()},
                      "recorded_at": time.time()},
          "consent": job.ctx.consent, "key_id": job.ctx.key_id, "endpoint": job.endpoint,
      }
      if job.endpoint == "chat":
        rec["messages"] = job.request.messages
        rec["tools"] = job.request.tools
        rec["response"] = fc.message
      else:
        prompt = job.request.prompts[k]
        rec["messages"] = None
        rec["prompt"] = prompt if isinstance(prompt, str) else None
        rec["response"] = {"text": fc.content}
      self.records.append(rec)
      self.counters["records"] += 1
    with self._conv_lock:
      self._conv_of[job.completion_id] = job.conversation_ids[0]
      while len(self._conv_of) > 100_000:
        self._conv_of.popitem(last=False)

  # ---- feedback ------------------------------------------------------------------------
  def feedback(self, body: Any, ctx: RequestContext) -> Dict[str, Any]:
    """Validates and durably records a /v1/feedback call (blocking)."""
    fb = protocol.parse_feedback(body, ctx.conversation_id)
    conv = fb.conversation_id
    if conv is None and fb.completion_id:
      with self._conv_lock:
        conv = self._conv_of.get(fb.completion_id.split(":")[0])
    rec = {"kind": "feedback", "id": _new_id("fb"), "created": time.time(),
           "conversation_id": conv, "completion_id": fb.completion_id, "signal": fb.signal,
           "value": fb.value, "text": fb.text, "consent": ctx.consent, "key_id": ctx.key_id}
    self.records.append(rec)
    self.counters["feedback"] += 1
    return {"id": rec["id"], "object": "feedback", "created": int(rec["created"]),
            "conversation_id": conv, "completion_id": fb.completion_id,
            "signal": fb.signal, "recorded": True}

  # ---- lifecycle -----------------------------------------------------------------------
  def warmup(self) -> None:
    """Compiles the engine's programs (prefill batches, a decode step) before serving."""
    self.generator.warmup(self.template.render([{"role": "user", "content": "warmup"}]))

  def close(self) -> None:
    """Stops following weights, finishes queued completions, closes the record log."""
    if self._closed:
      return
    self._closed = True
    if self.follower is not None:
      self.follower.stop()
    self.generator.close()
    self.records.close()
