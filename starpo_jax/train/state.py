"""The training state and how it starts: `TrainState`, the optimiser, `init_train_state` (full
weights or LoRA adapters) and `apply_if`, the one rule by which an update changes the weights.

With LoRA (config.lora.rank > 0; models/lora.py) the actor is the model with adapters; only the
adapters are optimised, the base weights are frozen and shared: the critic holds only its own
adapters and value head (its base is the actor's), and the KL reference is the base model (the
actor's frozen weights without the adapters), not a copy.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax.config import TrainConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import adapted, fresh_trainable, split_trainable


class TrainState(flax.struct.PyTreeNode):
    """Everything that changes between steps (critic fields None for GRPO, reference None when
    kl_coef is 0 or with LoRA). With LoRA: actor = base + adapters, actor_opt over the adapters,
    critic = its adapters and value head only."""

    actor: nnx.State
    actor_opt: optax.OptState
    critic: nnx.State | None
    critic_opt: optax.OptState | None
    reference: nnx.State | None
    step: jax.Array  # [] int32


def optimizer(lr: float, config: TrainConfig) -> optax.GradientTransformation:
    """The actor's or the critic's optimiser: global-norm clipping, then AdamW at `lr`."""
    return optax.chain(optax.clip_by_global_norm(config.optim.max_grad_norm),
                       optax.adamw(lr, weight_decay=config.optim.weight_decay))


def init_train_state(config: TrainConfig, key: jax.Array, *, model: Decoder) -> TrainState:
    """A fresh TrainState: actor = `model`'s weights; for PPO a critic with the same trunk and a
    new value head (initialised from `key`); a frozen copy as reference when kl_coef > 0.
    With LoRA see `_init_lora_state`."""
    if config.lora.rank:
        return _init_lora_state(config, key, model)
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  (no buffer shared: donation)
    actor = copy(nnx.state(model))
    critic = critic_opt = None
    if config.algo == "ppo":
        critic_model = Decoder(model.config, rngs=nnx.Rngs(key), value_head=True)
        nnx.update(critic_model, actor)
        critic = copy(nnx.state(critic_model))
        critic_opt = optimizer(config.optim.critic_lr, config).init(critic)
    reference = copy(actor) if config.loss.kl_coef > 0 else None
    return TrainState(actor=actor, actor_opt=optimizer(config.optim.actor_lr, config).init(actor),
                      critic=critic, critic_opt=critic_opt, reference=reference,
                      step=jnp.int32(0))


def _init_lora_state(config: TrainConfig, key: jax.Array, model: Decoder) -> TrainState:
    """LoRA's fresh TrainState: actor = `model` with config.lora's adapters (new ones, from key,
    unless it has them); the optimiser state of the adapters only; for PPO the critic's own new
    adapters and value head (from key; its base is the actor's frozen weights); no reference."""
    model = adapted(model, config.lora, jax.random.fold_in(key, 1))
    actor = jax.tree.map(jnp.copy, nnx.state(model))  # no buffer shared with model: donation
    critic = critic_opt = None
    if config.algo == "ppo":
        critic = fresh_trainable(model.config, key, value_head=True)
        critic_opt = optimizer(config.optim.critic_lr, config).init(critic)
    actor_opt = optimizer(config.optim.actor_lr, config).init(split_trainable(actor)[0])
    return TrainState(actor=actor, actor_opt=actor_opt, critic=critic, critic_opt=critic_opt,
                      reference=None, step=jnp.int32(0))


def apply_if(used: jax.Array, tx: optax.GradientTransformation, grads: Any,
             opt_state: optax.OptState, params: Any, loss: jax.Array, grad_norm: jax.Array,
             ) -> tuple[Any, optax.OptState, jax.Array]:
    """(params, opt_state) after one step of tx, or both unchanged (a select inside the
    compiled step) when the mini-batch is not `used` ([] bool: it holds no kept token; the
    original never forms it, and AdamW's momentum and weight decay would move the weights even
    at a zero gradient) or when the loss [] or the gradients' global norm [] is not finite.
    Returns (params, opt_state, skipped [] float32: 1.0 when a used update was dropped as
    non-finite). optax.apply_if_finite is not used: it adds counters to the optimiser state
    (older checkpoints would not restore) and does not see the loss."""
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt = tx.update(grads, opt_state, params)
    new = (optax.apply_updates(params, updates), new_opt)
    params, opt_state = jax.tree.map(lambda n, o: jnp.where(used & finite, n, o), new,
                                     (params, opt_state))
    return params, opt_state, (used & ~finite).astype(jnp.float32)
