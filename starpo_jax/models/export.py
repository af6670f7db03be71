"""Decoder -> a Hugging Face model directory that transformers (and our own loader) read back.

The inverse of params.py: our `[in, out]` weights stacked over layers become one torch-layout
`[out, in]` tensor per layer under the Hugging Face names. The q/k rows are already in Hugging
Face's rotate-half order whatever the source (gguf.py undoes llama.cpp's permutation on load),
so they are written as they are. The directory holds:

    config.json                   Qwen2ForCausalLM (q/k/v bias) or LlamaForCausalLM (none)
    model.safetensors             or model-0000i-of-0000n.safetensors + model.safetensors.index.json
    generation_config.json        bos / eos / pad ids (plus any fields the caller passes)
    tokenizer.json, tokenizer_config.json, chat_template.jinja, ...   (tokenizer.save_pretrained)
    any `extra_files` (run/export.py: starpo_prompt.json)

`prefixed_chat_template` makes a chat template whose generation prompt ends with the text a
policy's replies were trained to begin with (the run's forced prefix, e.g. "<answer>"): with it
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)` is the prompt the policy
saw; the template variable `reply_prefix` overrides it (reply_prefix="": the original prompt).

A value head (critic) is not exported: the directory is the policy only. LoRA adapters are
merged into the weights they adapt (W + A B * alpha / rank, models/lora.py): the directory is a
plain model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util
from safetensors.numpy import save_file

from starpo_jax.models.config import DTYPES, ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import base_config, merged_params
from starpo_jax.models.params import LAYER_NAMES

DEFAULT_MAX_SHARD_SIZE = "2GB"
_VALUE_HEAD = ("value_head", "value_bias")
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes in a size given as an int or as text like "2GB", "500MB", "40KiB" (transformers'
    units: KB = 1000 bytes, KiB = 1024). Raises ValueError naming the bad value."""
    if isinstance(size, int) and not isinstance(size, bool):
        number, unit = size, ""
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
        if match is None or match.group(2).upper() not in _SIZE_UNITS:
            raise ValueError(f"size {size!r} is invalid; valid: a number of bytes, or a number "
                             f"with one of the units {sorted(u for u in _SIZE_UNITS if u)}")
        number, unit = float(match.group(1)), match.group(2).upper()
    nbytes = int(number * _SIZE_UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"size {size!r} is invalid; valid: a positive size")
    return nbytes


def hf_config(config: ModelConfig, tokenizer: Any, dtype: str) -> dict[str, Any]:
    """The config.json of `config` for weights stored as `dtype`, in the keys both transformers
    4.x (rope_theta, torch_dtype) and 5.x (rope_parameters, dtype) read; special token ids
    from `tokenizer` (omitted when it has none)."""
    qwen2 = config.attention_bias  # Qwen2 always has q/k/v biases, Llama (as we load it) none
    out: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_dropout": 0.0,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    if qwen2:
        out.update(use_sliding_window=False)
    else:
        out.update(attention_bias=False, mlp_bias=False)
    out.update(_special_ids(tokenizer))
    return out


def _special_ids(tokenizer: Any) -> dict[str, int]:
    ids = {name: getattr(tokenizer, name, None)
           for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return {name: int(i) for name, i in ids.items() if i is not None}


class _Tensor(NamedTuple):
    """One Hugging Face tensor, read from our params only when its shard is written."""

    source: np.ndarray  # a whole parameter, e.g. [num_layers, in, out]
    layer: int | None  # the index into a stacked parameter's leading axis
    transposed: bool  # ours [in, out] -> torch [out, in]

    @property
    def shape(self) -> tuple[int, ...]:
        shape = self.source.shape if self.layer is None else self.source.shape[1:]
        return shape[::-1] if self.transposed else shape

    def value(self, dtype: np.dtype) -> np.ndarray:
        x = self.source if self.layer is None else self.source[self.layer]
        return np.ascontiguousarray((x.T if self.transposed else x).astype(dtype))


def _pure_dict(model_or_params: Decoder | nnx.State | Mapping) -> Mapping:
    if isinstance(model_or_params, Decoder):
        model_or_params = nnx.state(model_or_params, nnx.Param)
    if isinstance(model_or_params, nnx.State):
        model_or_params = nnx.to_pure_dict(model_or_params)
    if not isinstance(model_or_params, Mapping):
        raise TypeError(f"expected a Decoder, an nnx.State or a dict of its parameters; got "
                        f"{type(model_or_params).__name__}")
    return model_or_params


def _flat_params(model_or_params: Decoder | nnx.State | Mapping) -> dict[str, Any]:
    flat = traverse_util.flatten_dict(dict(_pure_dict(model_or_params)), sep="/")
    return {k: v for k, v in flat.items() if k not in _VALUE_HEAD}


def _check_params(flat: Mapping[str, Any], config: ModelConfig) -> None:
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    expected = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(abstract)), sep="/")
    missing = sorted(set(expected) - set(flat))
    unexpected = sorted(set(flat) - set(expected))
    if missing or unexpected:
        raise ValueError(f"the parameters do not fit the config: missing {missing}, "
                         f"unexpected {unexpected}")
    for name, want in expected.items():
        if tuple(np.shape(flat[name])) != tuple(want.shape):
            raise ValueError(f"parameter {name!r} has shape {tuple(np.shape(flat[name]))}; the "
                             f"config needs {tuple(want.shape)}")


