"""LoRA adapters on a Decoder: adding them, splitting trainable from frozen, merging them away.

    model = with_lora(model, rank=64, alpha=64.0, targets=LORA_TARGETS, key=key)
    trainable, frozen = split_trainable(nnx.state(model))   # adapters (+ value head) / the rest
    plain = merged_params(nnx.to_pure_dict(nnx.state(model)), model.config)  # W + A B alpha / r

The adapters live in `LayerStack` (layers.py) as `nnx.LoRAParam`s "<proj>_lora_a" [num_layers,
in, rank] and "<proj>_lora_b" [num_layers, rank, out], float32; a fresh B is zero, so a fresh
LoRA model computes exactly what its base does. Removing the adapters from a LoRA model's state
leaves the state of the plain model (`base_config`), which is how the KL reference runs the base.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder, init_value_head
from starpo_jax.models.layers import init_lora

#: What LoRA trains: the adapters, and a critic's value head.
TRAINABLE = nnx.Any(nnx.LoRAParam, nnx.PathContains("value_head"), nnx.PathContains("value_bias"))


def base_config(config: ModelConfig) -> ModelConfig:
    """`config` without adapters: the model whose state is a LoRA state minus its adapters."""
    return dataclasses.replace(config, lora_rank=0, lora_alpha=ModelConfig.lora_alpha,
                               lora_targets=())


def lora_config(config: ModelConfig, *, rank: int, alpha: float, targets: tuple[str, ...],
                base_dtype: str | None = None) -> ModelConfig:
    """`config` with adapters of `rank` on `targets` (base weights stored as base_dtype, None:
    as they are)."""
    return dataclasses.replace(config, lora_rank=rank, lora_alpha=float(alpha),
                               lora_targets=tuple(targets),
                               param_dtype=base_dtype or config.param_dtype)


def fresh_trainable(config: ModelConfig, key: jax.Array, *, value_head: bool) -> nnx.State:
    """New adapters (and value head when `value_head`) of a Decoder of `config`, drawn from key
    (only these are computed, not the base weights a constructor would also draw)."""
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), value_head=value_head))
    state = nnx.state(abstract, TRAINABLE)
    values: dict[str, Any] = {"layers": init_lora(config, key)}
    if value_head:
        values["value_head"], values["value_bias"] = init_value_head(
            config, jax.random.fold_in(key, 1))
    nnx.replace_by_pure_dict(state, values)
    return state


def with_lora(model: Decoder, *, rank: int, alpha: float, targets: tuple[str, ...],
              key: jax.Array, base_dtype: str | None = None) -> Decoder:
    """A Decoder of `model`'s weights (cast to base_dtype when given) plus fresh adapters from
    `key`. Raises ValueError if `model` already has adapters."""
    if model.config.lora_rank:
        raise ValueError(f"the model already has LoRA adapters of rank {model.config.lora_rank}")
    config = lora_config(model.config, rank=rank, alpha=alpha, targets=targets,
                         base_dtype=base_dtype)
    value_head = model.value_head is not None
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), value_head=value_head))
    head, base = nnx.split_state(nnx.state(model), TRAINABLE, ...)  # a critic's head stays float32
    if base_dtype is not None:
        dtype = jnp.dtype(base_dtype)
        base = jax.tree.map(
            lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, base)
    adapters = fresh_trainable(config, key, value_head=False)
    return nnx.merge(nnx.graphdef(abstract), base, head, adapters)


def split_trainable(state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """(trainable, frozen) parts of a LoRA model's state: adapters and value head / the rest."""
    return nnx.split_state(state, TRAINABLE, ...)


def merged_params(params: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    """The parameters of the plain model (`base_config(config)`) that computes what the LoRA
    model of `config` does: params is the pure dict of its state (nnx.to_pure_dict); every
    adapted W [L, in, out] becomes W + A B * alpha / rank, summed in float32 and stored in W's
    dtype; the adapters are dropped. Parameters without adapters come back as they are."""
    layers = dict(params["layers"])
    for name in (config.lora_targets if config.lora_rank else ()):
        a, b = layers.pop(f"{name}_lora_a"), layers.pop(f"{name}_lora_b")
        delta = jnp.einsum("lir,lro->lio", jnp.asarray(a, jnp.float32),
                           jnp.asarray(b, jnp.float32), precision="highest")
        w = layers[name]
        layers[name] = (jnp.asarray(w, jnp.float32) + delta * config.lora_scale).astype(w.dtype)
    return {**params, "layers": layers}


class LoraSettings(Protocol):
    """What `adapted` reads of a LoRA setting (starpo_jax.config.LoraConfig)."""

    rank: int
    alpha: float
    base_dtype: str | None

    @property
    def target_modules(self) -> tuple[str, ...]: ...


def adapted_config(config: ModelConfig, lora: LoraSettings) -> ModelConfig:
    """The ModelConfig of the policy that `lora` asks for, from a model's `config`: config as it
    is when it already has those adapters (or LoRA is off and it has none), else with them.
    Raises ValueError when the model's adapters differ from `lora`."""
    have = (config.lora_rank, config.lora_alpha, config.lora_targets) if config.lora_rank else None
    want = (lora.rank, float(lora.alpha), lora.target_modules) if lora.rank else None
    if have is None and want is not None:
        return lora_config(config, rank=lora.rank, alpha=lora.alpha,
                           targets=lora.target_modules, base_dtype=lora.base_dtype)
    if have != want:
        raise ValueError(f"the model's LoRA adapters (rank, alpha, targets) = {have} differ from "
                         f"the config's lora section {want}; valid: a model without adapters, "
                         "or with the section's")
    return config


def adapted(model: Decoder, lora: LoraSettings, key: jax.Array) -> Decoder:
    """`model` with the adapters `lora` asks for: as it is when it has them (or LoRA is off),
    else `with_lora` with new adapters drawn from `key`."""
    if adapted_config(model.config, lora) == model.config:
        return model
    return with_lora(model, rank=lora.rank, alpha=lora.alpha, targets=lora.target_modules,
                     key=key, base_dtype=lora.base_dtype)


def policy_structure(model: Decoder, lora: LoraSettings) -> Decoder:
    """`model`, or (LoRA asked of a model without adapters) an abstract model with them: the
    graph a train step runs (only its structure is read)."""
    policy = adapted_config(model.config, lora)
    if policy == model.config:
        return model
    return nnx.eval_shape(lambda: Decoder(policy, rngs=nnx.Rngs(0)))


def trainable_split(state: nnx.State, lora: bool) -> tuple[nnx.State, nnx.State | None]:
    """(what is differentiated and optimised, the frozen rest or None): with LoRA the adapters
    (and value head) and the base weights (`split_trainable`), else all of `state` and None."""
    return split_trainable(state) if lora else (state, None)


def joined(trainable: nnx.State, frozen: nnx.State | None) -> nnx.State:
    """A whole model's state from `trainable_split`'s parts (a LoRA critic's from its trainable
    part and the actor's frozen base)."""
    return trainable if frozen is None else nnx.merge_state(trainable, frozen)
