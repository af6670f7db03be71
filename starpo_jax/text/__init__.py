"""The text boundary: host-built tables that let JAX code reason about decoded text."""

from starpo_jax.text.token_bytes import TokenBytes, token_byte_table
from starpo_jax.text.codec import Codec, build_codec, chat_pieces
from starpo_jax.text.parse import ParsedReply, answer_closed, reference_parse, stop_strings
from starpo_jax.text.templates import (
    PromptTemplate,
    default_template,
    env_intro,
    format_reward,
    render_conversation_text,
)

__all__ = [
    "TokenBytes",
    "token_byte_table",
    "Codec",
    "build_codec",
    "chat_pieces",
    "ParsedReply",
    "answer_closed",
    "reference_parse",
    "stop_strings",
    "PromptTemplate",
    "default_template",
    "env_intro",
    "format_reward",
    "render_conversation_text",
]
