"""Progress of long phases: count, rate and ETA, in a terminal and in a log file.

`progress(total, desc)` is a `tqdm` bar on stderr. In a terminal it redraws one line; when
stderr is a file or a pipe (a cluster log), each update is its own line, at most one every
30 seconds (the env var COMPOSER_RL_PROGRESS_S sets another interval),
plus the first and the last:

  demonstrations:  45%|####5     | 900/2000 [00:30<00:37, 29.51 sessions/s]

COMPOSER_RL_PROGRESS=0 turns every bar off. Needs no JAX.
"""
import os
import sys
from typing import Iterable, Optional

import tqdm


# No monitor thread: it re-prints a stalled bar with a stale rate, which in a log file is a
# misleading extra line; bars update when work is done.
tqdm.tqdm.monitor_interval = 0


class _Lines:
  """A text stream for tqdm that ends each update with a newline (log files keep every
  update readable instead of a run of carriage returns)."""

  def __init__(self, stream):
    self._stream = stream
    self._last = ""

  def write(self, text: str) -> None:
    text = text.replace("\r", "").replace("\x1b[A", "").strip()
    head = text.split("[")[0]  # the count: a line that adds none (a close) is not repeated
    if text and head != self._last:
      self._stream.write(text + "\n")
      self._last = head

  def flush(self) -> None:
    self._stream.flush()


def _interval() -> float:
  try:
    return float(os.environ.get("COMPOSER_RL_PROGRESS_S", "30"))
  except ValueError:
    return 30.0


def progress(total: Optional[int] = None, desc: str = "", unit: str = "it",
             iterable: Optional[Iterable] = None, stream=None,
             disable: bool = False) -> tqdm.tqdm:
  """A progress bar over `total` units (or over `iterable`); `.update(n)` advances it and
  `.close()` (or a `with` block) prints the final line. `disable`: no output (e.g. on
  processes other than the chief)."""
  stream = stream or sys.stderr
  disabled = disable or os.environ.get("COMPOSER_RL_PROGRESS", "1") == "0"
  tty = hasattr(stream, "isatty") and stream.isatty()
  return tqdm.tqdm(iterable, total=total, desc=desc, unit=" " + unit if unit else "it",
                   file=stream if tty else _Lines(stream), ascii=not tty,
                   mininterval=0.5 if tty else _interval(),
                   dynamic_ncols=tty, ncols=None if tty else 100, disable=disabled,
                   leave=True, smoothing=0.1)
