"""load_pretrained: one entry point from a model name or path to (Decoder, tokenizer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# The model names a config may give (run_config checks them without JAX).
from starpo_jax.config import EMBEDDED_NAME, TINY_RANDOM_NAME  # noqa: F401
from starpo_jax.models.decoder import Decoder


def load_pretrained(
    source: str | os.PathLike, dtype: str = "float32", *, value_head: bool = False
) -> tuple[Decoder, Any]:
    """Loads a model and its tokenizer; `dtype` sets both compute and parameter dtype.

    value_head=True adds the scalar value head of a critic (freshly initialised unless the
    checkpoint has one; see `model_from_hf_tensors`).

    source: a local Hugging Face directory (config.json + safetensors; tokenizer via transformers'
    AutoTokenizer from the same directory), a path ending in ".gguf", the name
    "smollm2-135m-instruct" (the embedded GGUF) or "tiny-random" (a tiny random model with the
    SmolLM2 tokenizer). Raises FileNotFoundError / ValueError naming the source otherwise.
    """
    path = Path(source)
    if path.is_dir():
        # transformers is imported only here: it is slow to import and only this branch needs it.
        from transformers import AutoTokenizer

        from starpo_jax.models.params import load_hf_directory, model_from_hf_tensors

        config, tensors = load_hf_directory(path, dtype=dtype, param_dtype=dtype)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError, TypeError) as error:
            raise FileNotFoundError(
                f"{str(path)!r} has no tokenizer that transformers can load "
                f"({type(error).__name__}); valid: a model directory with tokenizer.json (or its "
                "model type's tokenizer files) and tokenizer_config.json, as save_pretrained "
                "writes them"
            ) from None
        return model_from_hf_tensors(config, tensors, value_head=value_head), tokenizer
    if str(source).endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {str(source)!r}")
        from starpo_jax.models.gguf import load_gguf

        return load_gguf(path, dtype, value_head=value_head)
    if source == EMBEDDED_NAME:
        from starpo_jax.models.embedded import embedded_gguf_path
        from starpo_jax.models.gguf import load_gguf

        return load_gguf(embedded_gguf_path(), dtype, value_head=value_head)
    if source == TINY_RANDOM_NAME:
        from starpo_jax.models.embedded import tiny_random

        return tiny_random(dtype, value_head=value_head)
    raise FileNotFoundError(
        f"cannot load model {str(source)!r}: no such directory, and not a .gguf path or a known "
        f"name; accepted: a Hugging Face model directory (config.json + *.safetensors), a path to "
        f"a .gguf file, {EMBEDDED_NAME!r}, {TINY_RANDOM_NAME!r}"
    )
