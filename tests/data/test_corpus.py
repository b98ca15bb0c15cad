"""Corpus sources, filters, secret detectors, dedup and the by-repository held-out split."""
import json
import os

import numpy as np
import pytest

from composer_rl.data import corpus
from composer_rl.data import dedup
from composer_rl.data import secrets


def _code(seed: int, n_words: int = 600) -> str:
  """Distinct pseudo-code text (different seeds share few 5-word shingles)."""
  rng = np.random.default_rng(seed)
  vocab = [f"name{i}" for i in range(400)] + ["def", "return", "if", "for", "in", "x", "y"]
  words = rng.choice(vocab, n_words)
  return "\n".join(" ".join(words[i:i + 8]) for i in range(0, n_words, 8)) + "\n"


def _near_copy(text: str, seed: int, frac: float = 0.01) -> str:
  words = text.split(" ")
  rng = np.random.default_rng(seed)
  for i in rng.choice(len(words), max(1, int(len(words) * frac)), replace=False):
    words[i] = "changed"
  return " ".join(words)


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


@pytest.fixture
def tree(tmp_path):
  """A root with two package repos, a top-level module, and one file per drop reason."""
  root = str(tmp_path / "root")
  base = _code(1)
  _write(f"{root}/pkga/__init__.py", _code(2))
  _write(f"{root}/pkga/core.py", base)
  _write(f"{root}/pkga/README.txt", _code(3))                         # language
  _write(f"{root}/pkga/tiny.py", "x = 1\n")                           # size
  _write(f"{root}/pkga/latin1.py", _code(4).encode() + b"\xff\xfe")  # utf8
  _write(f"{root}/pkgb/keys.py", _code(5) + 'K = "AKIAZZZZ7QWERTYUIOPA"\n')  # secret
  _write(f"{root}/pkgb/copy.py", base.replace("\n", "\n\n  "))        # exact dup (whitespace)
  _write(f"{root}/pkgb/near.py", _near_copy(base, 0))                 # near dup
  _write(f"{root}/pkgb/own.py", _code(6))
  _write(f"{root}/mod.py", _code(7))
  _write(f"{root}/pkga/tests/test_core.py", _code(8))                 # excluded dir
  _write(f"{root}/pkga/__pycache__/core.cpython-311.pyc", b"\0\1")    # excluded dir
  return root


def test_dir_tree_filters_and_stats(tree):
  c = corpus.build_corpus([("dirs", [tree])], corpus.CorpusConfig(heldout_fraction=0.0))
  s = c.stats
  assert s["files_seen"] == 10  # tests/ and __pycache__/ are never entered
  assert s["dropped"] == dict(language=1, size=1, utf8=1, secret=1, exact_dup=1, near_dup=1)
  assert s["secret_hits"] == {"aws_access_key": 1}
  assert s["files_kept"] == 4 == len(c.train) and c.heldout == []
  got = {(d.repo, d.path) for d in c.train}
  assert got == {("root/pkga", "pkga/__init__.py"), ("root/pkga", "pkga/core.py"),
                 ("root/pkgb", "pkgb/own.py"), ("root/mod", "mod.py")}
  assert all(d.language == "python" for d in c.train)
  assert s["exact_dup_rate"] == round(1 / 6, 4) and s["near_dup_rate"] == round(1 / 5, 4)
  assert c.map_dataset("train")[0] == c.train[0]


def test_max_files_and_languages(tree):
  c = corpus.build_corpus([("dirs", tree)], corpus.CorpusConfig(max_files=3))
  # max_files counts files of the kept languages only (README.txt is seen but not counted).
  assert c.stats["files_seen"] - c.stats["dropped"]["language"] == 3
  assert c.stats["dropped"]["language"] == 1
  with pytest.raises(ValueError, match="unknown languages"):
    corpus.build_corpus([("dirs", tree)], corpus.CorpusConfig(languages=("cobol",)))
  with pytest.raises(ValueError, match="unknown corpus sources"):
    corpus.build_corpus([("nope", [tree])])


def test_jsonl_and_array_record_sources(tmp_path):
  docs = [corpus.Document(f"r{i}", f"f{i}.py", "python", _code(i)) for i in range(5)]
  jl, ar = str(tmp_path / "a.jsonl"), str(tmp_path / "a.array_record")
  corpus.write_jsonl(jl, docs)
  corpus.write_array_record(ar, docs)
  cfg = corpus.CorpusConfig(heldout_fraction=0.0)
  for kind, path in (("jsonl", jl), ("array_record", ar)):
    c = corpus.build_corpus([(kind, [path])], cfg)
    assert c.train == docs, kind
  # Both shards together: every file is an exact duplicate of its twin.
  c = corpus.build_corpus([("jsonl", [jl]), ("array_record", [ar])], cfg)
  assert c.train == docs and c.stats["dropped"]["exact_dup"] == 5


