"""The tests' one compiled full forward of a model, the reference the parity and loss tests
read logits from."""

from __future__ import annotations

import jax
from flax import nnx


@nnx.jit
def logits(model, ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
    """model(ids, attention_mask=...) [B, T, V] as one compiled program: run eagerly, each op
    would be compiled and run by itself, unfused (slow at the suite's LLVM level 0)."""
    return model(ids, attention_mask=attention_mask)
