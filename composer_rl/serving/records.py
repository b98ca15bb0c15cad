"""A durable, append-only log of what the server generated and what users said about it.

The OpenAI-compatible server appends one record per returned choice before it acknowledges
the response, and one per feedback call; the online-RL ingestion stage
(`composer_rl.online.ingest`) reads them back into training trajectories.

On disk: a directory of files `records-000001.log`, `records-000002.log`, ... read in
index order. Each record is one line

    <CRC32 of the JSON bytes, 8 lowercase hex digits> <compact JSON object>\\n

JSON escapes newlines inside strings, so a record never contains a newline byte. A line
without its trailing newline is a torn write (the process died mid-append); a line whose
CRC does not match is corrupt. `read_records` skips both with a warning and keeps going.
A `RecordLog` never appends to an existing file: each open starts a new one, so a torn tail
left by a killed writer stays the last bytes of its file and cannot swallow later records.

Record kinds (written by the server; readers ignore kinds they do not know):

completion -- one choice of one /v1/chat/completions or /v1/completions response:
  kind: "completion"
  id: "<completion_id>:<choice>", unique per record
  completion_id: the response id the client saw; choice: the choice index in it
  conversation_id: the conversation the request belongs to (client-supplied or derived)
  created: unix seconds (float); model: the served model name
  prompt_ids: [int] every token the engine was prompted with (the rendered conversation)
  completion_ids: [int] the tokens the model sampled for this choice
  logprobs_bits: [int] the float32 log-prob of each completion token as its uint32 bit
    pattern (`float_bits`), so the trainer sees the sampler's exact values
  policy_version: the weight version that sampled the completion
  sampling: {"temperature", "top_p", "top_k", "seed" (int or null), "max_tokens", "stop"}
  finish_reason: "stop" | "length" | "tool_calls"
  timings: {...} server-side timings in seconds
  consent: true | false | null (whether the user agreed to training on this data)
  key_id: the API key's id or null
  endpoint: "chat" | "completions"
  messages: the request's messages (for inspection); response: the assistant message

feedback -- a user's or client's judgement of a completion or a whole conversation:
  kind: "feedback"
  id: unique id; created: unix seconds
  conversation_id: str or null; completion_id: str or null (at least one is set; a
    completion_id is a response id or a record id "<completion_id>:<choice>")
  signal: "accepted" | "rejected" | "thumbs_up" | "thumbs_down" | "correction" |
    "task_outcome"
  value: number, bool or null; text: str or null (e.g. the corrected answer)
  consent: true | false | null
"""
import itertools
import json
import os
import re
import threading
import warnings
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

_FILE = re.compile(r"^records-(\d+)\.log$")


def float_bits(values: List[float]) -> List[int]:
  """float32 values -> their uint32 bit patterns (exact, NaN payloads included)."""
  return np.asarray(values, np.float32).view(np.uint32).tolist()


def bits_float(bits: List[int]) -> List[float]:
  """uint32 bit patterns -> the float32 values they encode (as Python floats)."""
  return np.asarray(bits, np.uint32).view(np.float32).tolist()


def encode(record: Dict[str, Any]) -> bytes:
  """One framed line: CRC32 hex, a space, compact JSON, newline."""
  # ASCII escapes: a lone surrogate from a client's JSON cannot fail to encode.
  body = json.dumps(record, separators=(",", ":")).encode("ascii")
  return b"%08x %s\n" % (zlib.crc32(body), body)


def _decode(line: bytes) -> Optional[Dict[str, Any]]:
  """The record in a complete line (newline stripped), or None if the line is corrupt."""
  if len(line) < 10 or line[8:9] != b" ":
    return None
  try:
    crc = int(line[:8], 16)
  except ValueError:
    return None
  body = line[9:]
  if zlib.crc32(body) != crc:
    return None
  try:
    record = json.loads(body)
  except ValueError:  # CRC matched bytes that were never valid JSON: not ours
    return None
  return record if isinstance(record, dict) else None


def _log_files(directory: str) -> List[tuple]:
  """[(index, path)] of the log files in `directory`, in index order."""
  found = []
  for name in os.listdir(directory):
    m = _FILE.match(name)
    if m:
      found.append((int(m.group(1)), os.path.join(directory, name)))
  return sorted(found)


