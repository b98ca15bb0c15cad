"""Builds (or incrementally updates) the static viewer of a run: `build(workdir)`.

Scale is the design constraint: a run of 10,000 sessions must open in under 2 seconds, so
the overview reads one small `data/index.json` (per-step summaries and metrics, no
sessions); the session table for search and filters (`data/sessions.json`, columns, a
few dozen bytes per session) is fetched after the overview is drawn; full sessions live
in shards of `shard_size` that the page fetches only when one is opened.

Incremental: `data/manifest.json` records each record file's (size, mtime). A re-run
re-processes only files that changed, reuses the rest (their rows and shards are on
disk), drops the data of files that disappeared, and rewrites the small index files.
Every file is written to a temporary name and renamed, so a page open on a run in
progress never reads a half-written file.
"""
import json
import os
import shutil
import time
from typing import Any, Callable, Dict, List

from composer_rl.rollout import formats
from composer_rl.viewer import run_info as run_info_lib
from composer_rl.viewer import session as session_lib
from composer_rl.viewer.sources import Source, find_sources

FORMAT = 1  # bump when the data layout changes: every file is then re-processed
ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
# The page reads these columns from sessions.json (see session.convert).
COLUMNS = ("src", "i", "task", "gid", "sid", "r", "fam", "turns", "gen", "len", "fin", "out",
           "mal", "hacks", "vmin", "vmax", "adv", "tools", "shard")


def _write_json(path: str, obj: Any) -> int:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, separators=(",", ":"), allow_nan=False, default=str)
  os.replace(tmp, path)
  return os.path.getsize(path)


def _read_json(path: str, default=None):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return default


def _finite(x: Any) -> Any:
  """JSON has no NaN/inf: such values become None (shown as 'n/a')."""
  if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
    return None
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_finite(v) for v in x]
  return x


def group_advantages(records: List[Dict], estimator: str) -> List[float]:
  """The trainer's advantages for one RL step's records: `train.advantages`, called on the
  step's rewards and group ids exactly as `controller/agent_rl.py: _train_on` does (the
  file holds the groups of one train step). Imported here, not at module level: JAX
  starts only when a file that needs advantages is (re-)processed."""
  if not records:
    return []
  import numpy as np  # pylint: disable=g-import-not-at-top
  from composer_rl.train import advantages as adv_lib  # pylint: disable=g-import-not-at-top
  rewards = np.asarray([float(d.get("reward", 0.0)) for d in records], np.float32)
  gids = np.asarray([int(d.get("group_id", 0)) for d in records], np.int32)
  return [float(a) for a in np.asarray(adv_lib.compute_advantages(estimator, rewards, gids))]


def _read_records(path: str):
  records, bad = [], 0
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      if not line.strip():
        continue
      try:
        d = json.loads(line)
      except ValueError:
        bad += 1
        continue
      if isinstance(d, dict):
        records.append(d)
      else:
        bad += 1
  return records, bad


def _summary(src: Source, rows: List[Dict], bad: int, adv: bool) -> Dict[str, Any]:
  n = len(rows)
  mean = lambda k: sum(r[k] for r in rows) / n if n else None
  versions = [r["vmin"] for r in rows if r["vmin"] >= 0] + [r["vmax"] for r in rows
                                                            if r["vmax"] >= 0]
  return dict(name=src.name, label=src.label, kind=src.kind, step=src.step,
              file=os.path.relpath(src.path, os.path.dirname(os.path.dirname(src.path)))
              if src.kind != "demos" else os.path.basename(src.path),
              n=n, groups=len({r["gid"] for r in rows}), tasks=len({r["task"] for r in rows}),
              reward_mean=mean("r"), solve_rate=(sum(r["out"] == "solved" for r in rows) / n
                                                 if n else None),
              turns_mean=mean("turns"), gen_tokens=sum(r["gen"] for r in rows),
              malformed=sum(r["mal"] for r in rows), hacks=sum(r["hacks"] for r in rows),
              errors=sum(r["out"] == "error" for r in rows), bad_lines=bad,
              vmin=min(versions) if versions else -1, vmax=max(versions) if versions else -1,
              families=sorted({r["fam"] for r in rows if r["fam"]}), advantages=adv)


def _run_chat(workdir: str):
  """(call syntax, tokenizer or None) of the run (`rollout.formats.write_run_chat`)."""
  info = formats.read_run_chat(workdir)
  tok = None
  if info.get("tokenizer") and os.path.exists(os.path.join(info["tokenizer"], "tokenizer.json")):
    from composer_rl.data.hf_tokenizer import HfTokenizer  # pylint: disable=g-import-not-at-top
    tok = HfTokenizer(info["tokenizer"])
  return info.get("call_syntax", "tool"), tok


