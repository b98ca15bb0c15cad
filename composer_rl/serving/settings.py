"""`ServeSettings`: what the server serves and its limits (the config's `serve` section)."""
import dataclasses


@dataclasses.dataclass
class ServeSettings:
  """`config.serve` (every field optional there; these are the defaults).

  model_name: the id clients pass as `model` ('' = the config file's stem).
  slots / prefill_chunk: the engine's decode slots and prompt tokens per prefill call.
  top_logprobs: alternatives the engine computes for every token (the API allows <= 20).
  max_waiting: completions that may wait for a slot before requests get 429.
  default_max_tokens: completion budget of a request without max_tokens (capped to the
    room the context leaves).
  max_n / max_prompts: choices per request / prompts per /v1/completions request.
  max_body_bytes: request bodies above this get 413.
  rate_limit_per_minute / rate_limit_burst: token bucket per API key (per client address
    without keys); 0 = no limit; burst 0 = one minute's worth.
  system_prompt: the system message of a chat request that has none.
  records_dir: where records go ('' = the --records_dir flag, else <workdir>/records).
  record_file_bytes: a record file is closed and a new one started past this size.
  poll_s: how often the weight follower looks for a new version.
  warmup: compile the engine's programs before accepting requests.
  graceful_shutdown_s: on SIGTERM, how long in-flight requests may take to finish.
  """
  model_name: str = ""
  slots: int = 8
  prefill_chunk: int = 64
  top_logprobs: int = 20
  max_waiting: int = 256
  default_max_tokens: int = 512
  max_n: int = 8
  max_prompts: int = 16
  max_body_bytes: int = 4 << 20
  rate_limit_per_minute: float = 600.0
  rate_limit_burst: float = 0.0
  system_prompt: str = ""
  records_dir: str = ""
  record_file_bytes: int = 64 << 20
  poll_s: float = 2.0
  warmup: bool = True
  graceful_shutdown_s: float = 60.0

  @classmethod
  def from_config(cls, config, default_name: str = "") -> "ServeSettings":
    section = dict(config.get("serve", None) or {}) if hasattr(config, "get") else {}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(section) - known)
    if unknown:
      raise ValueError(f"config.serve: unknown field(s) {unknown}; known: {sorted(known)}")
    s = cls(**section)
    if not s.model_name:
      s.model_name = default_name or "composer_rl"
    env = config.get("env", None) if hasattr(config, "get") else None
    if not s.system_prompt and env is not None and env.get("system_prompt", ""):
      s.system_prompt = str(env.get("system_prompt"))  # served sessions look like training's
    s.validate()
    return s

  def validate(self) -> None:
    for name in ("slots", "prefill_chunk", "max_waiting", "default_max_tokens", "max_n",
                 "max_prompts", "max_body_bytes", "record_file_bytes"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"config.serve.{name} must be >= 1, got {getattr(self, name)}")
    if not 0 <= self.top_logprobs <= 20:
      raise ValueError(f"config.serve.top_logprobs must be in [0, 20], got {self.top_logprobs}")
    if self.rate_limit_per_minute < 0 or self.rate_limit_burst < 0:
      raise ValueError("config.serve.rate_limit_* must be >= 0")
    if self.poll_s <= 0:
      raise ValueError(f"config.serve.poll_s must be > 0, got {self.poll_s}")
