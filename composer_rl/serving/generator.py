"""Request-driven continuous batching over the engine: what the server generates with.

One thread drives the continuous-batching loop the rollout runner is also made of
(`composer_rl.sampling.batcher.SlotBatcher`): this module is its source (a queue of
requested completions) and its sink (futures and token streams). It admits queued
completions into free decode slots (their prompts prefilled in one batch), decodes every
occupied slot, and finishes a completion when it samples the end-of-turn token, reaches its
token budget, produces a stop string, or is cancelled; its slot goes to the next in the
queue.
Callers submit from any thread and get a `concurrent.futures.Future`; `on_token` streams
each token as it is sampled.

Exactness: every token's log-prob is the engine's, i.e. the trainer's recomputation of the
same token under the same weights and sampling transform, bit for bit, whatever else
shares the batch. A completion never mixes weight versions: `set_params` stops admitting
new completions, lets those in flight finish under the weights they started with, then
switches (so a record carries one `policy_version`, and the switch costs at most one
completion's decode).

Randomness: a token's key is (seed, choice index, position). With a request `seed` the same
prompt under the same weights gives the same completions whatever else is being served;
without one a fresh random seed is drawn.
"""
import codecs
import collections
import concurrent.futures as cf
import dataclasses
import random
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from composer_rl.sampling.batcher import SlotBatcher
from composer_rl.sampling.engine import Engine, Request


