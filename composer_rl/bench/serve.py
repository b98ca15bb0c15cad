"""Serving benchmark: the OpenAI-compatible server on loopback vs the engine driven directly.

For each number of concurrent clients (1, 8, 32 by default) the same requests (same
prompts, same seeds, so the same completions token for token: the engine is exact) run
twice in one process:
  direct  threads submit to the `Generator` (continuous batching over the engine) in-process;
  server  threads of a separate client process use the official `openai` client against
          the server (streaming, so the time to the first token is what a client sees;
          every completion recorded durably). The clients' own work (HTTP, SSE parsing)
          runs in their process, as a real client's would, on the same 2 cores.
It prints one JSON object: per level and path, requests/s, time to first token p50/p99,
output tokens/s, and `server_over_direct` (server output tokens/s / direct's: 1.0 = no
overhead).

  python -m composer_rl.bench.serve [--config=experiments/serve_tiny.py] [--requests=64]
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

from composer_rl.serving import loading
from composer_rl.serving.generator import SamplingParams
from composer_rl.serving.settings import ServeSettings
from composer_rl.serving.threaded import ThreadedServer

PROMPT = "Which function does this code define?\ndef count_rows(a, b):\n    return a * b + {}"


def _load_config(path: str):
  sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
  module = __import__(os.path.splitext(os.path.basename(path))[0])
  return module.get_config()


def _summary(ttft: List[float], tokens: int, requests: int, seconds: float) -> Dict:
  return dict(requests_per_s=requests / seconds, output_tokens_per_s=tokens / seconds,
              ttft_p50_ms=1e3 * float(np.percentile(ttft, 50)),
              ttft_p99_ms=1e3 * float(np.percentile(ttft, 99)), output_tokens=tokens,
              seconds=seconds)


def direct(service, clients: int, requests: int, max_tokens: int) -> Dict:
  """Each client thread renders its chat prompt and waits on the generator."""
  def one(i):
    ids = service.template.render([{"role": "user", "content": PROMPT.format(i)}])
    c = service.generator.submit(ids, SamplingParams(max_tokens=max_tokens, seed=i)).result()[0]
    return c.timings["ttft_s"], len(c.token_ids)
  t0 = time.perf_counter()
  with cf.ThreadPoolExecutor(clients) as pool:
    out = list(pool.map(one, range(requests)))
  return _summary([a for a, _ in out], sum(b for _, b in out), requests,
                  time.perf_counter() - t0)


def served(base_url: str, model: str, clients: int, requests: int, max_tokens: int) -> Dict:
  """Each client thread streams a chat completion with the openai client."""
  import openai  # pylint: disable=g-import-not-at-top
  client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)

  def one(i):
    t0 = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT.format(i)}],
        max_tokens=max_tokens, seed=i, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
      # The first chunk carrying generated text (the role-only chunk comes before any
      # token is sampled, so it would understate the time to first token).
      if first is None and any(c.delta.content or c.finish_reason for c in chunk.choices):
        first = time.perf_counter() - t0
      if chunk.usage is not None:
        tokens = chunk.usage.completion_tokens
    return first, tokens
  t0 = time.perf_counter()
  with cf.ThreadPoolExecutor(clients) as pool:
    out = list(pool.map(one, range(requests)))
  return _summary([a for a, _ in out], sum(b for _, b in out), requests,
                  time.perf_counter() - t0)


def served_from_process(base_url: str, model: str, clients: int, requests: int,
                        max_tokens: int) -> Dict:
  """`served` run by a client process of its own (this module with --client_of)."""
  out = subprocess.run(
      [sys.executable, "-m", "composer_rl.bench.serve", f"--client_of={base_url}",
       f"--model={model}", f"--clients={clients}", f"--requests={requests}",
       f"--max_tokens={max_tokens}"], check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> Dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--client_of", default="", help=argparse.SUPPRESS)  # the client process
  p.add_argument("--model", default="", help=argparse.SUPPRESS)
  p.add_argument("--config", default=os.path.join(
      os.path.dirname(__file__), "..", "..", "experiments", "serve_tiny.py"))
  p.add_argument("--clients", default="1,8,32")
  p.add_argument("--requests", type=int, default=64, help="requests per level and path")
  p.add_argument("--max_tokens", type=int, default=32)
  a = p.parse_args(argv)
  if a.client_of:
    out = served(a.client_of, a.model, int(a.clients), a.requests, a.max_tokens)
    print(json.dumps(out), flush=True)
    return out
  config = _load_config(a.config)
  with tempfile.TemporaryDirectory() as tmp:
    settings = ServeSettings.from_config(config, "bench")
    settings.rate_limit_per_minute = 0  # one benchmark client on loopback: measure, not limit
    service = loading.build_service(config, records_dir=os.path.join(tmp, "records"),
                                    settings=settings)
    server = ThreadedServer(service)
    try:
      direct(service, 2, 4, a.max_tokens)  # compile every program once before timing
      served_from_process(server.base_url, service.model_name, 2, 4, a.max_tokens)
      levels = {}
      for c in (int(x) for x in a.clients.split(",")):
        d = direct(service, c, a.requests, a.max_tokens)
        s = served_from_process(server.base_url, service.model_name, c, a.requests,
                                a.max_tokens)
        if d["output_tokens"] != s["output_tokens"]:  # the same seeded completions
          raise AssertionError(f"{c} clients: direct produced {d['output_tokens']} tokens, "
                               f"the server {s['output_tokens']}")
        levels[str(c)] = dict(direct=d, server=s, server_over_direct=(
            s["output_tokens_per_s"] / d["output_tokens_per_s"]))
    finally:
      server.stop()
      service.close()
  out = dict(config=os.path.basename(a.config), slots=service.settings.slots,
             requests=a.requests, max_tokens=a.max_tokens, levels=levels)
  print(json.dumps(out), flush=True)
  return out


if __name__ == "__main__":
  main()