def _process(src: Source, data: str, shard_size: int, estimator: str,
             chat=("tool", None)) -> Dict[str, Any]:
  """Converts one record file: writes its shards and rows; returns its manifest entry."""
  st = os.stat(src.path)
  records, bad = _read_records(src.path)
  use_adv = src.kind in ("rl", "other")  # eval sessions are their own groups; demos are SFT
  advs = group_advantages(records, estimator) if use_adv else [0.0] * len(records)
  rows, shards = [], []
  for i, (d, a) in enumerate(zip(records, advs)):
    row, sess = session_lib.convert(d, a, i // shard_size, *chat)
    row = dict(row, src=src.name, i=i)
    rows.append(row)
    if i % shard_size == 0:
      shards.append([])
    shards[-1].append(_finite(dict(sess, src=src.name, i=i)))
  for k, shard in enumerate(shards):
    _write_json(os.path.join(data, "shards", f"{src.name}.{k}.json"), shard)
  _write_json(os.path.join(data, "rows", f"{src.name}.json"), _finite(rows))
  return dict(stat=[st.st_size, st.st_mtime_ns], shards=len(shards),
              summary=_finite(_summary(src, rows, bad, use_adv)))


def _remove(data: str, name: str, entry: Dict[str, Any], keep_shards: int = 0) -> None:
  for k in range(keep_shards, entry.get("shards", 0)):
    path = os.path.join(data, "shards", f"{name}.{k}.json")
    if os.path.exists(path):
      os.remove(path)
  if not keep_shards and os.path.exists(os.path.join(data, "rows", f"{name}.json")):
    os.remove(os.path.join(data, "rows", f"{name}.json"))


def _copy_assets(out: str) -> None:
  for name in os.listdir(ASSETS):
    src, dst = os.path.join(ASSETS, name), os.path.join(out, name)
    if os.path.isfile(src):
      shutil.copyfile(src, dst + ".tmp")
      os.replace(dst + ".tmp", dst)


def build(workdir: str, out_dir: str = "", advantage: str = "grpo", shard_size: int = 50,
          log: Callable[[str], None] = lambda s: None) -> Dict[str, Any]:
  """Writes/updates the viewer of `workdir` in `out_dir` (default W/viewer); returns stats
  (sources processed and reused, sessions, index size, seconds)."""
  t0 = time.time()
  out = out_dir or os.path.join(workdir, "viewer")
  data = os.path.join(out, "data")
  for d in (data, os.path.join(data, "shards"), os.path.join(data, "rows")):
    os.makedirs(d, exist_ok=True)
  manifest = _read_json(os.path.join(data, "manifest.json"), {})
  if (manifest.get("format") != FORMAT or manifest.get("advantage") != advantage
      or manifest.get("shard_size") != shard_size):
    manifest = {}
  old = manifest.get("sources", {})
  entries: Dict[str, Dict] = {}
  processed = 0
  sources = find_sources(workdir)
  chat = None  # the run's call syntax and tokenizer, read once a source needs them
  for src in sources:
    st = os.stat(src.path)
    prev = old.get(src.name)
    if (prev and prev.get("stat") == [st.st_size, st.st_mtime_ns]
        and os.path.exists(os.path.join(data, "rows", f"{src.name}.json"))):
      entries[src.name] = prev
      continue
    log(f"processing {src.path}")
    if chat is None:
      chat = _run_chat(workdir)
    entries[src.name] = _process(src, data, shard_size, advantage, chat)
    if prev:  # a file that shrank leaves no stale shards behind
      _remove(data, src.name, prev, keep_shards=entries[src.name]["shards"])
    processed += 1
  for name, entry in old.items():
    if name not in entries:
      _remove(data, name, entry)
  # The session table: every source's rows, as columns (src as an index into `sources`).
  cols = {c: [] for c in COLUMNS}
  for k, src in enumerate(sources):
    for r in _read_json(os.path.join(data, "rows", f"{src.name}.json"), []):
      for c in COLUMNS:
        cols[c].append(k if c == "src" else r.get(c))
  n = len(cols["src"])
  sessions_bytes = _write_json(os.path.join(data, "sessions.json"),
                               dict(sources=[s.name for s in sources], columns=cols))
  summaries = [entries[s.name]["summary"] for s in sources]
  index = _finite(dict(
      format=FORMAT, built_at=time.time(), advantage=advantage, shard_size=shard_size,
      sessions=n, sessions_bytes=sessions_bytes, run=run_info_lib.run_info(workdir),
      sources=summaries, vocab=session_lib.vocab(),
      families=sorted({f for s in summaries for f in s["families"]})))
  index_bytes = _write_json(os.path.join(data, "index.json"), index)
  _copy_assets(out)
  _write_json(os.path.join(data, "manifest.json"),
              dict(format=FORMAT, advantage=advantage, shard_size=shard_size, sources=entries))
  return dict(out=out, sources=len(sources), processed=processed,
              reused=len(sources) - processed, sessions=n, index_bytes=index_bytes,
              sessions_bytes=sessions_bytes, seconds=round(time.time() - t0, 3))
