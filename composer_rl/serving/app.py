"""The HTTP layer: an OpenAI-compatible FastAPI app over a `ServingService`.

Routes (all but /health need a bearer key when the server has keys):
  GET  /v1/models, /v1/models/{model}
  POST /v1/chat/completions   (tools, streaming, logprobs, n, seed, stop, ...)
  POST /v1/completions
  POST /v1/feedback           (user signals against a conversation or completion)
  GET  /health                (liveness and the served policy version; no key needed)

Every error is OpenAI's error object with OpenAI's status codes, including those FastAPI
would produce itself (its 422 validation errors become 400 invalid_request_error, unknown
URLs 404). Request bodies are read with a byte limit (413 past it) and parsed here, so a
malformed JSON body is a 400 naming the problem.

Generation runs on the generator's engine thread; the event loop never blocks on it.
A non-streaming request awaits its futures (and cancels them if the client goes away); a
stream bridges the engine thread's `TokenEvent`s into an asyncio.Queue with
`loop.call_soon_threadsafe` and sends each as a server-sent event. Records are written
(fsync) in a worker thread before the response body, or a stream's final events, are
sent. Headers: `X-Conversation-Id` (in: the conversation; out: the id used) and
`X-Training-Consent: true|false` (in; recorded).
"""
import asyncio
import dataclasses
import json
import logging as py_logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, List, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from composer_rl.serving import protocol
from composer_rl.serving.auth import KeyRing, RateLimiter, bearer_token
from composer_rl.serving.protocol import OpenAIError
from composer_rl.serving.jobs import ContentStream, Job, RequestContext
from composer_rl.serving.service import ServingService

log = py_logging.getLogger("composer_rl.serving")

CONVERSATION_HEADER = "X-Conversation-Id"
CONSENT_HEADER = "X-Training-Consent"


@dataclasses.dataclass
class AppSettings:
  """keys: accepted API keys (None = no authentication)."""
  keys: Optional[KeyRing] = None
  max_body_bytes: int = 4 << 20
  rate_limit_per_minute: float = 0.0
  rate_limit_burst: float = 0.0
  disconnect_poll_s: float = 0.5

  @classmethod
  def for_service(cls, service: ServingService, keys: Optional[KeyRing]) -> "AppSettings":
    s = service.settings
    return cls(keys=keys, max_body_bytes=s.max_body_bytes,
               rate_limit_per_minute=s.rate_limit_per_minute,
               rate_limit_burst=s.rate_limit_burst)


def _error_response(e: OpenAIError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)


def _sse(obj: Any) -> str:
  return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


class _ClientGone(Exception):
  pass


