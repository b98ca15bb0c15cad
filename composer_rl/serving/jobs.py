"""What the service passes around for one request: its context, the prepared `Job`, the
`Finished` result (and the response bodies built from it), and `ContentStream`, which
holds streamed text back while it could still be a tool call."""
import concurrent.futures as cf
import dataclasses
from typing import Any, Dict, List, Optional

from composer_rl.env import tool_call_format
from composer_rl.serving import protocol
from composer_rl.serving.generator import Choice, SamplingParams


@dataclasses.dataclass
class RequestContext:
  """Who asked: the API key's id (None without keys), the conversation header, consent."""
  key_id: Optional[str] = None
  conversation_id: Optional[str] = None
  consent: Optional[bool] = None


@dataclasses.dataclass
class Job:
  """A validated request ready for the generator."""
  endpoint: str                       # "chat" | "completions"
  completion_id: str
  created: float
  model: str
  prompts: List[List[int]]            # token ids of each prompt (one for chat)
  sampling: protocol.Sampling
  params: SamplingParams              # what the generator samples with (n = sampling.n)
  conversation_ids: List[str]         # one per prompt
  ctx: RequestContext
  request: Any                        # ChatRequest | CompletionRequest
  futures: List[cf.Future] = dataclasses.field(default_factory=list)

  @property
  def stream(self) -> bool:
    return bool(self.request.stream)

  @property
  def n(self) -> int:
    return self.sampling.n

  @property
  def parse_tools(self) -> bool:
    return self.endpoint == "chat" and self.request.parse_tools


@dataclasses.dataclass
class FinishedChoice:
  index: int                    # index in the response (prompt * n + choice)
  choice: Choice
  content: Optional[str]        # chat: the message content; completions: the text
  tool_calls: List[Dict]
  finish_reason: str            # "stop" | "length" | "tool_calls"
  message: Optional[Dict]       # chat: the assistant message returned


@dataclasses.dataclass
class Finished:
  job: Job
  choices: List[FinishedChoice]
  prompt_tokens: int
  completion_tokens: int
  service: Any  # the ServingService that finished it

  def usage(self) -> Dict[str, int]:
    return protocol.usage(self.prompt_tokens, self.completion_tokens)

  @property
  def fingerprint(self) -> str:
    """`system_fingerprint`: the weight version(s) that sampled the choices."""
    versions = sorted({fc.choice.version for fc in self.choices})
    return "fp_v" + "-".join(str(v) for v in versions)

  def chat_response(self) -> Dict[str, Any]:
    job, svc = self.job, self.service
    out = []
    for fc in self.choices:
      lp = None
      if job.sampling.logprobs:
        c = fc.choice
        lp = protocol.chat_logprobs(c.token_ids, c.logprobs, c.top_logprobs,
                                    job.sampling.top_logprobs, svc.template.token_text,
                                    svc.template.token_bytes)
      out.append(protocol.chat_choice(fc.index, fc.message, fc.finish_reason, lp))
    return protocol.chat_completion(job.completion_id, int(job.created), job.model, out,
                                    self.usage(), self.fingerprint)

  def completion_response(self) -> Dict[str, Any]:
    job, svc = self.job, self.service
    out = []
    for fc in self.choices:
      lp = None
      if job.sampling.logprobs:
        c = fc.choice
        lp = protocol.completion_logprobs(c.token_ids, c.logprobs, c.top_logprobs,
                                          job.sampling.top_logprobs, svc.template.token_text)
      out.append(protocol.text_choice(fc.index, fc.content or "", fc.finish_reason, lp))
    return protocol.text_completion(job.completion_id, int(job.created), job.model, out,
                                    self.usage(), self.fingerprint)


# ---- streaming -------------------------------------------------------------------

TOOL_TAGS = (tool_call_format.FULL_OPEN, tool_call_format.COMPACT_OPEN)


class ContentStream:
  """Decides how much of a choice's final text (the generator's `text_delta`s) may be
  streamed as `content` when the request offered tools: everything before a tool call's
  opening tag, holding back a tail that could still become one. What was streamed is what
  the client will send back, so it is what the returned message's content is."""

  def __init__(self, parse_tools: bool):
    self.parse_tools = parse_tools
    self.text = ""
    self.sent = 0

  def feed(self, delta: str) -> str:
    self.text += delta
    if not self.parse_tools:
      end = len(self.text)
    else:
      starts = [self.text.find(t, self.sent) for t in TOOL_TAGS]
      starts = [p for p in starts if p >= 0]
      if starts:
        end = min(starts)
      else:
        end = len(self.text)
        for t in TOOL_TAGS:  # a suffix that is a prefix of a tag may still become one
          for k in range(min(len(t) - 1, len(self.text)), 0, -1):
            if self.text.endswith(t[:k]):
              end = min(end, len(self.text) - k)
              break
      end = max(end, self.sent)
    out, self.sent = self.text[self.sent:end], max(end, self.sent)
    return out

  @property
  def streamed(self) -> str:
    return self.text[:self.sent]
