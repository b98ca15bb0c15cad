"""The OpenAI API's wire format: request validation and response builders (no HTTP here).

One module per part: `errors` (OpenAIError and its constructors), `fields` (field checks
and a request's sampling settings), `chat` and `completions` (the two generation
endpoints' requests), `feedback` (feedback bodies, the consent header) and `bodies` (the
response objects). Their public names are importable from this package.

Requests are validated into dataclasses (`parse_chat_request`, `parse_completion_request`,
`parse_feedback`); anything a client got wrong raises `OpenAIError`, whose `body()` is
OpenAI's error object

    {"error": {"message": ..., "type": "invalid_request_error", "param": "temperature",
               "code": null}}

with the HTTP status OpenAI uses (400 bad request, 401 key, 404 unknown model, 413 body,
429 rate limit, 503 overloaded), so the official clients raise their usual exception types
(`BadRequestError`, `AuthenticationError`, `NotFoundError`, ...).

What is accepted, and why some OpenAI parameters are refused: the served policy samples
from exactly the distribution the trainer scores (temperature, top-k, top-p; see
`composer_rl.sampling.head`), and every completion is recorded with the log-probs of that
distribution. Parameters that would change the distribution outside that head
(frequency/presence penalties, logit_bias, JSON modes, best_of) are refused with a 400
naming them rather than silently ignored. `temperature=0` means greedy (top_k=1). Unknown
extra fields are ignored, as most OpenAI-compatible servers do, so newer clients keep
working. `tool_choice` 'required' or a named function is accepted but not enforced (there
is no constrained decoding); a named function must be one of `tools`.

Response builders return plain dicts in the shapes of `openai.types.chat.ChatCompletion`,
`ChatCompletionChunk` and `openai.types.Completion`.
"""
# pylint: disable=g-importing-member
from composer_rl.serving.protocol.bodies import (
    assistant_message, chat_choice, chat_chunk, chat_completion, chat_logprobs, chunk_choice,
    completion_logprobs, model_card, model_list, text_choice, text_completion,
    tool_call_deltas, usage)
from composer_rl.serving.protocol.chat import ChatRequest, parse_chat_request
from composer_rl.serving.protocol.completions import (CompletionRequest,
                                                      parse_completion_request)
from composer_rl.serving.protocol.errors import (
    INVALID_REQUEST, OpenAIError, bad_request, body_too_large, context_length_exceeded,
    model_not_found, overloaded, rate_limited, unauthorized)
from composer_rl.serving.protocol.feedback import (SIGNALS, Feedback, check_id, parse_consent,
                                                   parse_feedback)
from composer_rl.serving.protocol.fields import Sampling

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "Feedback",
    "INVALID_REQUEST",
    "OpenAIError",
    "SIGNALS",
    "Sampling",
    "assistant_message",
    "bad_request",
    "body_too_large",
    "chat_choice",
    "chat_chunk",
    "chat_completion",
    "chat_logprobs",
    "check_id",
    "chunk_choice",
    "completion_logprobs",
    "context_length_exceeded",
    "model_card",
    "model_list",
    "model_not_found",
    "overloaded",
    "parse_chat_request",
    "parse_completion_request",
    "parse_consent",
    "parse_feedback",
    "rate_limited",
    "text_choice",
    "text_completion",
    "tool_call_deltas",
    "unauthorized",
    "usage",
]
