"""The one-way import rules (BUILD_NOTES, the architecture map), read from the source.

Every `import` and `from ... import` in a package's files counts, including those inside
functions: a lazy import is still a dependency.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "composer_rl"
JAX_STACK = ("jax", "jaxlib", "flax", "optax", "orbax", "grain")
PACKAGES = ("bench", "cluster", "config", "controller", "data", "env", "model", "online", "ops",
            "parity", "rollout", "sampling", "serving", "sync", "train", "viewer")
ABOVE_MODEL = ("env", "data", "rollout", "train", "sync", "controller", "online", "serving",
               "parity", "bench", "cluster", "viewer")

# package -> what it must not import (composer_rl packages, or third-party top-level names).
FORBIDDEN = {
    "ops": tuple(p for p in PACKAGES if p != "ops"),
    "config": tuple(p for p in PACKAGES if p != "config") + JAX_STACK,
    "model": ABOVE_MODEL + ("sampling",),
    "sampling": ("env", "data", "rollout", "train", "sync", "controller", "online", "serving",
                 "parity", "bench", "cluster", "viewer"),
    "env": tuple(p for p in PACKAGES if p != "env") + JAX_STACK,
    "train": ("controller", "online", "serving", "rollout", "env", "bench", "cluster",
              "viewer"),
    "sync": ("controller", "online", "serving", "rollout", "env", "train", "bench",
             "cluster", "viewer"),
    "rollout": ("controller", "online", "serving", "train", "bench", "cluster", "viewer"),
}


def imports_of(source: str):
  """(composer_rl packages, third-party top-level modules) a module's source imports."""
  ours, theirs = set(), set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names = [node.module]
    else:
      continue
    for name in names:
      parts = name.split(".")
      if parts[0] == "composer_rl":
        if len(parts) > 1:
          ours.add(parts[1])
      else:
        theirs.add(parts[0])
  return ours, theirs


def violations(package: str, files) -> list:
  bad = []
  for path, source in files:
    ours, theirs = imports_of(source)
    for name in sorted((ours | theirs) & set(FORBIDDEN.get(package, ()))):
      bad.append(f"{path}: {package}/ imports {name}")
  return bad


def _package_files(package: str):
  for path in sorted((ROOT / package).rglob("*.py")):
    if "data" in path.relative_to(ROOT / package).parts[:-1] and package == "env":
      continue  # vendored task repositories (env/data/*), not our code
    yield str(path.relative_to(ROOT.parent)), path.read_text()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_run_one_way(package):
  assert (ROOT / package).is_dir(), package
  assert violations(package, _package_files(package)) == []


def test_the_rules_catch_a_violation():
  src = "import os\nfrom composer_rl.controller import agent_rl\ndef f():\n  import jax.numpy\n"
  assert violations("env", [("x.py", src)]) == ["x.py: env/ imports controller",
                                                "x.py: env/ imports jax"]
  assert violations("model", [("x.py", src)]) == ["x.py: model/ imports controller"]
  assert violations("bench", [("x.py", src)]) == []