def create_app(service: ServingService, settings: AppSettings) -> FastAPI:
  limiter = RateLimiter(settings.rate_limit_per_minute, settings.rate_limit_burst or None)

  @asynccontextmanager
  async def lifespan(_app):
    yield
    # uvicorn has stopped accepting and let in-flight requests finish: drain and close.
    await asyncio.to_thread(service.close)

  app = FastAPI(title="composer_rl OpenAI-compatible server", lifespan=lifespan,
                docs_url=None, redoc_url=None, openapi_url=None)
  app.state.service = service

  # ---- errors --------------------------------------------------------------------------
  @app.exception_handler(OpenAIError)
  async def _openai_error(_request: Request, e: OpenAIError):
    return _error_response(e)

  @app.exception_handler(RequestValidationError)
  async def _validation_error(_request: Request, e: RequestValidationError):
    errs = e.errors()
    loc = ".".join(str(x) for x in errs[0].get("loc", ())[1:]) if errs else None
    msg = errs[0].get("msg", "invalid request") if errs else "invalid request"
    return _error_response(protocol.bad_request(f"Invalid request: {msg}", loc or None))

  @app.exception_handler(StarletteHTTPException)
  async def _http_error(request: Request, e: StarletteHTTPException):
    if e.status_code == 404:
      err = OpenAIError(404, f"Unknown request URL: {request.method} {request.url.path}.",
                        protocol.INVALID_REQUEST, None, "unknown_url")
    elif e.status_code == 405:
      err = OpenAIError(405, f"Method {request.method} is not allowed for "
                        f"{request.url.path}.", protocol.INVALID_REQUEST, None,
                        "method_not_allowed")
    else:
      err = OpenAIError(e.status_code, str(e.detail), protocol.INVALID_REQUEST)
    return _error_response(err)

  @app.exception_handler(Exception)
  async def _internal_error(_request: Request, e: Exception):
    log.exception("internal error: %s", e)
    return _error_response(OpenAIError(500, "The server had an error while processing your "
                                       "request.", "server_error", None, "internal_error"))

  # ---- dependencies --------------------------------------------------------------------
  async def authorize(request: Request) -> Optional[str]:
    key_id = None
    if settings.keys is not None:
      header = request.headers.get("authorization")
      if not header:
        raise protocol.unauthorized(
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
      key_id = settings.keys.check(bearer_token(header))
      if key_id is None:
        raise protocol.unauthorized("Incorrect API key provided.")
    who = key_id if key_id is not None else (
        f"addr:{request.client.host}" if request.client else "addr:?")
    ok, wait = limiter.acquire(who)
    if not ok:
      raise protocol.rate_limited(wait)
    return key_id

  def context(request: Request, key_id: Optional[str]) -> RequestContext:
    conv = protocol.check_id(request.headers.get(CONVERSATION_HEADER), CONVERSATION_HEADER)
    consent = protocol.parse_consent(request.headers.get(CONSENT_HEADER))
    return RequestContext(key_id=key_id, conversation_id=conv, consent=consent)

  async def read_json(request: Request) -> Any:
    limit = settings.max_body_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
      raise protocol.body_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > limit:
        raise protocol.body_too_large(limit)
      chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
      raise protocol.bad_request("The request body is empty; send a JSON object.")
    try:
      return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
      raise protocol.bad_request(
          f"We could not parse the JSON body of your request ({e}). Send valid JSON with "
          "Content-Type: application/json.") from None

  async def await_results(job: Job, request: Request) -> List[Any]:
    """The job's results; cancels its completions if the client disconnects first."""
    waits = {asyncio.wrap_future(f) for f in job.futures}
    try:
      while True:
        _, waits = await asyncio.wait(waits, timeout=settings.disconnect_poll_s)
        if not waits:
          break
        if await request.is_disconnected():
          raise _ClientGone()
    except BaseException:
      service.cancel(job.futures)
      raise
    out = []
    for f in job.futures:
      if f.cancelled():
        raise _ClientGone()
      if f.exception() is not None:
        raise f.exception()
      out.append(f.result())
    return out

  # ---- routes --------------------------------------------------------------------------
  @app.get("/health")
  async def health():
    return service.health()

  @app.get("/v1/models")
  async def models(_key: Optional[str] = Depends(authorize)):
    return service.models()

  @app.get("/v1/models/{model:path}")
  async def model(model: str, _key: Optional[str] = Depends(authorize)):
    return service.model(model)

  async def run(request: Request, key_id: Optional[str], endpoint: str):
    body = await read_json(request)
    if endpoint == "chat":
      req = service.parse_chat(body)
      ctx = context(request, key_id)
      job = service.prepare_chat(req, ctx)
    else:
      req = service.parse_completion(body)
      ctx = context(request, key_id)
      job = service.prepare_completion(req, ctx)
    headers = {CONVERSATION_HEADER: job.conversation_ids[0]}
    if job.stream:
      return stream(job, headers)
    service.submit(job)
    try:
      results = await await_results(job, request)
    except _ClientGone:
      return Response(status_code=499)
    done = await asyncio.to_thread(service.complete, job, results)
    body = done.chat_response() if endpoint == "chat" else done.completion_response()
    return JSONResponse(body, headers=headers)

  @app.post("/v1/chat/completions")
  async def chat_completions(request: Request, key_id: Optional[str] = Depends(authorize)):
    return await run(request, key_id, "chat")

  @app.post("/v1/completions")
  async def completions(request: Request, key_id: Optional[str] = Depends(authorize)):
    return await run(request, key_id, "completions")

  @app.post("/v1/feedback")
  async def feedback(request: Request, key_id: Optional[str] = Depends(authorize)):
    body = await read_json(request)
    ctx = context(request, key_id)
    return await asyncio.to_thread(service.feedback, body, ctx)

  # ---- streaming -----------------------------------------------------------------------
  def stream(job: Job, headers: Dict[str, str]) -> StreamingResponse:
    loop = asyncio.get_running_loop()
    queue: "asyncio.Queue" = asyncio.Queue()

    def put(item) -> None:
      # From the engine thread. If the loop is gone this raises, and the generator then
      # cancels the job.
      loop.call_soon_threadsafe(queue.put_nowait, item)

    futures = service.submit(job, lambda k, ev: put((k, ev)))  # errors before any byte
    for f in futures:
      f.add_done_callback(lambda _f: _safe(put, None))
    chat = job.endpoint == "chat"
    n, s = job.n, job.sampling
    total = len(job.prompts) * n
    streams = {i: ContentStream(job.parse_tools) for i in range(total)}
    created, cid, model_name = int(job.created), job.completion_id, job.model
    usage_field = bool(job.request.include_usage)
    fp = service.fingerprint

    def chunk(choices, usage=None):
      if chat:
        return protocol.chat_chunk(cid, created, model_name, choices, usage,
                                   with_usage_field=usage_field, fingerprint=fp)
      out = protocol.text_completion(cid, created, model_name, choices, None, fp)
      if usage_field or usage is not None:
        out["usage"] = usage
      return out

    def token_chunk(index: int, text: str, ev) -> Optional[Dict]:
      lp = None
      if s.logprobs:
        if chat:
          lp = protocol.chat_logprobs([ev.token_id], [ev.logprob], [ev.top], s.top_logprobs,
                                      service.template.token_text,
                                      service.template.token_bytes)
        else:
          lp = protocol.completion_logprobs([ev.token_id], [ev.logprob], [ev.top],
                                            s.top_logprobs, service.template.token_text)
      if not text and lp is None:
        return None
      if chat:
        return chunk([protocol.chunk_choice(index, {"content": text}, None, lp)])
      return chunk([protocol.text_choice(index, text, None, lp)])

    async def events() -> AsyncIterator[str]:
      finished = False
      try:
        if chat:  # the role first, as OpenAI does
          for i in range(total):
            yield _sse(chunk([protocol.chunk_choice(i, {"role": "assistant", "content": ""})]))
        pending = len(futures)
        while pending:
          item = await queue.get()
          if item is None:
            pending -= 1
            continue
          k, ev = item
          index = k * n + ev.choice
          c = token_chunk(index, streams[index].feed(ev.text_delta), ev)
          if c is not None:
            yield _sse(c)
        for f in futures:
          if f.cancelled():
            return
          if f.exception() is not None:
            raise f.exception()
        results = [f.result() for f in futures]
        done = await asyncio.to_thread(
            service.complete, job, results, {i: st.streamed for i, st in streams.items()})
        for fc in done.choices:  # recorded: now the final events
          sent = streams[fc.index].streamed
          if chat:
            delta: Dict[str, Any] = {}
            if fc.tool_calls:
              delta["tool_calls"] = protocol.tool_call_deltas(fc.tool_calls)
            else:
              rest = (fc.content or "")[len(sent):]
              if rest:
                delta["content"] = rest
            yield _sse(chunk([protocol.chunk_choice(fc.index, delta, fc.finish_reason)]))
          else:
            rest = (fc.content or "")[len(sent):]
            yield _sse(chunk([protocol.text_choice(fc.index, rest, fc.finish_reason, None)]))
        if usage_field:
          yield _sse(chunk([], done.usage()))
        yield "data: [DONE]\n\n"
        finished = True
      except OpenAIError as e:
        yield _sse(e.body())
      except Exception as e:  # pylint: disable=broad-except
        log.exception("stream failed: %s", e)
        yield _sse(OpenAIError(500, "The server had an error while processing your request.",
                               "server_error", None, "internal_error").body())
      finally:
        if not finished:
          service.cancel(futures)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**headers, "Cache-Control": "no-cache",
                                      "X-Accel-Buffering": "no"})

  return app


def _safe(fn, *args) -> None:
  try:
    fn(*args)
  except RuntimeError:
    pass
