"""Session-wide fixtures: objects that are slow to build, made once for every test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_tok():
    """The embedded SmolLM2 tokenizer (also tiny-random's)."""
    from starpo_jax.text.testing import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def qwen_style_tok():
    """A Qwen2-style byte-level BPE trained on the grids and instructions of every registered
    env."""
    import envs_jax
    from starpo_jax.text.testing import qwen_style_tokenizer

    envs = [envs_jax.make(name) for name in envs_jax.names()]
    return qwen_style_tokenizer(
        tuple(e.symbol_strings for e in envs), tuple(e.instructions for e in envs)
    )
