"""The model: configuration, parameters and the one forward. Knows nothing of RL."""
from composer_rl.model.config import ModelConfig, PRESETS, get_preset
from composer_rl.model.kv_cache import KVCache
from composer_rl.model.transformer import (ForwardOutput, Transformer, inference_copy,
                                           load_balancing_loss)

__all__ = ["ModelConfig", "PRESETS", "get_preset", "KVCache", "ForwardOutput", "Transformer",
           "inference_copy", "load_balancing_loss"]
