"""A tiny byte-level model behind the OpenAI-compatible server (seconds to start on a CPU).

Run (a freshly initialized model, so it can be tried at once; it writes random bytes):
  python launch/serve.py --config=experiments/serve_tiny.py
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \
      -d '{"model": "serve_tiny", "messages": [{"role": "user", "content": "hi"}]}'
With trained weights: --checkpoint=WORKDIR/checkpoints (an Orbax train checkpoint of the
same model shape), and/or --weights_dir=SHARED/weights to follow published versions.
The server's settings are the `serve` section (defaults in composer_rl.serving.service).
"""
import ml_collections


def get_config(variant: str = "default") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # The shape of experiments/tiny_bugfix.py:smoke (vocab = the byte tokenizer's 264).
  c.model = ml_collections.ConfigDict(dict(
      d_model=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8, d_ff=64,
      max_seq_len=256, row_tile=16, compute_dtype="float32"))
  c.serve = ml_collections.ConfigDict(dict(
      model_name="serve_tiny",
      slots=4,                   # concurrent decode slots
      prefill_chunk=32,          # prompt tokens per prefill call
      top_logprobs=5,            # alternatives the engine computes per token (API max 20)
      max_waiting=64,            # completions queued for a slot before 429
      default_max_tokens=64,     # when a request gives no max_tokens
      max_n=8,
      max_body_bytes=1 << 20,
      rate_limit_per_minute=600,  # per API key (token bucket); 0 = off
      rate_limit_burst=120,
      system_prompt="",
      records_dir="",            # '' = --records_dir, else <workdir>/records
      record_file_bytes=8 << 20,
      poll_s=1.0))               # weight follower's poll interval (--weights_dir)
  if variant != "default":
    raise ValueError(f"unknown variant {variant!r}; only 'default'")
  return c
