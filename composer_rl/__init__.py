"""composer_rl: RL post-training of LLM coding agents in JAX.

Importing the package configures XLA's numerics flags (see `composer_rl.ops.xla_flags`)
before any JAX backend exists, so that sampler and trainer logprobs agree bit for bit.
Import `composer_rl` before running any JAX computation.
"""
from composer_rl.ops import xla_flags as _xla_flags

_xla_flags.configure()

__version__ = "0.1.0"
