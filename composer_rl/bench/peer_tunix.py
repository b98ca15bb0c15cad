"""Peer benchmark: generation speed of google-tunix's vanilla `Sampler` (tunix 0.1.7).

`make_tunix_generate(...)` builds tunix's own Qwen3 decoder (`tunix.models.qwen3.model.Qwen3`:
GQA, q/k RMSNorm, SwiGLU, RoPE; untied LM head; f32) with random weights, wraps it in
`tunix.generate.sampler.Sampler` and returns a zero-argument callable that runs one greedy
generation through the sampler's public `__call__` (jitted prefill, then its jitted
`lax.while_loop` decode over its own KV cache) and returns the number of generated tokens.
Nothing is downloaded: prompts are random token ids and the tokenizer is a stub.

What the timed call includes, all of it tunix's public path: tokenizing the prompts
(here: parsing decimal ids), one prefill that computes full-vocabulary logits for every
prompt position (tunix's Qwen3 has no `decode_only_last_token`), `new_tokens` decode steps
each attending over the whole cache and taking an argmax over the full vocabulary (the last
step's token falls outside the buffer and is dropped), then `device_get` of the token buffer
and per-row slicing/decoding on the host. The cache holds exactly `prompt_len + new_tokens`
positions (tunix requires `cache_size >= max_prompt_length + max_generation_steps` and
pads prompts to `max_prompt_length`, which is passed so that no power-of-2 rounding applies).

Install (optional; tunix is never imported at module import). The extra `peer` is
`google-tunix==0.1.7`. Installed with its dependencies it keeps jax/jaxlib/flax/numpy/
optax/orbax as they are but adds ~30 packages (tensorflow-datasets, datasets, pyarrow,
numba, kagglehub, qwix, ...) and downgrades the `hf` extra's stack (`safetensors<0.8`;
transformers 5.12, tokenizers 0.22, huggingface_hub 1.x). So install it with --no-deps,
plus what the sampler's import path needs (`import tunix` runs the package `__init__`,
which imports the trainers too):

  pip install --no-deps google-tunix==0.1.7 google-metrax==0.2.4 clu==0.0.12 \\
      jaxtyping==0.3.11 wadler_lindig==0.1.8 sentencepiece==0.2.3 perfetto==0.59.1 pandas==3.1.1

(on top of this project's own install: jax/jaxlib 0.10.2, flax 0.12.8, numpy, etils,
absl-py, grain, optax, orbax). `pip check` then lists tunix's unused requirements.
"""
from typing import Callable

import numpy as np


def available() -> bool:
  """Whether tunix's sampler and Qwen3 model import in this environment."""
  try:
    import tunix.generate.sampler  # noqa: F401  pylint: disable=import-outside-toplevel
    import tunix.models.qwen3.model  # noqa: F401  pylint: disable=import-outside-toplevel
  except Exception:  # pylint: disable=broad-except  (missing package or an API mismatch)
    return False
  return True


class _IdTokenizer:
  """The tokenizer interface tunix's `TokenizerAdapter` accepts (encode, decode, bos_id,
  eos_id, pad_id). A prompt is its token ids written as decimal text. No BOS is added; pad
  and EOS are `vocab_size`, an id the model can never emit, so every row decodes all
  `new_tokens` and no generated token is masked as padding. Prompts are never padded
  (all are `prompt_len` long), so the out-of-vocabulary pad id is never embedded."""

  def __init__(self, vocab_size: int):
    self._oov = vocab_size

  def encode(self, text: str) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return None

  def eos_id(self) -> int:
    return self._oov

  def pad_id(self) -> int:
    return self._oov


def _make_sampler_run(*, vocab_size, d_model, num_layers, num_heads, num_kv_heads, head_dim,
                      d_ff, batch, prompt_len, new_tokens, seed=0) -> Callable[[], np.ndarray]:
  """Like `make_tunix_generate`, but the callable returns the generated ids [batch, new_tokens]."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from tunix.generate import sampler as sampler_lib
  from tunix.models.qwen3 import model as qwen3_lib

  config = qwen3_lib.ModelConfig(
      num_layers=num_layers, vocab_size=vocab_size, embed_dim=d_model, hidden_dim=d_ff,
      num_heads=num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads,
      rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=False,
      shd_config=qwen3_lib.ShardingConfig.get_default_sharding(is_sampling=True),
      dtype=jnp.float32, param_dtype=jnp.float32)
  model = qwen3_lib.Qwen3(config, rngs=nnx.Rngs(seed))
  # tunix initialises the MLP kernels to zeros (they are meant to be loaded); make them random.
  key = jax.random.key(seed + 1)
  for layer in model.layers:
    for linear in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
      key, sub = jax.random.split(key)
      shape = linear.kernel.value.shape
      linear.kernel.value = jax.random.normal(sub, shape, jnp.float32) * shape[0] ** -0.5

  sampler = sampler_lib.Sampler(
      transformer=model, tokenizer=_IdTokenizer(vocab_size),
      cache_config=sampler_lib.CacheConfig(
          cache_size=prompt_len + new_tokens, num_layers=num_layers,
          num_kv_heads=num_kv_heads, head_dim=head_dim))
  ids = np.random.default_rng(seed).integers(0, vocab_size, (batch, prompt_len))
  prompts = [" ".join(map(str, row)) for row in ids]

  def run() -> np.ndarray:
    out = sampler(prompts, max_generation_steps=new_tokens, max_prompt_length=prompt_len,
                  echo=False, temperature=0.0)  # greedy: no top_p, no beam_size
    tokens = np.stack([np.asarray(t) for t in out.tokens])  # already on host (device_get)
    assert tokens.shape == (batch, new_tokens), tokens.shape
    return tokens

  return run


def make_tunix_generate(*, vocab_size, d_model, num_layers, num_heads, num_kv_heads, head_dim,
                        d_ff, batch, prompt_len, new_tokens, seed=0) -> Callable[[], int]:
  """A callable running one greedy tunix generation of `new_tokens` tokens for `batch`
  random prompts of `prompt_len` ids; it returns the number of generated tokens
  (batch * new_tokens). The first call compiles prefill and decode."""
  run = _make_sampler_run(
      vocab_size=vocab_size, d_model=d_model, num_layers=num_layers, num_heads=num_heads,
      num_kv_heads=num_kv_heads, head_dim=head_dim, d_ff=d_ff, batch=batch,
      prompt_len=prompt_len, new_tokens=new_tokens, seed=seed)
  return lambda: int(run().size)
