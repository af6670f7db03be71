"""Decoder: the Qwen2 / Llama causal language model (and optional scalar value head) in Flax NNX.

Pass parameters into compiled code rather than closing over them:

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, input_ids, attention_mask):
        return nnx.merge(graphdef, state)(input_ids, attention_mask=attention_mask)
"""

from __future__ import annotations

import contextlib
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from starpo_jax.models.cache import KVCache
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.layers import LayerStack, logical_param, rms_norm, rope_tables


def _check_inputs(
    input_ids: jax.Array,
    positions: jax.Array | None,
    attention_mask: jax.Array | None,
    cache: KVCache | None,
) -> None:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T]; got shape {input_ids.shape}")
    for name, x in (("positions", positions), ("attention_mask", attention_mask)):
        if x is not None and x.shape != input_ids.shape:
            raise ValueError(
                f"{name} must have the shape of input_ids {input_ids.shape}; got {x.shape}"
            )
    if cache is not None and cache.batch_size != input_ids.shape[0]:
        raise ValueError(
            f"cache batch size {cache.batch_size} != input_ids batch size {input_ids.shape[0]}"
        )


def matmul_precision(config: ModelConfig) -> contextlib.AbstractContextManager:
    """The context a model's matmuls are traced in: jax.default_matmul_precision of
    config.matmul_precision (read when each dot is traced, so the backward's transposed dots
    keep it), or no change when it is None."""
    if config.matmul_precision is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(config.matmul_precision)


def init_value_head(config: ModelConfig, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A fresh value head [D] (normal, std initializer_range) and bias [] (zero), float32
    whatever param_dtype: a single vector, and value targets are fine-grained."""
    head = config.initializer_range * jax.random.normal(key, (config.hidden_size,), jnp.float32)
    return head, jnp.zeros((), jnp.float32)


class Decoder(nnx.Module):
    """Token ids -> next-token logits (and values when built with `value_head=True`).

    Inputs everywhere: input_ids [B, T] int32; positions [B, T] int32 (rotary positions);
    attention_mask [B, T] bool, True for real tokens; cache: a `KVCache` (see cache.py for the
    write/attend semantics). Without a cache the mask may pad on either side; with a cache the
    real tokens of each row must be a prefix (right padding).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, value_head: bool = False):
        self.config = config
        std, dtype = config.initializer_range, config.weight_dtype
        d = config.hidden_size
        self.embed = logical_param(
            std * jax.random.normal(rngs.params(), (config.vocab_size, d), dtype),
            ("vocab", "embed"),
        )
        self.layers = LayerStack(config, rngs=rngs)
        self.final_norm = logical_param(jnp.ones((d,), dtype), ("embed",))
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else logical_param(
                std * jax.random.normal(rngs.params(), (d, config.vocab_size), dtype),
                ("embed", "vocab"),
            )
        )
        if value_head:
            head, bias = init_value_head(config, rngs.params())
            self.value_head = logical_param(head, ("embed",))
            self.value_bias = logical_param(bias, ())
        else:
            self.value_head = self.value_bias = None

    def hidden_states(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        cache: KVCache | None = None,
        attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """Final-normed hidden states [B, T, D] (compute dtype), and the new cache when given.

        attend (with positions, no mask or cache): the attention of every layer, replacing the
        causal one (see LayerStack; the shared-prefix forward, train/shared_prefix.py)."""
        with matmul_precision(self.config):
            return self._hidden_states(input_ids, positions, attention_mask, cache, attend)

    def _hidden_states(self, input_ids, positions, attention_mask, cache, attend):
        _check_inputs(input_ids, positions, attention_mask, cache)
        cfg = self.config
        b, t = input_ids.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        steps = jnp.arange(t, dtype=jnp.int32)
        if attend is not None:
            if positions is None or attention_mask is not None or cache is not None:
                raise ValueError("attend needs positions, and no attention_mask or cache")
            visible = kv = None
        elif cache is None:
            if positions is None:
                positions = jnp.maximum(jnp.cumsum(mask, axis=-1, dtype=jnp.int32) - 1, 0)
            visible = (steps[None, :, None] >= steps[None, None, :]) & mask[:, None, :]
            kv = None
        else:
            slots = cache.end[:, None] + steps  # [B, T]
            if positions is None:
                positions = slots
            filled = cache.end + mask.sum(-1, dtype=jnp.int32)  # [B]
            keys = jnp.arange(cache.max_len, dtype=jnp.int32)
            visible = (keys[None, None, :] <= slots[:, :, None]) & (
                keys[None, None, :] < filled[:, None, None]
            )
            kv = (cache.k, cache.v, slots)

        h = jnp.take(self.embed[...], input_ids, axis=0).astype(cfg.compute_dtype)
        cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        h, new_kv = self.layers(h, cos, sin, visible, kv, attend)
        h = rms_norm(h, self.final_norm[...], cfg.rms_norm_eps)
        if cache is None:
            return h
        return h, KVCache(k=new_kv[0], v=new_kv[1], end=filled)

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """LM head: hidden [..., D] -> logits [..., V] float32 (float32 accumulation)."""
        with matmul_precision(self.config):
            if self.lm_head is None:
                w = self.embed[...].astype(hidden.dtype)
                return jnp.einsum("...d,vd->...v", hidden, w, preferred_element_type=jnp.float32)
            w = self.lm_head[...].astype(hidden.dtype)
            return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)

    def __call__(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> jax.Array | tuple[jax.Array, KVCache]:
        """Logits [B, T, V] float32, or (logits, new_cache) when a cache is given."""
        out = self.hidden_states(input_ids, positions, attention_mask, cache)
        if cache is None:
            return self.logits_from_hidden(out)
        return self.logits_from_hidden(out[0]), out[1]

    def value(
        self,
        input_ids: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
    ) -> jax.Array:
        """Scalar value per token [B, T] float32 (critic); needs `value_head=True`."""
        if self.value_head is None:  # before the trunk runs
            raise ValueError("this Decoder has no value head; build it with value_head=True")
        return self.value_from_hidden(self.hidden_states(input_ids, positions, attention_mask))

    def value_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Value head: hidden [..., D] -> values [...] float32; needs `value_head=True`."""
        if self.value_head is None:
            raise ValueError("this Decoder has no value head; build it with value_head=True")
        with matmul_precision(self.config):
            return hidden.astype(jnp.float32) @ self.value_head[...] + self.value_bias[...]
