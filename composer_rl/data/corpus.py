"""The continued-pretraining corpus: real source files -> filtered, deduplicated documents,
split into train and held-out BY REPOSITORY.

Sources (a registry, chosen by name; each yields `RawFile`s):
  dirs          directory trees: each immediate subdirectory of a root is one repository
                ("<root basename>/<subdir>"), and each top-level file of a root is a
                repository of its own ("<root basename>/<module stem>").
  jsonl         JSONL shards, one {"repo", "path", "text"} object per line.
  array_record  ArrayRecord shards (the `array_record` package grain depends on), one
                UTF-8 JSON object {"repo", "path", "text"} per record.

Filters, in this order (each drop counted under its reason): language (by extension,
`EXTENSIONS`), size in bytes (`min_bytes`..`max_bytes`), not valid UTF-8, a secret detector
hit (`composer_rl.data.secrets`), exact duplicate (whitespace-normalized sha256), near
duplicate (MinHash + LSH, `composer_rl.data.dedup`). Dedup runs over ALL splits together on
the files sorted by (repo, path), first copy kept: so no file in the held-out split has a
(near) copy in train. A repository is held out iff sha256(f"{seed}:{repo}") / 2**256 <
`heldout_fraction`, so the split is stable when the corpus grows.

Everything here is numpy + the standard library; `build_corpus` runs once over the file
list (documents are small) and its result is deterministic given the config.
"""
import dataclasses
import fnmatch
import hashlib
import json
import os
import sysconfig
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grain

from composer_rl.data import dedup
from composer_rl.data import secrets as secrets_lib
from composer_rl.progress import progress

# Extension -> language. Keep in sync with the languages a run asks for.
EXTENSIONS = {
    ".py": "python", ".pyi": "python",
    ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp",
    ".rs": "rust", ".go": "go", ".java": "java",
    ".js": "javascript", ".ts": "typescript",
    ".sh": "shell",
}

DROP_REASONS = ("language", "size", "utf8", "secret", "exact_dup", "near_dup")

# Directory names never walked (fnmatch patterns). Tests are excluded by default: in the
# stdlib, `test/` is about half the bytes and is dominated by regression scaffolding and
# deliberately malformed fixtures (bad encodings, syntax errors, data tables), and one such
# giant "repository" would dominate whichever split it lands in.
DEFAULT_EXCLUDE_DIRS = ("__pycache__", ".*", "*.dist-info", "*.egg-info", "test", "tests",
                        "idle_test", "site-packages", "dist-packages", "lib-dynload",
                        "node_modules")


@dataclasses.dataclass(frozen=True)
class Document:
  """One source file. repo: repository name (the held-out split unit); path: path inside
  the repository; language: from `EXTENSIONS`; text: the file's contents."""
  repo: str
  path: str
  language: str
  text: str


@dataclasses.dataclass(frozen=True)
class RawFile:
  """A file as a source yields it, before filtering. data: its bytes (UTF-8 not checked);
  origin: where it came from, for error messages ("shard.jsonl:12", a file path)."""
  repo: str
  path: str
  data: bytes
  origin: str


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  """How to build the corpus.

  languages: languages kept (values of `EXTENSIONS`).
  min_bytes / max_bytes: file size bounds in bytes, inclusive (tiny files teach nothing;
    huge ones are mostly generated tables).
  secret_detectors: registry names in `composer_rl.data.secrets` (None = all).
  near_dup_threshold, num_perm, bands, shingle: MinHash/LSH settings (`dedup.near_duplicates`).
  heldout_fraction: fraction of repositories held out; seed: the split's (and MinHash's) seed.
  exclude_dirs: directory-name patterns the `dirs` source does not enter.
  max_files: stop before the (max_files + 1)-th file of a kept language (None = all); for
    quick runs (counting only candidate files keeps the sample's size independent of how
    many data files, headers or docs a tree holds).
  """
  languages: Tuple[str, ...] = ("python",)
  min_bytes: int = 64
  max_bytes: int = 256 * 1024
  secret_detectors: Optional[Tuple[str, ...]] = None
  near_dup_threshold: float = 0.8
  num_perm: int = 128
  bands: int = 16
  shingle: int = 5
  heldout_fraction: float = 0.05
  seed: int = 0
  exclude_dirs: Tuple[str, ...] = DEFAULT_EXCLUDE_DIRS
  max_files: Optional[int] = None


@dataclasses.dataclass
class Corpus:
  """train / heldout: documents sorted by (repo, path); stats: see `build_corpus`."""
  train: List[Document]
  heldout: List[Document]
  stats: Dict[str, Any]

  def map_dataset(self, split: str) -> grain.MapDataset:
    """The documents of `split` ("train" or "heldout") as a grain.MapDataset."""
    if split not in ("train", "heldout"):
      raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return grain.MapDataset.source(getattr(self, split))


