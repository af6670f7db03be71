"""The weights the rollout samples with: the policy as one plain model, optionally in bfloat16.

    graph = sampler_graphdef(policy, "bfloat16")          # once, from the policy's structure
    params = sampler_params(actor_params, policy.config, "bfloat16")   # inside the step
    out = rollout(graph, params, ...)

The sampler reads the whole model once per decoded token, so what it reads is what a rollout
costs. A LoRA policy samples with its adapters merged in (W + A B * alpha / rank, once per step,
`lora.merged_params`): the same function as the adapted model within float rounding, without
the adapters' extra matmuls in every decode step. "bfloat16" casts every floating weight to
bfloat16 and computes the sampler's matmuls in bfloat16 (float32 accumulation; norms, softmax
and the logits stay float32) with a bfloat16 KV cache (KVCache.init): half the bytes read per token, and this
CPU's bfloat16 matmuls run up to ~1.9x the float32 rate. The stacked layer weights are stored
as their uint16 bit patterns, as the bfloat16 cache is (layers._values). It is opt-in
(rollout.sampler_dtype): the behaviour log-probs then come from a slightly different model
than the trainer's, which `rollout/logprob_diff_*` measures and the PPO ratio (computed from
the trainer's own old log-probs) does not see. "model" samples with the policy's own weights and compute dtype.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from starpo_jax.config import SAMPLER_DTYPES  # noqa: F401 (with RolloutConfig, no JAX)
from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import base_config, merged_params

#: Accepted values of rollout.sampler_dtype.


def sampler_config(config: ModelConfig, dtype: str) -> ModelConfig:
    """The ModelConfig the sampler runs for a policy of `config`: without adapters (they are
    merged), and with bfloat16 weights and compute when dtype is "bfloat16"."""
    if dtype not in SAMPLER_DTYPES:
        raise ValueError(f"sampler dtype {dtype!r} is not one of {SAMPLER_DTYPES}")
    plain = base_config(config) if config.lora_rank else config
    if dtype == "bfloat16":
        plain = dataclasses.replace(plain, dtype="bfloat16", param_dtype="bfloat16")
    return plain


def sampler_graphdef(policy: Decoder, dtype: str) -> nnx.GraphDef:
    """The graph the sampler runs for `policy` (a model or an abstract one: only its structure
    is read); `policy`'s own when nothing changes."""
    config = sampler_config(policy.config, dtype)
    if config == policy.config:
        return nnx.graphdef(policy)
    return nnx.graphdef(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))


def sampler_params(params: nnx.State, config: ModelConfig, dtype: str) -> nnx.State:
    """The parameters for `sampler_graphdef`, from the policy's `params` (of a model of
    `config`); jit-able. Returns `params` itself when nothing changes."""
    target = sampler_config(config, dtype)
    if target == config:
        return params
    pure = nnx.to_pure_dict(params)
    if config.lora_rank:
        pure = merged_params(pure, config)
    if dtype == "bfloat16":
        pure = jax.tree.map(
            lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x,
            pure)
        # The stacked layer weights as bit patterns, read through a bitcast after each layer's
        # slice (layers._values): a bfloat16 stack would be widened to float32 whole.
        pure["layers"] = {name: jax.lax.bitcast_convert_type(x, jnp.uint16)
                          for name, x in pure["layers"].items()}
    state = nnx.state(nnx.eval_shape(lambda: Decoder(target, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, pure)
    return state
