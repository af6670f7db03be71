"""Hugging Face checkpoints -> Decoder: the name/layout mapping, and reading a local HF directory.

Hugging Face stores linear weights as torch `[out, in]`, one tensor per layer; the Decoder keeps
`[in, out]` weights stacked over layers. `model_from_hf_tensors` does that mapping with strict
checks; `load_hf_directory` reads `config.json` and the (possibly sharded) safetensors files,
including bfloat16 ones (numpy has no bfloat16, so the file format is read here directly).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.layers import layer_weight_shapes

# Decoder layer weight -> (Hugging Face name inside "model.layers.{i}.", transposed?)
LAYER_NAMES = {
    "attn_norm": ("input_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
}
# A critic saved as a token-classification model (veRL's layout) keeps its value head here.
_VALUE_NAMES = ("score.weight", "score.bias")


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> its shape, for every tensor the config requires."""
    v, d = config.vocab_size, config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, d),
        "model.norm.weight": (d,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, d)
    for name, shape in layer_weight_shapes(config).items():
        hf_name, transposed = LAYER_NAMES[name]
        per_layer = shape[1:][::-1] if transposed else shape[1:]
        for i in range(config.num_layers):
            shapes[f"model.layers.{i}.{hf_name}"] = per_layer
    return shapes


def _check_tensors(
    config: ModelConfig, tensors: Mapping[str, np.ndarray], value_head: bool
) -> None:
    expected = _expected_shapes(config)
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise ValueError(
            f"checkpoint is missing {len(missing)} tensor(s) the config needs: "
            f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"
        )
    optional = set(_VALUE_NAMES) if value_head else set()
    if config.tie_word_embeddings:
        optional.add("lm_head.weight")
    # Old checkpoints carry the rotary frequency buffers; they are recomputed from rope_theta.
    unexpected = [
        k
        for k in tensors
        if k not in expected and k not in optional and not k.endswith("rotary_emb.inv_freq")
    ]
    if unexpected:
        raise ValueError(
            f"checkpoint has {len(unexpected)} tensor(s) this config does not use: "
            f"{', '.join(sorted(unexpected)[:8])}{' ...' if len(unexpected) > 8 else ''}"
        )
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise ValueError(
                f"tensor {key!r}: expected shape {shape}, found {tuple(tensors[key].shape)}"
            )
    if (
        config.tie_word_embeddings
        and "lm_head.weight" in tensors
        and not np.array_equal(
            np.asarray(tensors["lm_head.weight"]), np.asarray(tensors["model.embed_tokens.weight"])
        )
    ):
        raise ValueError(
            "config says tie_word_embeddings=True but 'lm_head.weight' differs from "
            "'model.embed_tokens.weight'; set tie_word_embeddings=False"
        )
    d = config.hidden_size
    for key, shape in zip(_VALUE_NAMES, ((1, d), (1,))):
        if value_head and key in tensors and tuple(tensors[key].shape) != shape:
            raise ValueError(
                f"tensor {key!r}: expected shape {shape}, found {tuple(tensors[key].shape)}"
            )


