"""The agent's tools, executed against a `World`. Chosen by name from `TOOLS`.

Each tool takes (world, args, limits) and returns the observation text. A problem the model
caused (missing file, ambiguous edit, bad regex) raises `ToolError`, which the harness turns
into an error observation; nothing here may raise into the trainer.
"""
from __future__ import annotations

import dataclasses
import os
import re

from composer_rl.env.registry import Registry
from composer_rl.env.world import PathError, World

TOOLS: Registry = Registry("tool")


class ToolError(Exception):
    """An error the model caused; str(e) becomes the observation."""


@dataclasses.dataclass(frozen=True)
class ToolLimits:
    """Caps that keep observations short (a long observation costs context and compute).

    max_read_lines: most lines read_file returns in one call.
    max_list_entries: most entries list_dir shows.
    max_search_matches: most matching lines search shows.
    max_search_file_bytes: files larger than this are skipped by search.
    max_run_timeout_s: upper bound on the `timeout` a model may request for `run`.
    default_run_timeout_s: timeout for `run` when the model gives none.
    max_observation_chars: any observation longer than this is cut with a visible marker.
    """

    max_read_lines: int = 200
    max_list_entries: int = 200
    max_search_matches: int = 50
    max_search_file_bytes: int = 1 << 20
    max_run_timeout_s: float = 60.0
    default_run_timeout_s: float = 20.0
    max_observation_chars: int = 8000


def _guard(fn):
    def wrapped(world: World, args: dict, limits: ToolLimits) -> str:
        try:
            return fn(world, args, limits)
        except PathError as e:
            raise ToolError(f"error: {e}") from None
        except (OSError, UnicodeError) as e:
            raise ToolError(f"error: {type(e).__name__}: {e}") from None

    wrapped.__doc__ = fn.__doc__
    return wrapped


@TOOLS.register("list_dir")
@_guard
def list_dir(world: World, args: dict, limits: ToolLimits) -> str:
    host = world.resolve(args["path"])
    if os.path.islink(host) or not os.path.isdir(host):
        raise ToolError(f"error: {args['path']}: not a directory")
    names = sorted(os.listdir(host))
    out = [n + "/" if os.path.isdir(os.path.join(host, n)) and not os.path.islink(
        os.path.join(host, n)) else n for n in names[:limits.max_list_entries]]
    if len(names) > limits.max_list_entries:
        out.append(f"[... {len(names) - limits.max_list_entries} more entries]")
    return "\n".join(out) if out else "(empty directory)"


@TOOLS.register("read_file")
@_guard
def read_file(world: World, args: dict, limits: ToolLimits) -> str:
    lines = world.read_text(args["path"]).splitlines()
    start = max(1, args["start"])
    end = len(lines) if args["end"] is None else min(args["end"], len(lines))
    cut = end - start + 1 > limits.max_read_lines
    if cut:
        end = start + limits.max_read_lines - 1
    if not lines:
        return "(empty file)"
    if start > len(lines):
        raise ToolError(f"error: start line {start} is past the end ({len(lines)} lines)")
    body = "\n".join(f"{i}|{lines[i - 1]}" for i in range(start, end + 1))
    if cut or (args["end"] is None and end < len(lines)):
        body += f"\n[... lines {end + 1}-{len(lines)} not shown; read with start={end + 1}]"
    return body


@TOOLS.register("search")
@_guard
def search(world: World, args: dict, limits: ToolLimits) -> str:
    try:
        pattern = re.compile(args["pattern"])
    except re.error as e:
        raise ToolError(f"error: bad regex: {e}") from None
    root = world.resolve(args["path"])
    files = [root] if os.path.isfile(root) else []
    if os.path.isdir(root) and not os.path.islink(root):
        for dirpath, dirnames, filenames in os.walk(root):  # os.walk does not follow links
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                                 and d != "__pycache__")
            files.extend(os.path.join(dirpath, f) for f in sorted(filenames))
    matches = []
    for f in files:
        if os.path.islink(f) or not os.path.isfile(f) or os.path.getsize(f) > limits.max_search_file_bytes:
            continue
        try:
            text = world.read_text(world.rel(f))
        except PathError:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                matches.append(f"{world.rel(f)}:{no}:{line[:200]}")
                if len(matches) > limits.max_search_matches:
                    break
        if len(matches) > limits.max_search_matches:
            break
    if not matches:
        return "(no matches)"
    if len(matches) > limits.max_search_matches:
        matches = matches[:limits.max_search_matches] + ["[... more matches not shown]"]
    return "\n".join(matches)


@TOOLS.register("edit")
@_guard
def edit(world: World, args: dict, limits: ToolLimits) -> str:
    path, old, new = args["path"], args["old"], args["new"]
    if not old:
        raise ToolError("error: `old` must be non-empty (use write_file to create a file)")
    text = world.read_text(path)
    n = text.count(old)
    if n == 0:
        raise ToolError(f"error: old text not found in {path} (it must match exactly, "
                        "including whitespace)")
    if n > 1:
        raise ToolError(f"error: old text occurs {n} times in {path}; include more "
                        "surrounding lines so it is unique")
    world.write_text(path, text.replace(old, new, 1))
    return f"edited {path}"


@TOOLS.register("write_file")
@_guard
def write_file(world: World, args: dict, limits: ToolLimits) -> str:
    world.write_text(args["path"], args["content"])
    return f"wrote {args['path']} ({len(args['content'])} chars)"


@TOOLS.register("run")
@_guard
def run(world: World, args: dict, limits: ToolLimits) -> str:
    timeout = args["timeout"] or limits.default_run_timeout_s
    timeout = max(0.1, min(float(timeout), limits.max_run_timeout_s))
    r = world.run(args["cmd"], timeout_s=timeout)
    out = r.stdout + (("\n" if r.stdout and not r.stdout.endswith("\n") else "") + r.stderr
                      if r.stderr else "")
    status = f"[exit code {r.exit_code}]"
    if r.timed_out:
        status = f"[timed out after {timeout:g}s; killed]"
    elif r.killed_reason:
        status = f"[exit code {r.exit_code}; {r.killed_reason}]"
    return (out + ("\n" if out and not out.endswith("\n") else "") + status)


def truncate_observation(text: str, limit: int) -> str:
    """Cut an over-long observation in the middle with a visible marker."""
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit - limit // 2
    return (text[:head] + f"\n[... observation truncated: {len(text) - limit} chars omitted ...]\n"
            + text[-tail:])
