"""KVCache: preallocated per-layer keys and values with a per-row write pointer.

A call of the decoder with a cache writes the T new tokens of row b into slots
end[b] .. end[b]+T-1, lets each new token attend to slots < end[b] plus the new tokens causally,
and returns the cache with end += the number of real new tokens (attention_mask.sum(-1)). Real
tokens of a block must be a prefix of it (right padding), so padded slots are overwritten by the
next call. Writes past the last slot are dropped (the caller sizes `max_len`).

A bfloat16 cache is stored as its uint16 bit patterns (the layers convert on write and read):
XLA's CPU backend has no bfloat16 scatter and would convert the WHOLE cache to float32 and back
around every write (5 GB of temporaries for SmolLM2 at B = 128, L = 1732), and a bitcast around
a bfloat16 cache inside the loops costs a copy of it.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from starpo_jax.models.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """k, v: [num_layers, B, num_kv_heads, S, head_dim]; end: [B] int32 filled-slot count.

    Heads ahead of slots: attention reads each (row, head) as one [S, head_dim] matrix, with no
    transpose of the cache (see layers.attention)."""

    k: jax.Array
    v: jax.Array
    end: jax.Array

    @classmethod
    def init(
        cls,
        config: ModelConfig,
        batch_size: int,
        max_len: int,
        dtype: jnp.dtype | str | None = None,
    ) -> KVCache:
        """An empty cache of `max_len` slots per row, in `dtype` (default: the compute dtype;
        bfloat16 is stored as uint16 bit patterns, see the module docstring). A model that
        computes in bfloat16 gets a bfloat16 cache whatever `dtype` says: its keys and values
        have no more bits to keep, and a wider cache would be narrowed for every attention
        product."""
        for name, value in (("batch_size", batch_size), ("max_len", max_len)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"KVCache.init: {name} must be a positive int; got {value!r}")
        shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
        dtype = jnp.dtype(dtype or config.dtype)
        if config.compute_dtype == jnp.bfloat16:
            dtype = jnp.dtype(jnp.bfloat16)
        if dtype == jnp.bfloat16:
            dtype = jnp.dtype(jnp.uint16)  # bfloat16 0.0 is the bit pattern 0
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            end=jnp.zeros((batch_size,), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]