def _fsync_dir(directory: str) -> None:
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def read_records(directory: str,
                 on_skip: Optional[Callable[[str, int, str], None]] = None
                 ) -> Iterator[Dict[str, Any]]:
  """Every good record under `directory`, in file then write order.

  A torn or corrupt line is skipped with a warning naming its file and byte offset, and
  `on_skip(path, offset, reason)` is called if given (to count them). A missing directory
  yields nothing.
  """
  if not os.path.isdir(directory):
    return
  for _, path in _log_files(directory):
    with open(path, "rb") as f:
      offset = 0
      for line in f:
        if not line.endswith(b"\n"):
          reason = "torn record (no newline at end of file)"
          record = None
        else:
          record = _decode(line[:-1])
          reason = "corrupt record (CRC or JSON mismatch)"
        if record is None:
          warnings.warn(f"{path}: byte offset {offset}: skipping {reason}")
          if on_skip is not None:
            on_skip(path, offset, reason)
        else:
          yield record
        offset += len(line)


class RecordLog:
  """Appends records to `directory` durably (module docstring has the format).

  `append` returns only after the record is written and fsynced. Concurrent appenders
  share fsyncs (group commit): while one thread syncs, others write their records and
  then wait; the next sync covers all of them. A record that would take the current file
  past `max_file_bytes` starts a new file (the old one is fsynced and closed first; a
  record larger than the limit gets a file of its own). If a write or fsync fails the
  log is unusable (every later append raises): after a failed write the file may hold a
  partial line, and after a failed fsync Linux may report later fsyncs as clean although
  the data was dropped, so neither can be retried safely.
  """

  def __init__(self, directory: str, max_file_bytes: int = 64 << 20):
    if max_file_bytes <= 0:
      raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
    self.directory = directory
    self.max_file_bytes = max_file_bytes
    self._cond = threading.Condition()
    self._written = 0    # records written to the OS (sequence number of the last one)
    self._synced = 0     # records known durable
    self._syncing = False
    self._error: Optional[BaseException] = None
    self._closed = False
    os.makedirs(directory, exist_ok=True)
    existing = _log_files(directory)
    self._index = existing[-1][0] if existing else 0
    self._open_next()

  @property
  def path(self) -> str:
    """The file records are currently appended to."""
    return self._path

  def _open_next(self) -> None:
    # O_EXCL: another process opening the same directory takes a different index.
    for index in itertools.count(self._index + 1):
      path = os.path.join(self.directory, f"records-{index:06d}.log")
      try:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        break
      except FileExistsError:
        continue
    self._index, self._path, self._size = index, path, 0
    _fsync_dir(self.directory)  # the new file's directory entry must survive a crash too

  def _check(self) -> None:
    if self._error is not None:
      raise OSError(f"record log {self.directory} failed earlier") from self._error
    if self._closed:
      raise ValueError(f"record log {self.directory} is closed")

  def _wait_no_sync(self) -> None:
    """Waits (holding the lock on return) until no fsync is in flight on the current fd."""
    while self._syncing:
      self._cond.wait()

  def _fail(self, e: BaseException) -> None:
    self._error = e
    self._cond.notify_all()

  def append(self, record: Dict[str, Any]) -> None:
    """Writes `record` (a JSON-serializable dict); returns once it is on stable storage."""
    line = encode(record)
    with self._cond:
      self._check()
      if self._size > 0 and self._size + len(line) > self.max_file_bytes:
        self._wait_no_sync()  # the fd must not close under another thread's fsync
        self._check()
        try:
          os.fsync(self._fd)
          os.close(self._fd)
          self._fd = -1  # closed: `close` must not close it again if opening the next fails
          self._synced = self._written
          self._open_next()
        except OSError as e:
          self._fail(e)
          raise
      try:
        view = memoryview(line)
        while view:
          view = view[os.write(self._fd, view):]
      except OSError as e:
        self._fail(e)
        raise
      self._size += len(line)
      self._written += 1
      seq = self._written
      while self._synced < seq:
        self._check()
        if self._syncing:
          self._cond.wait()
          continue
        # Become the leader: sync everything written so far, without holding the lock,
        # so that other appenders can write while the disk works.
        self._syncing = True
        target, fd = self._written, self._fd
        self._cond.release()
        try:
          os.fsync(fd)
        except OSError as e:
          error = e
        else:
          error = None
        finally:
          self._cond.acquire()
          self._syncing = False
          self._cond.notify_all()
        if error is not None:
          self._fail(error)
          raise error
        self._synced = max(self._synced, target)

  def close(self) -> None:
    """Syncs and closes the current file; later appends raise. Idempotent."""
    with self._cond:
      if self._closed:
        return
      self._wait_no_sync()
      self._closed = True
      try:
        if self._error is None:
          os.fsync(self._fd)
          self._synced = self._written  # appenders still waiting are durable now
      except OSError as e:
        self._error = e
        raise
      finally:
        if self._fd >= 0:
          os.close(self._fd)
        self._cond.notify_all()

  def __enter__(self) -> "RecordLog":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
