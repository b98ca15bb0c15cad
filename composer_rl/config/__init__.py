"""Typed experiment configs: the schema machinery (`schema`), no JAX."""
from composer_rl.config.schema import ConfigError, Dataclass, Field, Free, Section, describe, validate
