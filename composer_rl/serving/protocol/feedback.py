"""`POST /v1/feedback` bodies and the `X-Training-Consent` header."""
import dataclasses
import re
from typing import Any, Optional

from composer_rl.serving.protocol.errors import bad_request
from composer_rl.serving.protocol.fields import (as_object, get_str, is_num, show)


SIGNALS = ("accepted", "rejected", "thumbs_up", "thumbs_down", "correction", "task_outcome")
MAX_ID_CHARS = 128
_ID_OK = re.compile(r"^[\x21-\x7e]{1,128}$")


def check_id(value: Any, name: str) -> Optional[str]:
  """A client-supplied id (conversation or completion): printable ASCII, <= 128 chars."""
  if value is None:
    return None
  if not isinstance(value, str) or not _ID_OK.match(value):
    raise bad_request(f"'{name}' must be 1-{MAX_ID_CHARS} printable ASCII characters "
                      "without spaces.", name)
  return value


@dataclasses.dataclass(frozen=True)
class Feedback:
  signal: str
  conversation_id: Optional[str]
  completion_id: Optional[str]
  value: Any = None        # number, bool or None
  text: Optional[str] = None


def parse_feedback(body: Any, conversation_header: Optional[str] = None,
                   max_text_chars: int = 1 << 20) -> Feedback:
  """Validates a /v1/feedback body:

    {"signal": "accepted" | "rejected" | "thumbs_up" | "thumbs_down" | "correction" |
               "task_outcome",
     "conversation_id": str?, "completion_id": str?,   (at least one; or X-Conversation-Id)
     "value": number | bool | null,   (task_outcome: required, e.g. true / 0.75)
     "text": str | null}              (correction: required, the corrected answer)
  """
  body = as_object(body)
  signal = body.get("signal")
  if signal not in SIGNALS:
    raise bad_request(f"'signal' must be one of {list(SIGNALS)}, got {show(signal)}.",
                      "signal")
  conv = check_id(body.get("conversation_id"), "conversation_id") or conversation_header
  comp = check_id(body.get("completion_id"), "completion_id")
  if conv is None and comp is None:
    raise bad_request("give 'conversation_id' or 'completion_id' (or the X-Conversation-Id "
                      "header).", "conversation_id")
  value = body.get("value")
  if value is not None and not (isinstance(value, bool) or is_num(value)):
    raise bad_request("'value' must be a number, a boolean or null.", "value")
  text = get_str(body, "text")
  if text is not None and len(text) > max_text_chars:
    raise bad_request(f"'text' is longer than {max_text_chars} characters.", "text")
  if signal == "correction" and not text:
    raise bad_request("a 'correction' needs 'text' (the corrected answer).", "text")
  if signal == "task_outcome" and value is None:
    raise bad_request("a 'task_outcome' needs 'value' (e.g. true/false or a score).",
                      "value")
  return Feedback(signal=signal, conversation_id=conv, completion_id=comp, value=value,
                  text=text)


def parse_consent(header: Optional[str]) -> Optional[bool]:
  """X-Training-Consent: 'true' | 'false' (absent = None)."""
  if header is None:
    return None
  v = header.strip().lower()
  if v in ("true", "1", "yes"):
    return True
  if v in ("false", "0", "no"):
    return False
  raise bad_request("X-Training-Consent must be 'true' or 'false'.", "X-Training-Consent")
