"""Builds a run's rollout viewer: python launch/view.py --workdir=W [--serve --port=N]

Writes a self-contained static viewer (HTML/JS/CSS and data files, no network) to
W/viewer/ from W/rollouts/*.jsonl, W/demos_*.jsonl, W/metrics.jsonl and W/summary.json.
Re-running it on a run in progress updates only what changed. The page loads its data
with fetch, which browsers refuse over file://, so open it through --serve.
"""
import json

from absl import app, flags

from composer_rl.viewer import build, serve

_WORKDIR = flags.DEFINE_string("workdir", None, "the run's workdir (launch/train.py --workdir)")
_OUT = flags.DEFINE_string("out", "", "where to write the viewer (default: WORKDIR/viewer)")
_ADVANTAGE = flags.DEFINE_string("advantage", "grpo",
                                 "the run's rl.advantage (composer_rl.train.advantages)")
_SERVE = flags.DEFINE_bool("serve", False, "serve the viewer on 127.0.0.1 after building it")
_PORT = flags.DEFINE_integer("port", 8000, "port for --serve (0 = any free port)")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  stats = build.build(_WORKDIR.value, _OUT.value, advantage=_ADVANTAGE.value,
                      log=lambda s: print(s, flush=True))
  print(json.dumps(stats), flush=True)
  if _SERVE.value:
    serve.serve_forever(stats["out"], _PORT.value,
                        ready=lambda url: print(f"serving {stats['out']} at {url}", flush=True))


if __name__ == "__main__":
  app.run(main)