class QueueFullError(RuntimeError):
  """More completions are waiting than `max_waiting` allows (the server answers 429)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """A request's sampling settings (OpenAI semantics).

  max_tokens: completion tokens at most (also bounded by the context window).
  temperature/top_p/top_k: the sampling transform; log-probs are of the transformed
    distribution (the one actually sampled from). top_k=1 is greedy.
  seed: RNG seed (None = random); n: completions of the prompt.
  stop: strings that end a completion (not included in its text).
  top_logprobs: alternatives returned per token (<= the engine's `top_logprobs`).
  """
  max_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: Optional[int] = None
  stop: Tuple[str, ...] = ()
  n: int = 1
  top_logprobs: int = 0


@dataclasses.dataclass
class TokenEvent:
  """One sampled token of choice `choice`; `text_delta` is the text that became final
  with it (held back while it could still be part of a stop string or of a UTF-8
  character)."""
  choice: int
  token_id: int
  logprob: float
  top: List[Tuple[int, float]]
  text_delta: str


@dataclasses.dataclass
class Choice:
  """A finished completion: the exact sampled ids (the end-of-turn token included when
  sampled), their log-probs, the text (stop string cut off), why it ended ('stop' or
  'length'), the weight version that sampled every token, and timings in seconds."""
  index: int
  token_ids: List[int]
  logprobs: List[float]
  top_logprobs: List[List[Tuple[int, float]]]
  text: str
  finish_reason: str
  version: int
  timings: Dict[str, float]


class _Job:
  """A submitted request: its n completions share a future."""

  def __init__(self, prompt: List[int], sp: SamplingParams, seed: int,
               on_token: Optional[Callable[[TokenEvent], None]]):
    self.prompt, self.sp, self.seed, self.on_token = prompt, sp, seed, on_token
    self.future: cf.Future = cf.Future()
    self.choices: List[Optional[Choice]] = [None] * sp.n
    self.cancelled = False
    self.t_submit = time.perf_counter()


class _Seq:
  """One completion in flight."""

  def __init__(self, job: _Job, index: int, budget: int):
    self.job, self.index, self.budget = job, index, budget
    self.ids: List[int] = []
    self.logprobs: List[float] = []
    self.tops: List[List[Tuple[int, float]]] = []
    self.raw = bytearray()       # the completion's bytes (byte-level tokenizer)
    self.emitted = 0             # characters of the final text already streamed
    self.t_start = self.t_first = 0.0
    self.version = -1
    self.reason: Optional[str] = None  # why it ended ('stop', 'length')
    self.saved, self.saved_version = None, -1  # a completion never resumes a cache


class Generator:
  """See module docstring.

  engine: the continuous-batching engine (its `top_logprobs` bounds a request's).
  params/version: the weights to serve (placed on the engine's mesh) and their version.
  tokenizer: the served tokenizer (`token_bytes` builds the text; `tok.EOT` ends a turn).
  max_waiting: completions that may queue for a slot before `submit` raises QueueFullError.
  decode_steps: engine decode steps per call (`SlotBatcher`); tokens stream in blocks of
    this size, and the sampled bits do not depend on it.
  """

  def __init__(self, engine: Engine, params, version: int, tokenizer, max_waiting: int = 256,
               decode_steps: int = 1):
    self.engine, self.tok = engine, tokenizer
    self.max_waiting = max_waiting
    self._cv = threading.Condition()
    self._waiting: Deque[_Seq] = collections.deque()
    self._pending: Optional[Tuple[object, int]] = None
    self._closed = False
    self.stats = dict(completions=0, version_switches=0)
    self._batcher = SlotBatcher(engine, self, params, version, decode_steps, tokenizer.EOT,
                                self.stats)
    self._thread = threading.Thread(target=self._loop, name="generator", daemon=True)
    self._thread.start()

  @property
  def version(self) -> int:
    """The weight version completions are admitted under now."""
    return self._batcher.version

  @property
  def max_seq_len(self) -> int:
    return self.engine.config.max_seq_len

  @property
  def max_top_logprobs(self) -> int:
    return self.engine.top_logprobs

  # ---- caller side ---------------------------------------------------------------------
  def submit(self, prompt_ids: Sequence[int], sp: SamplingParams,
             on_token: Optional[Callable[[TokenEvent], None]] = None) -> cf.Future:
    """Queues `sp.n` completions of `prompt_ids`; the future's result is their `Choice`s."""
    prompt = [int(i) for i in prompt_ids]
    room = self.max_seq_len - 1 - len(prompt)
    if not prompt:
      raise ValueError("the prompt is empty")
    if room < 1:
      raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context is "
                       f"{self.max_seq_len} tokens and at least one must be left to generate")
    if sp.max_tokens < 1 or sp.n < 1:
      raise ValueError("max_tokens and n must be >= 1")
    if not 0 <= sp.top_logprobs <= self.max_top_logprobs:
      raise ValueError(f"top_logprobs must be in [0, {self.max_top_logprobs}]")
    Request(seq_id=0, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p).rows()  # validates
    seed = sp.seed if sp.seed is not None else random.getrandbits(31)
    job = _Job(prompt, sp, int(seed) & 0xFFFFFFFF, on_token)
    with self._cv:
      if self._closed:
        raise RuntimeError("the generator is closed")
      if len(self._waiting) + sp.n > self.max_waiting:
        raise QueueFullError(f"{len(self._waiting)} completions are waiting (limit "
                             f"{self.max_waiting})")
      for i in range(sp.n):
        self._waiting.append(_Seq(job, i, min(sp.max_tokens, room)))
      self._cv.notify()
    job.future._composer_job = job  # pylint: disable=protected-access  (for cancel)
    return job.future

  def cancel(self, future: cf.Future) -> None:
    """Stops a request's completions (a client went away); its future is cancelled."""
    job = getattr(future, "_composer_job", None)
    if job is not None:
      with self._cv:
        job.cancelled = True
        self._cv.notify()

  def set_params(self, params, version: int) -> None:
    """Serves `params` (on the engine's mesh) as `version` once in-flight completions end."""
    with self._cv:
      self._pending = (params, int(version))
      self._cv.notify()

  def warmup(self, prompt_ids: Sequence[int]) -> None:
    """Compiles every program serving uses before the first request waits on one: the
    prefill of each power-of-two batch of prompts up to the slots (queued prompts are
    admitted together), insertion and a decode call. `prompt_ids`: any short prompt."""
    prompt = [int(i) for i in prompt_ids]
    rows = 1
    while rows <= self.engine.slots:
      self.engine.prefill_many(params=self._batcher.params,
                               items=[(prompt, Request(seq_id=i), None) for i in range(rows)])
      rows *= 2
    self.submit(prompt, SamplingParams(max_tokens=2, seed=0)).result()

  def close(self) -> None:
    """Finishes what is in flight or queued, then stops the engine thread."""
    with self._cv:
      self._closed = True
      self._cv.notify()
    self._thread.join()

  # ---- engine thread -------------------------------------------------------------------
  def _loop(self) -> None:
    b = self._batcher
    while True:
      with self._cv:
        if self._pending is not None and not b.busy:
          b.switch(*self._pending)
          self._pending = None
          self.stats["version_switches"] += 1
        while not b.busy and not self._waiting and self._pending is None and not self._closed:
          self._cv.wait()
        if self._closed and not b.busy and not self._waiting:
          return
        admit = []
        # A pending weight switch admits nothing new: in-flight completions drain first.
        while self._pending is None and self._waiting and len(admit) < b.free:
          admit.append(self._waiting.popleft())
      try:
        self._step(admit)
      except Exception as e:  # pylint: disable=broad-except  (fail the requests, not the server)
        for s in [x for x in b.slots if x is not None] + admit:
          if not s.job.future.done():
            s.job.future.set_exception(e)
        b.reset()

  def _step(self, admit: List[_Seq]) -> None:
    b = self._batcher
    live = []
    for s in admit:
      if s.job.cancelled:
        self._finish(s, "cancelled")
      else:
        s.t_start, s.version = time.perf_counter(), b.version
        live.append(s)
    # One prefill per completion (a batch of them), each from an empty cache.
    for s in b.admit(live) if live else []:
      self._finish(s, s.reason)
    for i, s in enumerate(b.slots):
      if s is not None and s.job.cancelled:
        self._finish(b.evict(i), "cancelled")
    for s in b.decode():
      self._finish(s, s.reason)

  # ---- the batcher's client (`composer_rl.sampling.batcher.SlotClient`) ----------------
  @staticmethod
  def context(s: _Seq) -> List[int]:
    return s.job.prompt

  @staticmethod
  def request(s: _Seq) -> Request:
    sp = s.job.sp
    return Request(seq_id=s.index, seed=s.job.seed, temperature=sp.temperature,
                   top_k=sp.top_k, top_p=sp.top_p)

  @staticmethod
  def budget(s: _Seq) -> int:
    return s.budget - len(s.ids)

  @staticmethod
  def keep_cache(s: _Seq) -> bool:
    return False

  def on_token(self, s: _Seq, token: int, logprob: float, top_ids, top_lps,
               version: int) -> bool:
    """Appends a sampled token; True (with `s.reason`) when the completion ends."""
    del version  # a completion is admitted and drained under one version (`s.version`)
    if not s.ids:
      s.t_first = time.perf_counter()
    k = s.job.sp.top_logprobs
    s.ids.append(token)
    s.logprobs.append(logprob)
    s.tops.append([(int(a), float(b)) for a, b in zip(top_ids[:k], top_lps[:k])])
    reason = None
    if token == self.tok.EOT:
      reason = "stop"
    else:
      s.raw += self.tok.token_bytes(token)
      text = self._text(s)
      if any(stop in text for stop in s.job.sp.stop):
        reason = "stop"
      elif len(s.ids) >= s.budget:
        reason = "length"
    if s.job.on_token is not None:
      self._emit(s, token, logprob, final=reason is not None)
    s.reason = reason
    return reason is not None

  @staticmethod
  def _text(s: _Seq) -> str:
    return s.raw.decode("utf-8", errors="replace")

  def _final_text(self, s: _Seq) -> str:
    text = self._text(s)
    cut = min((text.find(st) for st in s.job.sp.stop if st in text), default=-1)
    return text[:cut] if cut >= 0 else text

  def _emit(self, s: _Seq, token: int, logprob: float, final: bool) -> None:
    if final:
      text = self._final_text(s)
      end = len(text)
    else:
      # Hold back an incomplete UTF-8 character and anything a stop string could start.
      text = codecs.getincrementaldecoder("utf-8")("replace").decode(bytes(s.raw))
      hold = max((len(st) - 1 for st in s.job.sp.stop), default=0)
      end = max(len(text) - hold, s.emitted)
    delta, s.emitted = text[s.emitted:end], max(end, s.emitted)
    try:
      s.job.on_token(TokenEvent(s.index, token, logprob, s.tops[-1], delta))
    except Exception:  # pylint: disable=broad-except  (a broken listener never stops decoding)
      s.job.cancelled = True

  def _finish(self, s: _Seq, reason: str) -> None:
    job = s.job
    if reason == "cancelled":
      if not job.future.done():
        job.future.cancel()
      return
    now = time.perf_counter()
    job.choices[s.index] = Choice(
        index=s.index, token_ids=s.ids, logprobs=s.logprobs, top_logprobs=s.tops,
        text=self._final_text(s), finish_reason=reason, version=s.version,
        timings=dict(queued_s=s.t_start - job.t_submit, ttft_s=s.t_first - job.t_submit,
                     total_s=now - job.t_submit))
    self.stats["completions"] += 1
    if all(c is not None for c in job.choices) and not job.future.done():
      job.future.set_result(list(job.choices))
