"""Secret detectors for the pretraining corpus: a file with any hit is dropped, never trained on.

A small registry of named detectors; each takes the file's text and returns True when it
finds something that looks like a live credential. `find_secret(text, names)` runs the
chosen detectors in order and returns the name of the first that fires (None = clean), so
the corpus builder can count drops per detector.

Detectors err on the side of dropping (a lost file costs nothing, a leaked key is permanent),
except for the placeholders providers document as examples (AWS's `...EXAMPLE` keys), which
appear in real SDK docstrings and are not secrets.

  private_key     a PEM "-----BEGIN ... PRIVATE KEY-----" header followed by a base64 body
  aws_access_key  AWS access key ids (AKIA/ASIA/... + 16 upper-case alphanumerics)
  github_token    GitHub personal/OAuth/app tokens (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)
  gitlab_token    GitLab personal access tokens (glpat-)
  slack_token     Slack tokens (xoxb-, xoxp-, ...) and incoming-webhook URLs
  generic_assignment  `<name ending in api_key|secret|secret_key|password|token|access_key>
                  = "<string>"` (also `: "..."` in dicts) whose value looks random: >= 20
                  characters, letters and digits, Shannon entropy >= 3.5 bits/char
"""
import math
import re
from collections import Counter
from typing import Callable, Dict, Optional, Sequence

Detector = Callable[[str], bool]
DETECTORS: Dict[str, Detector] = {}


def register(name: str) -> Callable[[Detector], Detector]:
  """Decorator: adds a detector to the registry under `name`."""
  def deco(fn: Detector) -> Detector:
    if name in DETECTORS:
      raise ValueError(f"secret detector {name!r} registered twice")
    DETECTORS[name] = fn
    return fn
  return deco


def shannon_entropy(s: str) -> float:
  """Bits per character of `s` under its own character frequencies (0 for '')."""
  if not s:
    return 0.0
  n = len(s)
  return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


# A header alone (e.g. a parser's constant) is not a key; a body of base64 right after it is.
_PEM = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]{0,200}?[A-Za-z0-9+/]{40,}")
_AWS = re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b")
_GITHUB = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})\b")
_GITLAB = re.compile(r"\bglpat-[A-Za-z0-9_\-]{20}\b")
_SLACK = re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}|https://hooks\.slack\.com/services/"
                    r"T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]+")
# The keyword must END the assigned name (`db_password`, `SECRET_KEY`, `auth_token_id`), so
# names that merely contain it (`tokenizer_class`, `TOKEN_TYPE_FIELD`) are not checked.
# Starting at the keyword (no leading [\w]* to backtrack over) is ~20x faster on real code.
_ASSIGN = re.compile(
    r"""(?i)(?:api[_\-]?key|secret(?:[_\-]?(?:access[_\-]?)?key)?|passw(?:or)?d|token|"""
    r"""access[_\-]?key)(?:[_\-]?id)?['"]?\s*[:=]\s*(['"])([^'"\s]{20,})\1""")

GENERIC_MIN_ENTROPY = 3.5  # bits/char; hex digests reach ~3.7-4, English words ~3-3.4


@register("private_key")
def private_key(text: str) -> bool:
  return "PRIVATE KEY-----" in text and _PEM.search(text) is not None


@register("aws_access_key")
def aws_access_key(text: str) -> bool:
  # AWS documents AKIAIOSFODNN7EXAMPLE-style placeholders; SDK docstrings quote them.
  return any(not m.group(0).endswith("EXAMPLE") for m in _AWS.finditer(text))


@register("github_token")
def github_token(text: str) -> bool:
  return _GITHUB.search(text) is not None


@register("gitlab_token")
def gitlab_token(text: str) -> bool:
  return _GITLAB.search(text) is not None


@register("slack_token")
def slack_token(text: str) -> bool:
  return _SLACK.search(text) is not None


def _looks_random(value: str) -> bool:
  """Credential-like: letters AND digits (CamelCase enum names and prose have no digits),
  high entropy, not a provider's documented placeholder (`...EXAMPLE...`) and not a
  markup placeholder such as a tokenizer's `<|reserved_special_token_0|>`."""
  return (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
          and "EXAMPLE" not in value and not (value[0] == "<" and value[-1] == ">")
          and shannon_entropy(value) >= GENERIC_MIN_ENTROPY)


@register("generic_assignment")
def generic_assignment(text: str) -> bool:
  return any(_looks_random(m.group(2)) for m in _ASSIGN.finditer(text))


def find_secret(text: str, names: Optional[Sequence[str]] = None) -> Optional[str]:
  """The name of the first detector (of `names`, default all, in order) that fires, or None.

  Args:
    text: the file's text.
    names: registry names of the detectors to run; unknown names raise ValueError.
  """
  names = list(DETECTORS) if names is None else list(names)
  unknown = [n for n in names if n not in DETECTORS]
  if unknown:
    raise ValueError(f"unknown secret detectors {unknown}; known: {sorted(DETECTORS)}")
  for n in names:
    if DETECTORS[n](text):
      return n
  return None