def _tensor_plan(model_or_params: Decoder | nnx.State | Mapping,
                 config: ModelConfig) -> dict[str, _Tensor]:
    """Hugging Face tensor name -> where its values are in our parameters, in the order
    transformers writes them (embeddings, layer 0, 1, ..., final norm, lm_head when untied).

    model_or_params: a Decoder, its nnx.State, or the pure dict of that state (e.g. a
    TrainState's actor); a value head in it is ignored. Raises ValueError naming a parameter
    that is missing, unexpected or of the wrong shape for `config`.
    """
    flat = _flat_params(model_or_params)
    _check_params(flat, config)
    host = {name: np.asarray(jax.device_get(x)) for name, x in flat.items()}
    plan = {"model.embed_tokens.weight": _Tensor(host["embed"], None, False)}
    for i in range(config.num_layers):
        for name, (hf_name, transposed) in LAYER_NAMES.items():
            if f"layers/{name}" in host:
                plan[f"model.layers.{i}.{hf_name}"] = _Tensor(host[f"layers/{name}"], i, transposed)
    plan["model.norm.weight"] = _Tensor(host["final_norm"], None, False)
    if not config.tie_word_embeddings:
        plan["lm_head.weight"] = _Tensor(host["lm_head"], None, True)
    return plan


def _shards(sizes: Mapping[str, int], limit: int) -> list[list[str]]:
    """Tensor names grouped in order into files of at most `limit` bytes (a bigger tensor gets
    a file of its own)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, nbytes in sizes.items():
        if shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    return shards


def _write_weights(plan: Mapping[str, _Tensor], directory: Path, dtype: np.dtype,
                   limit: int) -> None:
    sizes = {name: int(np.prod(t.shape, dtype=np.int64)) * dtype.itemsize
             for name, t in plan.items()}
    shards = _shards(sizes, limit)
    # The tag transformers writes into its own files: the tensors are in torch's layout.
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file({n: plan[n].value(dtype) for n in shards[0]}, directory / "model.safetensors",
                  metadata=metadata)
        return
    weight_map = {}
    for index, names in enumerate(shards, start=1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: plan[n].value(dtype) for n in names}, directory / file, metadata=metadata)
        weight_map.update(dict.fromkeys(names, file))
    index_json = {"metadata": {"total_size": sum(sizes.values())},
                  "weight_map": dict(sorted(weight_map.items()))}
    _write_json(directory / "model.safetensors.index.json", index_json)


#: The sample conversation prefixed_chat_template checks the template on.
_SAMPLE = ({"role": "system", "content": "S"}, {"role": "user", "content": "U"},
           {"role": "assistant", "content": "A"}, {"role": "user", "content": "V"})


def prefixed_chat_template(tokenizer: Any, prefix: str) -> str | None:
    """`tokenizer`'s chat template with `prefix` written after its generation prompt (only when
    add_generation_prompt is set; the template variable `reply_prefix` replaces it), or None
    when the tokenizer has no template or the addition does not render exactly so (the
    original output plus `prefix` after a generation prompt, the original output otherwise)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not prefix:
        return None
    # Jinja drops one trailing newline of a template: dropped here so that it stays dropped.
    body = template[:-1] if template.endswith("\n") else template
    patched = (body + "{% if add_generation_prompt %}{{ reply_prefix if reply_prefix is "
               f"defined else {json.dumps(prefix)} }}}}{{% endif %}}")
    render = lambda messages, **kw: tokenizer.apply_chat_template(  # noqa: E731
        list(messages), tokenize=False, **kw)
    try:
        exact = (render(_SAMPLE[:2], chat_template=patched, add_generation_prompt=True)
                 == render(_SAMPLE[:2], add_generation_prompt=True) + prefix
                 and render(_SAMPLE, chat_template=patched) == render(_SAMPLE)
                 and render(_SAMPLE[:2], chat_template=patched, add_generation_prompt=True,
                            reply_prefix="") == render(_SAMPLE[:2], add_generation_prompt=True))
    except Exception:  # noqa: BLE001  (a template that cannot render the sample: left as it is)
        return None
    return patched if exact else None


