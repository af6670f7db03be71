"""Qwen2 / Llama decoder in Flax NNX, its KV cache, and checkpoint loading."""

from starpo_jax.models.cache import KVCache
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.loading import load_pretrained

__all__ = ["Decoder", "KVCache", "ModelConfig", "load_pretrained"]
