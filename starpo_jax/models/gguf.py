"""GGUF checkpoints (llama.cpp's format) as Hugging Face-named float32 tensors and config.

A GGUF file holds metadata (architecture hyper-parameters, the tokenizer) and tensors, many of
them block-quantised (Q4_1, Q8_0, ...). This module reads one with the `gguf` package and turns
it into exactly what a Hugging Face checkpoint would give: a `config.json`-style dict and a
mapping from HF parameter names to float32 numpy arrays in torch's [out, in] layout, so the
same `model_from_hf_tensors` builds the decoder for both sources.

Two llama.cpp conventions are undone here:
- GGUF lists a tensor's dimensions fastest-first (ne0 = columns), the reverse of numpy's order.
- llama.cpp's converter reorders the rows of the Llama q/k projections so that each rotary pair
  is adjacent (interleaved rope); HF's rope rotates the two halves of a head instead. Qwen2's
  converter does not reorder, so the rows are only restored for Llama-family files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, ReaderTensor
from gguf.quants import dequantize
from transformers import PreTrainedTokenizerFast

from starpo_jax.compile_cache import cache_root
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.params import model_from_hf_tensors
from starpo_jax.models.tokenizer import build_bpe_tokenizer, wrap_tokenizer

GGUF_MAGIC = b"GGUF"

# GGUF architecture (= HF model_type) -> HF class, and whether llama.cpp's converter permuted the
# q/k rows of that architecture on export.
SUPPORTED_ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "llama": ("LlamaForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
}

_GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_BLOCK_TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

_BLOCK_PATTERN = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")


class GGUFFormatError(ValueError):
    """The file is not a GGUF, is truncated, or describes a model this loader cannot map."""


def open_gguf(path: str | os.PathLike) -> GGUFReader:
    """A validated reader for the GGUF file at `path` (memory-mapped, cached per file version).

    Raises FileNotFoundError for a missing file, and GGUFFormatError naming the path when the file
    does not start with the GGUF magic or is truncated/corrupt (its header or tensor data run past
    the end of the file).
    """
    return _open_gguf_cached(*_file_version(path))


def _file_version(path: str | os.PathLike) -> tuple[str, int, int]:
    """(resolved path, size, mtime_ns): the cache key of a file's contents (a file rewritten in
    place is read again). FileNotFoundError for a missing file."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"GGUF file not found: {str(path)!r} (resolved to {str(file)!r})")
    stat = file.stat()
    return str(file), stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=4)
def _open_gguf_cached(file: str, size: int, mtime_ns: int) -> GGUFReader:
    with open(file, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFFormatError(
            f"{file!r} is not a GGUF file: it starts with {magic!r}, expected {GGUF_MAGIC!r}"
        )
    try:
        reader = GGUFReader(file)
    except (ValueError, IndexError, OverflowError) as error:
        raise GGUFFormatError(
            f"{file!r} ({size} bytes) is truncated or corrupt; the gguf reader failed with: {error}"
        ) from error
    data_end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if data_end > size:
        raise GGUFFormatError(
            f"{file!r} is truncated: its tensors need {data_end} bytes, the file has {size}"
        )
    return reader


def gguf_metadata(reader: GGUFReader) -> dict[str, Any]:
    """The file's key/value metadata as plain Python values (strings, numbers, lists)."""
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):  # header bookkeeping (version, counts), not model metadata
            continue
        value = field.contents()
        if field.types == [GGUFValueType.STRING]:
            value = str(value)
        metadata[key] = value
    return metadata


