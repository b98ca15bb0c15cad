"""The tool-call format the model writes, and its strict parser.

One tool call per turn, JSON inside explicit tags. Two spellings are accepted:

  full:     <tool>{"name": "read_file", "args": {"path": "a.py", "start": 1, "end": 40}}</tool>
  compact:  <t>["read","a.py",1,40]</t>

The compact form is a JSON array: the tool's short name, then its arguments positionally in
the order listed below (trailing optional arguments may be left out). It exists because a
tiny byte-level model pays for every byte; the full form is what a human reads.

  tool        short    arguments (positional order; * = required)
  list_dir    ls       path="."
  read_file   read     path*, start=1, end=None (inclusive line range, 1-based)
  search      grep     pattern* (Python regex), path="."
  edit        edit     path*, old*, new*   (exact string replace; `old` must occur once)
  write_file  write    path*, content*
  run         run      cmd* (shell, inside the sandbox), timeout=None (seconds, capped)
  submit      submit   (no arguments; ends the episode and triggers grading)

Either name (full or short) works in either spelling. Free text (reasoning) may come before
the call; only whitespace may follow it. Anything else is a `ToolCallError` whose message
is shown to the model as its observation, and which the harness counts as a malformed call:
  * no call, or more than one call, in the turn;
  * invalid JSON, a JSON value of the wrong shape, unknown tool, unknown/missing/duplicated
    arguments, or an argument of the wrong type.
`parse_tool_call` never raises anything but ToolCallError, whatever the text.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Dict, List, Optional, Tuple

FULL_OPEN, FULL_CLOSE = "<tool>", "</tool>"
COMPACT_OPEN, COMPACT_CLOSE = "<t>", "</t>"
MAX_CALL_CHARS = 200_000  # a call longer than this is rejected before JSON parsing


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    types: Tuple[type, ...]
    required: bool = True
    default: Any = None


_STR, _INT = (str,), (int,)
# name -> (short name, params in positional order)
TOOL_SCHEMAS: Dict[str, Tuple[str, Tuple[Param, ...]]] = {
    "list_dir": ("ls", (Param("path", _STR, False, "."),)),
    "read_file": ("read", (Param("path", _STR), Param("start", _INT, False, 1),
                           Param("end", _INT, False, None))),
    "search": ("grep", (Param("pattern", _STR), Param("path", _STR, False, "."))),
    "edit": ("edit", (Param("path", _STR), Param("old", _STR), Param("new", _STR))),
    "write_file": ("write", (Param("path", _STR), Param("content", _STR))),
    "run": ("run", (Param("cmd", _STR), Param("timeout", (int, float), False, None))),
    "submit": ("submit", ()),
}
_SHORT = {short: name for name, (short, _) in TOOL_SCHEMAS.items()}


class ToolCallError(ValueError):
    """A malformed tool call; str(e) is the observation shown to the model."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind  # metric label: no_call, multiple_calls, bad_json, bad_shape, ...


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    args: Dict[str, Any]
    compact: bool = False


_TAG_RE = re.compile(r"<tool>|</tool>|<t>|</t>")


def resolve_name(name: Any) -> str:
    if not isinstance(name, str):
        raise ToolCallError("tool name must be a string", "bad_shape")
    if name in TOOL_SCHEMAS:
        return name
    if name in _SHORT:
        return _SHORT[name]
    raise ToolCallError(f"unknown tool {name!r}; tools: {', '.join(TOOL_SCHEMAS)}", "unknown_tool")


def _check_type(tool: str, p: Param, value: Any) -> Any:
    if value is None and not p.required:
        return p.default
    # bool is an int subclass in Python; a JSON true is not a line number.
    if isinstance(value, bool) or not isinstance(value, p.types):
        want = "/".join(t.__name__ for t in p.types)
        raise ToolCallError(f"{tool}: argument {p.name!r} must be {want}", "bad_type")
    return value


def bind_args(tool: str, given: Dict[str, Any]) -> Dict[str, Any]:
    params = TOOL_SCHEMAS[tool][1]
    known = {p.name for p in params}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ToolCallError(f"{tool}: unknown argument(s) {unknown}; expected {sorted(known)}",
                            "bad_args")
    out = {}
    for p in params:
        if p.name in given:
            out[p.name] = _check_type(tool, p, given[p.name])
        elif p.required:
            raise ToolCallError(f"{tool}: missing required argument {p.name!r}", "bad_args")
        else:
            out[p.name] = p.default
    return out


def reject_duplicate_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    d = {}
    for k, v in pairs:
        if k in d:
            raise ToolCallError(f"duplicate key {k!r} in tool call", "bad_json")
        d[k] = v
    return d


def parse_tool_call(text: str) -> ToolCall:
    """Parse one model turn into a ToolCall, or raise ToolCallError (never anything else)."""
    return guarded_parse(_parse, text)


