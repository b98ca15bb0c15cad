"""Inspects training checkpoints and published weight versions.

  python launch/inspect_checkpoint.py --path=WORKDIR/checkpoints          # parameter table
  python launch/inspect_checkpoint.py --path=WEIGHTS --version=12         # materialize v12
  python launch/inspect_checkpoint.py --path=A --diff=B [--diff_version=N]
  python launch/inspect_checkpoint.py --path=WEIGHTS --verify             # check the chain
Add --json for one JSON object on stdout instead of tables.
"""
import json
import sys

import composer_rl  # noqa: F401
from absl import app, flags

from composer_rl.sync import inspect

_PATH = flags.DEFINE_string("path", None, "Checkpoint dir or published weights root.")
_VERSION = flags.DEFINE_integer("version", None, "Weights version or training step.")
_DIFF = flags.DEFINE_string("diff", None, "Second checkpoint/weights root to compare with.")
_DIFF_VERSION = flags.DEFINE_integer("diff_version", None, "Version/step of --diff.")
_VERIFY = flags.DEFINE_bool("verify", False, "Verify every version of a weights root.")
_JSON = flags.DEFINE_bool("json", False, "Print JSON instead of tables.")


def main(argv):
  del argv
  if _VERIFY.value:
    rows = inspect.verify(_PATH.value)
    out = dict(path=_PATH.value, versions=rows, ok=all(r["ok"] for r in rows))
  else:
    tree = inspect.load(_PATH.value, _VERSION.value)
    if _DIFF.value:
      rows = inspect.diff(tree, inspect.load(_DIFF.value, _DIFF_VERSION.value))
    else:
      rows = inspect.describe(tree)
    out = dict(path=_PATH.value, rows=rows)
  if _JSON.value:
    print(json.dumps(out))
  else:
    print(inspect.table(out.get("versions", out.get("rows"))))
  if _VERIFY.value and not out["ok"]:
    sys.exit(1)


if __name__ == "__main__":
  flags.mark_flags_as_required(["path"])
  app.run(main)
