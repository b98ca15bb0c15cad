"""OpenAI's error objects: `OpenAIError` and one constructor per HTTP status."""
import math
from typing import Any, Dict, Optional


INVALID_REQUEST = "invalid_request_error"


class OpenAIError(Exception):
  """An error response: HTTP `status` and OpenAI's error object."""

  def __init__(self, status: int, message: str, type: str = INVALID_REQUEST,  # pylint: disable=redefined-builtin
               param: Optional[str] = None, code: Optional[str] = None,
               headers: Optional[Dict[str, str]] = None):
    super().__init__(message)
    self.status, self.message, self.type = int(status), message, type
    self.param, self.code = param, code
    self.headers = dict(headers or {})

  def body(self) -> Dict[str, Any]:
    return {"error": {"message": self.message, "type": self.type, "param": self.param,
                      "code": self.code}}

  def __repr__(self):
    return f"OpenAIError({self.status}, {self.message!r}, param={self.param!r})"


def bad_request(message: str, param: Optional[str] = None,
                code: Optional[str] = None) -> OpenAIError:
  return OpenAIError(400, message, INVALID_REQUEST, param, code)


def model_not_found(model: str) -> OpenAIError:
  return OpenAIError(404, f"The model `{model}` does not exist or you do not have access "
                     "to it.", INVALID_REQUEST, "model", "model_not_found")


def unauthorized(message: str = "Incorrect API key provided.") -> OpenAIError:
  return OpenAIError(401, message, INVALID_REQUEST, None, "invalid_api_key",
                     headers={"WWW-Authenticate": "Bearer"})


def rate_limited(retry_after_s: float) -> OpenAIError:
  wait = max(1, math.ceil(retry_after_s))
  return OpenAIError(429, f"Rate limit reached for requests; try again in {wait}s.",
                     "requests", None, "rate_limit_exceeded",
                     headers={"Retry-After": str(wait)})


def body_too_large(limit: int) -> OpenAIError:
  return OpenAIError(413, f"Request body too large: the limit is {limit} bytes.",
                     INVALID_REQUEST, None, "request_too_large")


def overloaded(message: str = "The server is overloaded; retry later.") -> OpenAIError:
  return OpenAIError(503, message, "server_error", None, "server_overloaded",
                     headers={"Retry-After": "1"})


def context_length_exceeded(max_len: int, prompt: int, completion: Optional[int],
                            param: str = "messages") -> OpenAIError:
  if completion is None:
    msg = (f"This model's maximum context length is {max_len} tokens. However, your "
           f"prompt is {prompt} tokens, which leaves no room for a completion. Please "
           "reduce the length of the prompt.")
  else:
    msg = (f"This model's maximum context length is {max_len} tokens. However, you "
           f"requested {prompt + completion} tokens ({prompt} in the prompt, {completion} "
           "in the completion). Please reduce the length of the prompt or the completion.")
  return OpenAIError(400, msg, INVALID_REQUEST, param, "context_length_exceeded")