def hf_config_from_gguf(
    metadata: Mapping[str, Any], tensor_names: set[str] | frozenset[str]
) -> dict[str, Any]:
    """A Hugging Face `config.json`-style dict for the model a GGUF file describes.

    `metadata` is `gguf_metadata(reader)`; `tensor_names` the file's GGUF tensor names (used for
    tied embeddings: no `output.weight`, and q/k/v bias: `blk.0.attn_q.bias` present).
    """
    architecture = metadata.get("general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise GGUFFormatError(
            f"unsupported GGUF architecture {architecture!r}; supported: "
            f"{sorted(SUPPORTED_ARCHITECTURES)}"
        )
    hf_class, _ = SUPPORTED_ARCHITECTURES[architecture]

    def value(key: str, default: Any = None) -> Any:
        full_key = f"{architecture}.{key}"
        if full_key in metadata:
            found = metadata[full_key]
            if isinstance(found, list):
                raise GGUFFormatError(f"per-layer {full_key!r} values are not supported: {found}")
            return found
        if default is None:
            raise GGUFFormatError(f"GGUF metadata lacks the required key {full_key!r}")
        return default

    scaling = value("rope.scaling.type", "none")
    if scaling != "none":
        raise GGUFFormatError(
            f"unsupported rope scaling {scaling!r}; only unscaled rope is supported"
        )
    hidden_size = int(value("embedding_length"))
    num_heads = int(value("attention.head_count"))
    head_dim = int(value("attention.key_length", hidden_size // num_heads))
    rotary_dim = int(value("rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise GGUFFormatError(
            f"partial rotary embeddings are not supported: rope.dimension_count={rotary_dim}, "
            f"head_dim={head_dim}"
        )
    vocab_size = metadata.get(f"{architecture}.vocab_size")
    if vocab_size is None:
        vocab_size = len(metadata.get("tokenizer.ggml.tokens", ()))
    config: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": architecture,
        "vocab_size": int(vocab_size),
        "hidden_size": hidden_size,
        "intermediate_size": int(value("feed_forward_length")),
        "num_hidden_layers": int(value("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(value("attention.head_count_kv", num_heads)),
        "head_dim": head_dim,
        "rope_theta": float(value("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(value("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(value("context_length", 8192)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "silu",
    }
    if architecture == "llama":  # Qwen2 always has q/k/v bias, so HF has no such key there
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        key = "tokenizer.ggml." + name.replace("pad_", "padding_")
        if key in metadata:
            config[name] = int(metadata[key])
    return config


def hf_tensor_name(gguf_name: str) -> str:
    """The HF parameter name for a GGUF tensor name ("blk.3.attn_q.weight" ->
    "model.layers.3.self_attn.q_proj.weight"); GGUFFormatError for names with no HF counterpart."""
    if gguf_name in _GLOBAL_TENSOR_NAMES:
        return _GLOBAL_TENSOR_NAMES[gguf_name]
    match = _BLOCK_PATTERN.match(gguf_name)
    if match is None or match.group(2) not in _BLOCK_TENSOR_NAMES:
        raise GGUFFormatError(
            f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart; known: "
            f"{sorted(_GLOBAL_TENSOR_NAMES)} and blk.N.{{{','.join(_BLOCK_TENSOR_NAMES)}}}"
        )
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_TENSOR_NAMES[part]}.{kind}"


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: [num_heads * head_dim, ...] -> the same shape in HF order.

    llama.cpp stores, within each head, row 2*i + h of its layout from HF row h * head_dim/2 + i
    (h in {0, 1} picks the half, i < head_dim/2), so rotary pairs sit next to each other.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise GGUFFormatError(f"cannot split {rows} q/k rows into {num_heads} heads of even size")
    per_head = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)


def dequantize_tensor(tensor: ReaderTensor) -> np.ndarray:
    """One GGUF tensor as a float32 array in numpy (row-major) order, e.g. [out, in]."""
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as error:
        raise GGUFFormatError(
            f"tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the installed gguf "
            f"package cannot dequantise: {error}"
        ) from error
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne0 (columns) first
    # A copy, so no array keeps the memory-mapped file alive or aliases it.
    return np.array(values, dtype=np.float32).reshape(shape)


def hf_tensors_from_gguf(reader: GGUFReader, hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """All tensors of the file, HF-named, float32, torch [out, in] layout, q/k rows in HF order.

    `hf_config` is `hf_config_from_gguf(...)` for the same file (it says whether rows were
    permuted and gives the head counts).
    """
    _, permuted = SUPPORTED_ARCHITECTURES[hf_config["model_type"]]
    heads = {"attn_q": hf_config["num_attention_heads"], "attn_k": hf_config["num_key_value_heads"]}
    tensors = {}
    for tensor in reader.tensors:
        values = dequantize_tensor(tensor)
        block = _BLOCK_PATTERN.match(tensor.name)
        if permuted and block is not None and block.group(2) in heads:
            values = unpermute_rotary_rows(values, heads[block.group(2)])
        tensors[hf_tensor_name(tensor.name)] = values
    return tensors


def read_gguf_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(HF config dict, HF-named float32 tensors) for the GGUF file at `path`."""
    reader = open_gguf(path)
    names = frozenset(t.name for t in reader.tensors)
    hf_config = hf_config_from_gguf(gguf_metadata(reader), names)
    return hf_config, hf_tensors_from_gguf(reader, hf_config)


def cache_dir() -> Path:
    """Where fetched files are kept (compile_cache.cache_root: $STARPO_JAX_CACHE, else
    ~/.cache/starpo_jax): the parsed tokenizers here, the embedded model's extracted .gguf
    (models/embedded.py), the commands' compiled programs (xla/)."""
    return cache_root()


@functools.lru_cache(maxsize=4)
def _tokenizer_parts(file: str, size: int, mtime_ns: int) -> tuple[Any, dict[str, Any]]:
    """(tokenizers.Tokenizer, tokenizer.* metadata) of one file version. The metadata is kept
    as JSON in <cache_dir>/gguf-tokenizers: reading a GGUF parses every field (~5 s for
    SmolLM2's 49k-token vocabulary, paid by every new process), the JSON loads in ~30 ms."""
    digest = hashlib.sha256(f"v1\0{file}\0{size}\0{mtime_ns}".encode()).hexdigest()[:32]
    kept = cache_dir() / "gguf-tokenizers" / f"{digest}.json"
    try:
        metadata = json.loads(kept.read_text())
    except (OSError, ValueError):
        reader = open_gguf(file)
        metadata = {k: v for k, v in gguf_metadata(reader).items() if k.startswith("tokenizer.")}
        try:  # atomically (processes may race); an unwritable cache only costs the parse
            kept.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=kept.parent, suffix=".tmp",
                                             delete=False) as handle:
                json.dump(metadata, handle)
            os.replace(handle.name, kept)
        except OSError:
            pass
    return build_bpe_tokenizer(metadata), metadata


def load_gguf_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerFast:
    """The tokenizer stored in the GGUF file at `path`, as a transformers fast tokenizer.

    Each call returns a fresh object (callers may change padding_side etc.); the parsed
    vocabulary is cached per file version (in memory, and on disk across processes), so
    repeated calls cost a copy (~0.2 s), not a parse. Errors as `open_gguf`'s.
    """
    return wrap_tokenizer(*_tokenizer_parts(*_file_version(path)))


def load_gguf(
    path: str | os.PathLike, dtype: str = "float32", *, value_head: bool = False
) -> tuple[Decoder, PreTrainedTokenizerFast]:
    """(Decoder, tokenizer) from a GGUF file; `dtype` sets both compute and parameter dtype.

    Weights are dequantised to float32 and then cast to `dtype`.
    """
    hf_config, tensors = read_gguf_checkpoint(path)
    config = ModelConfig.from_hf_config(hf_config, dtype=dtype, param_dtype=dtype)
    model = model_from_hf_tensors(config, tensors, value_head=value_head)
    return model, load_gguf_tokenizer(path)
