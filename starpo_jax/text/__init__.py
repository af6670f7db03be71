"""The text boundary: host-built tables that let JAX code reason about decoded text."""

from starpo_jax.text.token_bytes import TokenBytes, token_byte_table

__all__ = ["TokenBytes", "token_byte_table"]