def test_jsonl_bad_input_names_file_and_line(tmp_path):
  p = tmp_path / "bad.jsonl"
  p.write_text(json.dumps({"repo": "r", "path": "a.py", "text": "x"}) + "\n\n{oops\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:3: not a JSON object"):
    corpus.build_corpus([("jsonl", [str(p)])])
  p.write_text(json.dumps({"repo": "r", "path": "a.py"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1: a record needs"):
    corpus.build_corpus([("jsonl", [str(p)])])


def test_jsonl_lone_surrogate_is_a_utf8_drop(tmp_path):
  p = tmp_path / "s.jsonl"
  p.write_text('{"repo": "r", "path": "a.py", "text": "' + "x = 1  # pad " * 8 + '\\ud800"}\n')
  c = corpus.build_corpus([("jsonl", [str(p)])])
  assert c.stats["dropped"]["utf8"] == 1 and c.stats["files_kept"] == 0


def test_heldout_split_is_by_repository(tmp_path):
  docs = [corpus.Document(f"repo{r}", f"f{i}.py", "python", _code(1000 * r + i))
          for r in range(60) for i in range(3)]
  p = str(tmp_path / "many.jsonl")
  corpus.write_jsonl(p, docs)
  cfg = corpus.CorpusConfig(heldout_fraction=0.25, seed=3)
  c = corpus.build_corpus([("jsonl", [p])], cfg)
  train_repos, held_repos = {d.repo for d in c.train}, {d.repo for d in c.heldout}
  assert held_repos and train_repos and not train_repos & held_repos
  assert len(c.train) + len(c.heldout) == len(docs)
  assert all(corpus.is_heldout(d.repo, 0.25, 3) for d in c.heldout)
  assert 5 <= len(held_repos) <= 25  # ~15 of 60 expected
  # Deterministic, and the seed picks a different split.
  again = corpus.build_corpus([("jsonl", [p])], cfg)
  assert again.heldout == c.heldout and again.train == c.train
  other = corpus.build_corpus([("jsonl", [p])], corpus.CorpusConfig(heldout_fraction=0.25, seed=4))
  assert {d.repo for d in other.heldout} != held_repos


def test_stdlib_and_site_packages_roots():
  import sysconfig
  roots = corpus.stdlib_and_site_packages_roots()
  assert roots[0] == sysconfig.get_paths()["stdlib"] and all(os.path.isdir(r) for r in roots)
  c = corpus.build_corpus([("dirs", roots)], corpus.CorpusConfig(max_files=200))
  assert c.stats["files_kept"] > 0 and c.train


@pytest.mark.parametrize("name,text", [
    ("private_key", "K = '''-----BEGIN RSA PRIVATE KEY-----\n" + "MIIEow" + "A" * 60 + "\n'''"),
    ("aws_access_key", "key = 'AKIAZZZZ7QWERTYUIOPA'"),
    ("github_token", "t = 'ghp_" + "aB3" * 12 + "'"),
    ("gitlab_token", "t = 'glpat-" + "x1Y2z3W4v5U6t7S8r9Q0" + "'"),
    ("slack_token", "SLACK = 'xoxb-123456789012-abcdefABCDEF'"),
    ("generic_assignment", 'api_key = "q8Zr2LmX0vT7pW4nK9sB3dF6"'),
    ("generic_assignment", '"password": "Tr0ub4dor&3xYz!9QpLm2#"'),
    ("generic_assignment", 'SECRET_KEY = "django-insecure-8f$k2!x9q@z7w#m3p"'),
])
def test_secret_detectors_fire(name, text):
  assert secrets.find_secret(text) == name


@pytest.mark.parametrize("text", [
    'HEADER = "-----BEGIN RSA PRIVATE KEY-----"\nparse(HEADER)',  # header constant, no body
    "key = 'AKIAIOSFODNN7EXAMPLE'",  # AWS's documented placeholder
    'password = "please_change_this_password"',  # low entropy, one class
    'secret = "short1"',
    "token = get_token()",
    'TOKEN = "ReportingEndpointNotToken"',  # CamelCase enum value: no digits
    'tokenizer_class = "PocketTTSAudioTokenizerModel2"',  # name does not end in a keyword
    'SecretAccessKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"',  # AWS placeholder
    'pad_token = "<|reserved_special_token_0|>"',  # a tokenizer's special token
])
def test_secret_detectors_ignore_benign(text):
  assert secrets.find_secret(text) is None


def test_secret_registry_names():
  assert secrets.find_secret("key = 'AKIAZZZZ7QWERTYUIOPA'", ["github_token"]) is None
  with pytest.raises(ValueError, match="unknown secret detectors"):
    secrets.find_secret("x", ["nope"])


def test_near_duplicates():
  a, b, c = _code(1, 2000), _code(2, 2000), _code(3, 2000)
  near = _near_copy(a, 5)
  assert dedup.near_duplicates([a, b, near, c, a]) == [False, False, True, False, True]
  # Signatures are stable (no salted hash): same seed, same bits.
  np.testing.assert_array_equal(dedup.MinHasher(seed=1).signature(a),
                                dedup.MinHasher(seed=1).signature(a))
  sa, sn = dedup.MinHasher().signature(a), dedup.MinHasher().signature(near)
  assert np.mean(sa == sn) > 0.8
  p = dedup.candidate_probability
  assert p(0.8, 16, 8) > 0.9 > 0.1 > p(0.5, 16, 8)


def test_exact_duplicates_ignore_whitespace():
  assert dedup.exact_duplicates(["a b\n", "a   b", "a c"]) == [False, True, False]