# ---------------------------------------------------------------------------- sources

Source = Callable[[Sequence[str], CorpusConfig], Iterator[RawFile]]
SOURCES: Dict[str, Source] = {}


def register_source(name: str) -> Callable[[Source], Source]:
  def deco(fn: Source) -> Source:
    SOURCES[name] = fn
    return fn
  return deco


@register_source("dirs")
def dir_tree_files(roots: Sequence[str], config: CorpusConfig) -> Iterator[RawFile]:
  """Every regular file under `roots` (sorted walk, symlinks skipped, `exclude_dirs` and
  directories that are themselves one of `roots` not entered)."""
  real_roots = {os.path.realpath(r) for r in roots}
  for root in roots:
    if not os.path.isdir(root):
      raise FileNotFoundError(f"corpus root {root!r} is not a directory")
    base = os.path.basename(os.path.normpath(root))
    for top, dirs, files in os.walk(root):
      dirs[:] = sorted(d for d in dirs if not _excluded(d, config.exclude_dirs)
                       and os.path.realpath(os.path.join(top, d)) not in real_roots
                       and not os.path.islink(os.path.join(top, d)))
      for f in sorted(files):
        full = os.path.join(top, f)
        if os.path.islink(full) or not os.path.isfile(full):
          continue
        rel = os.path.relpath(full, root)
        first = rel.split(os.sep)[0]
        repo = f"{base}/{first if os.sep in rel else os.path.splitext(first)[0]}"
        with open(full, "rb") as fh:
          yield RawFile(repo=repo, path=rel, data=fh.read(), origin=full)


def _excluded(name: str, patterns: Sequence[str]) -> bool:
  return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _parse_record(raw: Union[str, bytes], origin: str) -> RawFile:
  """A {"repo", "path", "text"} JSON object -> RawFile; errors name `origin`."""
  try:
    rec = json.loads(raw)
  except ValueError as e:
    raise ValueError(f"{origin}: not a JSON object: {e}") from None
  if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str)
                                          for k in ("repo", "path", "text")):
    raise ValueError(f"{origin}: a record needs string fields 'repo', 'path' and 'text'")
  # surrogatepass keeps lone surrogates (JSON can encode them) as bytes that are not valid
  # UTF-8, so the utf8 filter counts them instead of crashing here.
  return RawFile(repo=rec["repo"], path=rec["path"],
                 data=rec["text"].encode("utf-8", "surrogatepass"), origin=origin)


@register_source("jsonl")
def jsonl_files(paths: Sequence[str], config: CorpusConfig) -> Iterator[RawFile]:
  """Records of JSONL shards (blank lines skipped)."""
  del config
  for path in paths:
    with open(path, "rb") as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          yield _parse_record(line, f"{path}:{n}")


@register_source("array_record")
def array_record_files(paths: Sequence[str], config: CorpusConfig) -> Iterator[RawFile]:
  """Records of ArrayRecord shards (record i of shard p is named "p:i" in errors)."""
  del config
  from array_record.python import array_record_module  # grain's own dependency
  for path in paths:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"ArrayRecord shard {path!r} does not exist")
    reader = array_record_module.ArrayRecordReader(path)
    try:
      for i in range(reader.num_records()):
        yield _parse_record(reader.read([i])[0], f"{path}:{i}")
    finally:
      reader.close()


def write_jsonl(path: str, docs: Sequence[Document]) -> None:
  """Writes `docs` as a JSONL shard the `jsonl` source reads."""
  with open(path, "w") as f:
    for d in docs:
      f.write(json.dumps({"repo": d.repo, "path": d.path, "text": d.text}) + "\n")


def write_array_record(path: str, docs: Sequence[Document]) -> None:
  """Writes `docs` as an ArrayRecord shard the `array_record` source reads."""
  from array_record.python import array_record_module
  w = array_record_module.ArrayRecordWriter(path, "group_size:1")
  for d in docs:
    w.write(json.dumps({"repo": d.repo, "path": d.path, "text": d.text}).encode("utf-8"))
  w.close()


def stdlib_and_site_packages_roots() -> List[str]:
  """Real code present offline on every machine: the Python standard library directory
  (`sysconfig.get_paths()['stdlib']`, e.g. .../lib/python3.11) and site-packages
  (`purelib`), those that exist. With `DEFAULT_EXCLUDE_DIRS` the `dirs` source then reads
  every stdlib package and top-level module except `test/`, `idlelib/idle_test/`,
  `lib-dynload/` and `site-packages/` (its own root), and every installed package in
  site-packages except `*.dist-info`, test directories and `__pycache__`."""
  paths = sysconfig.get_paths()
  out = []
  for key in ("stdlib", "purelib"):
    p = paths.get(key)
    if p and os.path.isdir(p) and os.path.realpath(p) not in map(os.path.realpath, out):
      out.append(p)
  return out