def model_from_hf_tensors(
    config: ModelConfig, tensors: Mapping[str, np.ndarray], *, value_head: bool = False
) -> Decoder:
    """A Decoder holding the given Hugging Face-named weights (cast to config.param_dtype).

    tensors: e.g. "model.embed_tokens.weight" [V, D], "model.layers.0.self_attn.q_proj.weight"
    [H*hd, D] (torch [out, in] layout), "model.norm.weight" [D], "lm_head.weight" [V, D] when
    untied. With value_head=True, "score.weight" [1, D] / "score.bias" [1] are used when present,
    else the value head is freshly initialised (normal, std initializer_range, fixed seed 0).
    Raises ValueError naming missing or unexpected keys and any shape mismatch.
    """
    _check_tensors(config, tensors, value_head)
    dtype = config.weight_dtype

    def to_param(x: np.ndarray, transpose: bool = False) -> jax.Array:
        x = np.asarray(x)
        return jnp.asarray(x.T if transpose else x, dtype=dtype)

    layers = {}
    for name in layer_weight_shapes(config):
        hf_name, transposed = LAYER_NAMES[name]
        per_layer = [
            np.asarray(tensors[f"model.layers.{i}.{hf_name}"]) for i in range(config.num_layers)
        ]
        stacked = np.stack([w.T if transposed else w for w in per_layer])
        layers[name] = jnp.asarray(stacked, dtype=dtype)
    values = {
        "embed": to_param(tensors["model.embed_tokens.weight"]),
        "final_norm": to_param(tensors["model.norm.weight"]),
        "layers": layers,
    }
    if not config.tie_word_embeddings:
        values["lm_head"] = to_param(tensors["lm_head.weight"], transpose=True)
    if value_head:
        if _VALUE_NAMES[0] in tensors:
            values["value_head"] = jnp.asarray(np.asarray(tensors[_VALUE_NAMES[0]])[0], jnp.float32)
            values["value_bias"] = jnp.asarray(
                np.asarray(tensors.get(_VALUE_NAMES[1], np.zeros(1)))[0], jnp.float32
            )
        else:
            fresh = jax.random.normal(jax.random.key(0), (config.hidden_size,), jnp.float32)
            values["value_head"] = config.initializer_range * fresh
            values["value_bias"] = jnp.zeros((), jnp.float32)

    # Build the module abstractly (no random init of weights that are overwritten anyway).
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), value_head=value_head))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


# safetensors dtype tag -> numpy dtype (bfloat16 via ml_dtypes, which JAX already depends on).
_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as read-only numpy arrays (memory-mapped).

    Raises ValueError naming the file when it is truncated or not a valid safetensors file.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        header_len = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < header_len <= size - 8:
            raise ValueError(
                f"{path}: not a valid safetensors file (header length {header_len}, "
                f"file size {size} bytes); truncated or corrupt?"
            )
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: corrupt safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    data = np.memmap(path, dtype=np.uint8, mode="r") if size > data_start else np.zeros(0, np.uint8)
    tensors = {}
    for name, info in header.items():
        try:
            dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"{path}: tensor {name!r} has an unsupported or corrupt header entry "
                f"{info!r} ({e!r}); dtypes read: {sorted(_SAFETENSORS_DTYPES)}"
            ) from None
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != nbytes or data_start + end > size:
            raise ValueError(
                f"{path}: tensor {name!r} needs bytes {begin}..{end} of the data section "
                f"({nbytes} expected for {shape} {dtype}) but the data section has "
                f"{size - data_start} bytes; truncated or corrupt file"
            )
        tensors[name] = data[data_start + begin : data_start + end].view(dtype).reshape(shape)
    return tensors


def load_hf_directory(
    path: str | os.PathLike, **config_overrides
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Reads a local Hugging Face model directory: config.json + model.safetensors, or the shards
    listed in model.safetensors.index.json. `config_overrides` go to ModelConfig (e.g. dtype).

    Returns (config, tensors by Hugging Face name). Raises FileNotFoundError for a missing
    directory, config or shard, and ValueError for an unsupported architecture or a bad file.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no model directory at {str(root)!r}")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{str(root)!r} has no config.json (found: "
            f"{', '.join(sorted(p.name for p in root.iterdir())) or 'nothing'})"
        )
    try:
        hf_config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{config_path}: not valid JSON ({error})") from None
    if not isinstance(hf_config, dict):
        raise ValueError(f"{config_path}: not a JSON object")
    try:
        config = ModelConfig.from_hf_config(hf_config, **config_overrides)
    except KeyError as error:
        raise ValueError(
            f"{config_path}: no {error.args[0]!r}; a Qwen2 / Llama config.json gives vocab_size, "
            "hidden_size, intermediate_size, num_hidden_layers and num_attention_heads"
        ) from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"{config_path}: {error}") from None

    index_path = root / "model.safetensors.index.json"
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path}: no 'weight_map' object")
        shards = sorted(set(weight_map.values()))
    elif (root / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"{str(root)!r} has neither model.safetensors nor model.safetensors.index.json "
            "(only safetensors checkpoints are read; convert .bin files with transformers first)"
        )
    tensors: dict[str, np.ndarray] = {}
    for shard in shards:
        if not (root / shard).is_file():
            raise FileNotFoundError(
                f"shard {shard!r} listed in {index_path.name} is missing from {str(root)!r}"
            )
        tensors.update(read_safetensors(root / shard))
    return config, tensors