def guarded_parse(parse, text: str):
    """`parse(text)`, with any exception but ToolCallError turned into one ('bad_json'):
    the trainer must never see a parser crash on what a model wrote."""
    try:
        return parse(text)
    except ToolCallError:
        raise
    except Exception as e:  # defensive: the trainer must never see a parser exception
        raise ToolCallError(f"could not parse tool call: {type(e).__name__}", "bad_json") from None


def _parse(text: str) -> ToolCall:
    if not isinstance(text, str):
        raise ToolCallError("model output must be text", "bad_shape")
    tags = [(m.group(0), m.start(), m.end()) for m in _TAG_RE.finditer(text)]
    opens = [t for t in tags if not t[0].startswith("</")]
    if not opens:
        raise ToolCallError("no tool call found; write one call like "
                            '<tool>{"name": "submit", "args": {}}</tool>', "no_call")
    if len(opens) > 1:
        raise ToolCallError("exactly one tool call per turn", "multiple_calls")
    tag, _, body_start = opens[0]
    compact = tag == COMPACT_OPEN
    close = COMPACT_CLOSE if compact else FULL_CLOSE
    closes = [t for t in tags if t[0].startswith("</")]
    if len(closes) != 1 or closes[0][0] != close or closes[0][1] < body_start:
        raise ToolCallError(f"tool call must end with {close}", "unterminated")
    body = text[body_start:closes[0][1]]
    if text[closes[0][2]:].strip():
        raise ToolCallError(f"nothing may follow {close}", "trailing_text")
    if len(body) > MAX_CALL_CHARS:
        raise ToolCallError(f"tool call longer than {MAX_CALL_CHARS} characters", "too_long")
    try:
        value = json.loads(body, object_pairs_hook=reject_duplicate_keys)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"invalid JSON in tool call: {e.msg} at char {e.pos}", "bad_json")
    if compact:
        if not isinstance(value, list) or not value:
            raise ToolCallError('compact call must be a JSON array like ["read","a.py"]',
                                "bad_shape")
        name = resolve_name(value[0])
        params = TOOL_SCHEMAS[name][1]
        if len(value) - 1 > len(params):
            raise ToolCallError(f"{name}: takes at most {len(params)} argument(s)", "bad_args")
        given = {p.name: v for p, v in zip(params, value[1:])}
        return ToolCall(name, bind_args(name, given), compact=True)
    if not isinstance(value, dict):
        raise ToolCallError('tool call must be a JSON object {"name": ..., "args": {...}}',
                            "bad_shape")
    extra = sorted(set(value) - {"name", "args"})
    if extra or "name" not in value:
        raise ToolCallError('tool call object needs "name" and optional "args" only', "bad_shape")
    args = value.get("args", {})
    if not isinstance(args, dict):
        raise ToolCallError('"args" must be a JSON object', "bad_shape")
    name = resolve_name(value["name"])
    return ToolCall(name, bind_args(name, args), compact=False)


def _escape_tags(body: str) -> str:
    """Keep tag-like text inside JSON strings from ending the call ('<' only occurs in strings)."""
    return body.replace("<", "\\u003c") if _TAG_RE.search(body) else body


def format_tool_call(name: str, args: Optional[Dict[str, Any]] = None, compact: bool = False) -> str:
    """Render a call in the format `parse_tool_call` accepts (used by scripted policies)."""
    args = dict(args or {})
    name = resolve_name(name)
    if not compact:
        body = _escape_tags(json.dumps({"name": name, "args": args}, ensure_ascii=False))
        return f"{FULL_OPEN}{body}{FULL_CLOSE}"
    params = TOOL_SCHEMAS[name][1]
    values = [args.get(p.name, p.default) for p in params]
    while (values and not params[len(values) - 1].required
           and values[-1] == params[len(values) - 1].default):
        values.pop()
    body = json.dumps([TOOL_SCHEMAS[name][0]] + values, ensure_ascii=False, separators=(",", ":"))
    return f"{COMPACT_OPEN}{_escape_tags(body)}{COMPACT_CLOSE}"


_HELP = {  # tool -> (compact spelling, full spelling), in the order the help lists them
    "list_dir": ("ls [path]", "list_dir(path)"),
    "read_file": ("read path [start end]", "read_file(path, start, end)"),
    "search": ("grep pattern [path]", "search(pattern, path)"),
    "edit": ("edit path old new", "edit(path, old, new)"),
    "write_file": ("write path content", "write_file(path, content)"),
    "run": ("run cmd [timeout]", "run(cmd, timeout)"),
    "submit": ("submit", "submit()"),
}


def format_help(compact: bool = False, tools: Tuple[str, ...] = ()) -> str:
    """A short description of the tools for the system prompt: all of them, or only
    `tools` (and submit, which every episode has)."""
    names = [t for t in _HELP if not tools or t in tools or t == "submit"]
    if compact:
        return ('One tool call per turn: <t>["name",arg,...]</t>. Tools: '
                + "; ".join(_HELP[t][0] for t in names) + ".")
    return ('One tool call per turn: <tool>{"name": NAME, "args": {...}}</tool>. Tools: '
            + ", ".join(_HELP[t][1] for t in names) + ".")