# ---------------------------------------------------------------------------- build


def is_heldout(repo: str, fraction: float, seed: int) -> bool:
  """Whether `repo` is in the held-out split: a stable hash of (seed, repo) < fraction."""
  h = int.from_bytes(hashlib.sha256(f"{seed}:{repo}".encode("utf-8")).digest()[:8], "big")
  return h / 2.0 ** 64 < fraction


def build_corpus(sources: Sequence[Tuple[str, Sequence[str]]],
                 config: CorpusConfig = CorpusConfig()) -> Corpus:
  """Reads, filters, deduplicates and splits the corpus.

  Args:
    sources: (source name in `SOURCES`, paths) pairs, e.g.
      [("dirs", stdlib_and_site_packages_roots()), ("jsonl", ["a.jsonl"])].
    config: filters, dedup and split settings.

  Returns:
    A Corpus whose stats hold: files_seen, files_kept, dropped {reason: count} for every
    reason in DROP_REASONS, secret_hits {detector: count}, exact_dup_rate and
    near_dup_rate (duplicates / files reaching that stage), train/heldout files, repos
    and bytes.
  """
  bad = [k for k, _ in sources if k not in SOURCES]
  if bad:
    raise ValueError(f"unknown corpus sources {bad}; known: {sorted(SOURCES)}")
  langs = set(config.languages)
  unknown_langs = langs - set(EXTENSIONS.values())
  if unknown_langs:
    raise ValueError(f"unknown languages {sorted(unknown_langs)}; known: "
                     f"{sorted(set(EXTENSIONS.values()))}")
  dropped = {r: 0 for r in DROP_REASONS}
  secret_hits: Dict[str, int] = {}
  seen = 0
  docs: List[Document] = []
  candidates = 0
  bar = progress(config.max_files, "corpus", "files")  # files in the kept languages
  for raw in _all_files(sources, config):
    lang = EXTENSIONS.get(os.path.splitext(raw.path)[1].lower())
    if lang in langs and config.max_files is not None and candidates >= config.max_files:
      break
    seen += 1
    if lang not in langs:
      dropped["language"] += 1
      continue
    candidates += 1
    bar.update(1)
    if not config.min_bytes <= len(raw.data) <= config.max_bytes:
      dropped["size"] += 1
      continue
    try:
      text = raw.data.decode("utf-8")
    except UnicodeDecodeError:
      dropped["utf8"] += 1
      continue
    hit = secrets_lib.find_secret(text, config.secret_detectors)
    if hit is not None:
      dropped["secret"] += 1
      secret_hits[hit] = secret_hits.get(hit, 0) + 1
      continue
    docs.append(Document(repo=raw.repo, path=raw.path, language=lang, text=text))

  bar.close()
  # Sorting makes the kept copy of a duplicate independent of source order.
  docs.sort(key=lambda d: (d.repo, d.path))
  n_exact_in = len(docs)
  exact = dedup.exact_duplicates([d.text for d in docs])
  docs = [d for d, dup in zip(docs, exact) if not dup]
  dropped["exact_dup"] = n_exact_in - len(docs)
  n_near_in = len(docs)
  near = dedup.near_duplicates([d.text for d in docs], threshold=config.near_dup_threshold,
                               num_perm=config.num_perm, bands=config.bands,
                               shingle=config.shingle, seed=config.seed)
  docs = [d for d, dup in zip(docs, near) if not dup]
  dropped["near_dup"] = n_near_in - len(docs)

  train, heldout = [], []
  for d in docs:
    (heldout if is_heldout(d.repo, config.heldout_fraction, config.seed) else train).append(d)
  stats = dict(
      files_seen=seen, files_kept=len(docs), dropped=dropped, secret_hits=secret_hits,
      exact_dup_rate=round(dropped["exact_dup"] / max(n_exact_in, 1), 4),
      near_dup_rate=round(dropped["near_dup"] / max(n_near_in, 1), 4),
      train_files=len(train), heldout_files=len(heldout),
      train_repos=len({d.repo for d in train}), heldout_repos=len({d.repo for d in heldout}),
      train_bytes=sum(len(d.text.encode("utf-8")) for d in train),
      heldout_bytes=sum(len(d.text.encode("utf-8")) for d in heldout))
  return Corpus(train=train, heldout=heldout, stats=stats)


def _all_files(sources: Sequence[Tuple[str, Sequence[str]]],
               config: CorpusConfig) -> Iterator[RawFile]:
  for kind, paths in sources:
    if isinstance(paths, str):
      paths = [paths]  # one path given bare: not a sequence of characters
    yield from SOURCES[kind](paths, config)
