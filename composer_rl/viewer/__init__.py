"""composer_rl.viewer: a static, self-contained viewer of a run's rollouts and metrics.

    python launch/view.py --workdir=W [--serve --port=N]

`build.build(workdir)` writes `W/viewer/` (HTML/JS/CSS from `assets/`, plus `data/`):

  data/index.json          the run overview: metrics curves, per-step summaries, sources
  data/sessions.json       one summary row per session (columns), for search and filters
  data/shards/<src>.<k>.json  full sessions (transcript, tool calls, diff, grading,
                           tokens), loaded lazily by the page when a session is opened
  data/rows/<src>.json     a source's rows (what sessions.json is concatenated from)
  data/manifest.json       size/mtime of each processed record file: a re-run only
                           re-processes files that changed (a run in progress)

Modules: sources (which record files a run has and what each means), session (one record
-> its viewer JSON, tool calls parsed by the harness's own parser), run_info (metrics,
summary, TensorBoard dir), build (incremental build), serve (a local static server).
Nothing imports this package; it imports env/rollout/data and, for advantages, train.
"""
