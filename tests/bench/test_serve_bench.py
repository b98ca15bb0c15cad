"""composer_rl.bench.serve at a tiny size: both paths produce the same seeded completions
(the benchmark checks it) and every reported number is there and positive."""
from composer_rl.bench import serve


def test_serve_benchmark_reports_both_paths():
  out = serve.main(["--requests=4", "--clients=1,2", "--max_tokens=8"])
  assert set(out["levels"]) == {"1", "2"}
  for level in out["levels"].values():
    for path in ("direct", "server"):
      r = level[path]
      assert r["output_tokens"] > 0
      assert r["requests_per_s"] > 0 and r["output_tokens_per_s"] > 0
      assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
    assert level["direct"]["output_tokens"] == level["server"]["output_tokens"]
    assert level["server_over_direct"] > 0