def _write_chat_template(directory: Path, template: str) -> None:
    """Replaces the chat template tokenizer.save_pretrained wrote to `directory` (its own file,
    chat_template.jinja, or tokenizer_config.json's chat_template)."""
    path = directory / "chat_template.jinja"
    if path.is_file():
        path.write_text(template)
        return
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    _write_json(config_path, config)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Raises FileExistsError unless `out` is free to write: missing, an empty directory, or any
    directory when `overwrite`."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{str(out)!r} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{str(out)!r} exists and is not empty; choose another directory "
                              "or pass overwrite=True (--overwrite) to replace it")


def _publish(staged: Path, out: Path, overwrite: bool) -> None:
    """Moves the finished `staged` directory to `out` by renames: readers of `out` see the old
    directory or the new one, never half of one."""
    check_out_dir(out, overwrite)  # again: something may have appeared while writing
    if not out.exists() or not any(out.iterdir()):
        os.replace(staged, out)  # rename() may replace an empty directory
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
    os.replace(out, old / out.name)
    os.replace(staged, out)
    shutil.rmtree(old)


def save_pretrained(model_or_params: Decoder | nnx.State | Mapping, config: ModelConfig,
                    tokenizer: Any, out_dir: str | os.PathLike, *, dtype: str | None = None,
                    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, overwrite: bool = False,
                    generation_config: Mapping[str, Any] | None = None,
                    chat_template: str | None = None,
                    extra_files: Mapping[str, str] | None = None) -> Path:
    """Writes the policy as a Hugging Face model directory at `out_dir` and returns its path.

    model_or_params: a Decoder, its nnx.State or that state's pure dict ([num_layers, in, out]
    stacked weights, as TrainState.actor holds them); config: its ModelConfig (with LoRA
    adapters: they are merged in, and the export's default dtype is the base's); tokenizer: a
    transformers tokenizer whose ids fit config.vocab_size. dtype: of the stored tensors
    (default config.param_dtype). Weights above `max_shard_size` bytes (an int or "2GB") are
    split into shards with an index. generation_config: extra fields for
    generation_config.json (e.g. the source model's sampling defaults), over the token ids.
    chat_template: written instead of the tokenizer's (e.g. `prefixed_chat_template`'s).
    extra_files: {file name: text} written beside the model.

    Everything is written to a temporary directory beside `out_dir`, then renamed into place.
    Raises FileExistsError if `out_dir` is a non-empty directory and not `overwrite`, and
    ValueError naming a bad dtype, a shard size, a parameter that does not fit `config`, or a
    tokenizer larger than the vocabulary.
    """
    dtype = config.param_dtype if dtype is None else dtype
    if dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r} is invalid; valid: one of {DTYPES}")
    limit = parse_size(max_shard_size)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary "
                         f"only {config.vocab_size}: they do not belong together")
    out = Path(out_dir)
    check_out_dir(out, overwrite)
    if config.lora_rank:  # a LoRA model (config with adapters): written with them merged
        model_or_params = merged_params(_pure_dict(model_or_params), config)
        config = base_config(config)
    plan = _tensor_plan(model_or_params, config)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        _write_weights(plan, staged, np.dtype(jnp.dtype(dtype)), limit)
        _write_json(staged / "config.json", hf_config(config, tokenizer, dtype))
        _write_json(staged / "generation_config.json",
                    {**_special_ids(tokenizer), **(generation_config or {})})
        tokenizer.save_pretrained(str(staged))
        if chat_template is not None:
            _write_chat_template(staged, chat_template)
        for name, text in (extra_files or {}).items():
            (staged / name).write_text(text)
        # mkdtemp makes the directory private and safetensors writes its files 0600; a model
        # directory is meant to be shared: the usual 0755 / 0644.
        os.chmod(staged, 0o755)
        for path in staged.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        _publish(staged, out, overwrite)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return out
