"""The StarPO / StarPO-S training step: one compiled program per iteration.

    state = init_train_state(config, key, model=model)
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    state, metrics = step(state, key)        # the state is donated: use the returned one

Inside `step`: rollout (P x N trajectories) -> uncertainty filter on the summed env rewards
(K of P groups kept, static shapes [K * N, L]) -> Online-k rounds of { one teacher-forced
forward for old log-probs (and critic values), advantages from the registry, ppo_epochs x
minibatches of AdamW updates (lax.scan; a minibatch's gradient may be summed over
optim.micro_batches row slices, and the forwards without a gradient run in as many slices,
for memory) } -> a flat dict of float32 metrics. A minibatch update whose loss or gradients
are not finite leaves the weights and optimiser state as they were (apply_if_finite) and is
counted in actor/skipped_updates (critic/skipped_updates). The reference
forward exists only when loss.kl_coef > 0 (a Python branch on the static config).
Parameters are arguments of the compiled function, never constants inside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax import advantages as adv_lib
from starpo_jax.config import TrainConfig
from starpo_jax.filtering import gather_group_rows, select_groups
from starpo_jax.losses import (aggregate, aggregate_normaliser, kl_penalty, policy_loss,
                               token_entropy, value_loss)
from starpo_jax.models.decoder import Decoder
from starpo_jax.phases import PhaseClock, mark
from starpo_jax.rollout import Rollout, chunked_rollout
from starpo_jax.text.codec import Codec

Metrics = dict[str, jax.Array]
# Per step: how many minibatch updates were dropped for a non-finite loss or gradient.
SKIPPED_UPDATES = ("actor/skipped_updates", "critic/skipped_updates")


class TrainState(flax.struct.PyTreeNode):
    """Everything that changes between steps (critic fields None for GRPO, reference None when
    kl_coef is 0)."""

    actor: nnx.State
    actor_opt: optax.OptState
    critic: nnx.State | None
    critic_opt: optax.OptState | None
    reference: nnx.State | None
    step: jax.Array  # [] int32


def _optimizer(lr: float, config: TrainConfig) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(config.optim.max_grad_norm),
                       optax.adamw(lr, weight_decay=config.optim.weight_decay))


def _graphdef(model: Decoder, *, value_head: bool, remat: bool) -> nnx.GraphDef:
    """The structure of `model` (with a value head: the critic's), layers rematerialised in the
    backward pass when `remat`; the user's model and its config are left as they are."""
    if not value_head and remat == model.config.remat:
        return nnx.graphdef(model)
    config = dataclasses.replace(model.config, remat=remat)
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), value_head=value_head))
    return nnx.graphdef(abstract)


def _split_rows(tree: Any, pieces: int) -> Any:
    """Every leaf [rows, ...] -> [pieces, rows / pieces, ...]."""
    return jax.tree.map(lambda x: x.reshape(pieces, -1, *x.shape[1:]), tree)


def _merge_rows(tree: Any) -> Any:
    """Every leaf [pieces, rows / pieces, ...] -> [rows, ...] (undoes _split_rows)."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), tree)


def accumulated_grad(loss_fn: Callable[[Any, Any], tuple[jax.Array, Any]], params: Any, batch: Any,
                     micro_batches: int) -> tuple[Any, Any]:
    """Gradient of loss_fn(params, batch) -> (loss, aux) summed over `micro_batches` row slices.

    Every leaf of batch is [rows, ...] with rows divisible by micro_batches; the slices' grads
    are summed in a lax.scan, so only one slice's activations are live at a time. The sum is
    the whole batch's gradient when loss_fn normalises by the whole batch (see
    `losses.aggregate`'s normaliser). aux leaves [rows / micro_batches, ...] come back
    concatenated to [rows, ...].
    """
    grad_fn = jax.grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        return grad_fn(params, batch)

    def add_slice(total, piece):
        grads, aux = grad_fn(params, piece)
        return jax.tree.map(jnp.add, total, grads), aux

    grads, aux = jax.lax.scan(add_slice, jax.tree.map(jnp.zeros_like, params),
                              _split_rows(batch, micro_batches))
    return grads, _merge_rows(aux)


def in_row_slices(fn: Callable[[Any], Any], batch: Any, pieces: int) -> Any:
    """fn(batch) for a row-wise fn, computed on `pieces` row slices in turn (lax.map): the
    same rows out, with one slice's activations live at a time (the old, reference and value
    forwards of the update, under optim.micro_batches)."""
    if pieces == 1:
        return fn(batch)
    return _merge_rows(jax.lax.map(fn, _split_rows(batch, pieces)))


def apply_if_finite(tx: optax.GradientTransformation, grads: Any, opt_state: optax.OptState,
                    params: Any, loss: jax.Array, grad_norm: jax.Array,
                    ) -> tuple[Any, optax.OptState, jax.Array]:
    """tx's update of (params, opt_state) from grads, or both returned unchanged when the loss
    [] or the gradients' global norm [] is not finite (a NaN / inf anywhere in the gradients
    makes their norm non-finite). The choice is a select inside the compiled step, not a host
    round trip. Returns (params, opt_state, skipped: [] float32, 1.0 when the update was
    dropped).

    optax.apply_if_finite is not used: it adds counters to the optimiser state (checkpoints of
    older runs would no longer restore) and does not see the loss.
    """
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state),
            1.0 - finite.astype(jnp.float32))


def init_train_state(config: TrainConfig, key: jax.Array, *, model: Decoder) -> TrainState:
    """A fresh TrainState: actor = `model`'s weights; for PPO a critic with the same trunk and a
    new value head (initialised from `key`); a frozen copy as reference when kl_coef > 0."""
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  (no buffer shared: donation)
    actor = copy(nnx.state(model))
    critic = critic_opt = None
    if config.algo == "ppo":
        critic_model = Decoder(model.config, rngs=nnx.Rngs(key), value_head=True)
        nnx.update(critic_model, actor)
        critic = copy(nnx.state(critic_model))
        critic_opt = _optimizer(config.optim.critic_lr, config).init(critic)
    reference = copy(actor) if config.loss.kl_coef > 0 else None
    return TrainState(actor=actor, actor_opt=_optimizer(config.optim.actor_lr, config).init(actor),
                      critic=critic, critic_opt=critic_opt, reference=reference,
                      step=jnp.int32(0))


def reply_slots(loss_mask: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """Positions of the first `slots` reply tokens of each row, in order.

    loss_mask [B, L] bool -> (positions [B, slots] int32 (0 where unused), used [B, slots] bool).
    """
    b, length = loss_mask.shape
    rank = jnp.cumsum(loss_mask, axis=1) - 1
    target = jnp.where(loss_mask & (rank < slots), rank, slots)
    positions = jnp.zeros((b, slots), jnp.int32).at[jnp.arange(b)[:, None], target].set(
        jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length)), mode="drop")
    return positions, jnp.arange(slots) < jnp.minimum(loss_mask.sum(1), slots)[:, None]


def sequence_logprobs(model: Decoder, tokens: jax.Array, lengths: jax.Array,
                      loss_mask: jax.Array, slots: int, chunk: int,
                      ) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log p(tokens[t] | tokens[:t]) and that distribution's entropy, at reply
    tokens only.

    tokens [B, L] int32, lengths [B] int32, loss_mask [B, L] bool (reply tokens, none at t = 0);
    slots: static bound on reply tokens per row. Returns (logp, entropy), [B, L] float32, 0 off
    the mask. Logits exist only for the reply positions, `chunk` of them at a time, and are
    recomputed in the backward pass: the [*, V] projection is the costly part for small models.
    """
    b = tokens.shape[0]
    mask = jnp.arange(tokens.shape[1]) < lengths[:, None]
    hidden = model.hidden_states(tokens, attention_mask=mask)
    positions, used = reply_slots(loss_mask, slots)
    rows = jnp.arange(b)[:, None]
    # The hidden state at t - 1 predicts the token at t.
    h = hidden[rows, jnp.maximum(positions - 1, 0)]
    targets = tokens[rows, positions]
    pad = -slots % chunk
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    n = (slots + pad) // chunk

    @jax.checkpoint
    def one(xs):
        h, t = xs
        logits = model.logits_from_hidden(h)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(logp, t[..., None], axis=-1)[..., 0], token_entropy(logits)

    split = lambda x: jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)  # noqa: E731
    logp, entropy = jax.lax.map(one, (split(h), split(targets)))

    def scatter(x):
        x = jnp.moveaxis(x, 0, 1).reshape(b, -1)[:, :slots]
        cols = jnp.where(used, positions, tokens.shape[1])
        return jnp.zeros(tokens.shape, jnp.float32).at[rows, cols].set(x, mode="drop")

    return scatter(logp), scatter(entropy)


def sequence_values(critic: Decoder, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
    """V of the context before each token: [B, L] int32, [B] -> [B, L] float32 (0 at t = 0)."""
    mask = jnp.arange(tokens.shape[1]) < lengths[:, None]
    values = critic.value(tokens, attention_mask=mask)
    return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))


def token_rewards(batch: Rollout, placement: str) -> jax.Array:
    """Rewards (format penalties included) on reply tokens: [B, L] float32.

    "trajectory": the score on the last reply token of the row; "turn": each turn's reward on
    the last reply token of that turn.
    """
    positions = jnp.arange(batch.tokens.shape[1])
    if placement == "trajectory":
        last = jnp.max(jnp.where(batch.loss_mask, positions, -1), axis=1)
        return jnp.where(positions == last[:, None], batch.scores[:, None], 0.0)
    per_turn = batch.turn_rewards + batch.format_penalties  # [B, T]
    nxt = jnp.pad(batch.turn_ids[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
    ends = batch.loss_mask & (nxt != batch.turn_ids)
    reward = jnp.take_along_axis(per_turn, jnp.maximum(batch.turn_ids, 0), axis=1)
    return jnp.where(ends, reward, 0.0)


def _advantages(config: TrainConfig, batch: Rollout, values: jax.Array | None):
    a = config.advantage
    inputs = adv_lib.AdvantageInputs(
        token_rewards=token_rewards(batch, a.reward_placement), reply_mask=batch.loss_mask,
        values=values, turn_ids=batch.turn_ids,
        scores=batch.scores.reshape(-1, config.rollout.group_size))
    params: dict[str, Any] = {} if a.whiten is None else {"whiten_advantages": a.whiten}
    if config.algo == "grpo":
        return adv_lib.get_advantage_estimator("grpo")(inputs, mode=a.grpo_mode, **params)
    if a.estimator == "bi_level_gae":
        params["gamma_turn"] = a.gamma_turn
    return adv_lib.get_advantage_estimator(a.estimator)(inputs, gamma=a.gamma, lam=a.lam, **params)


def _mean(x: jax.Array, where: jax.Array) -> jax.Array:
    w = where.astype(jnp.float32)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def rollout_metrics(out: Rollout, kept: Rollout, group_std: jax.Array, kept_idx: jax.Array,
                    ) -> Metrics:
    """Rollout statistics (issue 6 names) from the whole batch and the filtered one."""
    reward, kept_reward = out.scores_without_penalty, kept.scores_without_penalty
    turns = out.turn_taken.sum(-1)
    steps = out.num_actions
    return {
        "train/success": out.success.mean(),
        "rollout/reward_mean": reward.mean(), "rollout/reward_std": reward.std(),
        "rollout/kept_reward_mean": kept_reward.mean(), "rollout/kept_reward_std": kept_reward.std(),
        "rollout/score_mean": out.scores.mean(),
        "rollout/in_group_std_mean": group_std.mean(), "rollout/in_group_std_max": group_std.max(),
        "rollout/chosen_in_group_std": group_std[kept_idx].mean(),
        "rollout/response_length": _mean(out.reply_lengths, out.turn_taken),
        "rollout/sequence_length": out.lengths.mean(),  # buffer tokens: prompts, env text, replies
        "rollout/think_length": _mean(out.think_tokens, out.turn_taken),
        "rollout/num_turns": turns.mean(),
        "rollout/num_actions": steps.mean(),
        "rollout/action_is_valid": _mean(out.format_ok, out.turn_taken),
        "rollout/action_is_effective": out.effective_actions.sum() / jnp.maximum(steps.sum(), 1),
        "rollout/format_penalty_rate": _mean(out.format_penalties < 0, out.turn_taken),
    }


def make_train_step(config: TrainConfig, env: Any, codec: Codec, *, model: Decoder, eos_id: int,
                    pad_id: int, mesh: jax.sharding.Mesh | None = None,
                    phase_clock: PhaseClock | None = None,
                    ) -> Callable[[TrainState, jax.Array], tuple[TrainState, Metrics]]:
    """The compiled step(train_state, key) -> (train_state, metrics); see the module docstring.

    codec must be built for this env and tokenizer with config.rollout's mode,
    max_actions_per_turn and reply_tokens (as max_tokens). With `mesh`, the step is jitted with
    the partition rules of `sharding.py` (batch over "fsdp", weights by logical axes).
    With `phase_clock`, the host is told as each phase ends (phases.py): "rollout_chunk" (index
    c, when rollout.chunks > 1), "rollout", "reference_logprobs" (kl_coef > 0), then per Online-k
    round "old_logprobs" (with the critic's values) and "update".
    """
    cfg, opt = config, config.optim
    ppo = config.algo == "ppo"
    actor_def = nnx.graphdef(model)  # the rollout's (its cached forward never rematerialises)
    train_def = _graphdef(model, value_head=False, remat=opt.remat)
    critic_def = _graphdef(model, value_head=True, remat=opt.remat) if ppo else None
    actor_tx, critic_tx = _optimizer(opt.actor_lr, config), _optimizer(opt.critic_lr, config)
    group = config.rollout.group_size
    if mesh is not None:
        from starpo_jax.sharding import constrain_batch
        constrain = lambda tree: constrain_batch(tree, mesh)  # noqa: E731
    else:
        constrain = lambda tree: tree  # noqa: E731

    updates_per_step = opt.rollout_reuse * opt.ppo_epochs * opt.minibatches
    slots = config.rollout.max_turns * config.rollout.reply_tokens
    chunk = min(opt.logit_chunk, slots)

    def logprobs(params, batch):
        return sequence_logprobs(nnx.merge(train_def, params), batch.tokens, batch.lengths,
                                 batch.loss_mask, slots, chunk)

    def forward_logprobs(params, batch):
        """logprobs without a gradient, in optim.micro_batches row slices (bounds memory)."""
        return in_row_slices(lambda b: logprobs(params, b), batch, opt.micro_batches)

    def actor_objective(logp, entropy, mb, normaliser):
        """(loss to minimise, metrics) of reply log-probs [rows, L] under the minibatch's
        normaliser: the loss of a slice of the minibatch is its share of the minibatch's."""
        mask, agg = mb["rollout"].loss_mask, cfg.loss.agg
        loss, stats = policy_loss(logp, mb["old_logp"], mb["advantages"], mask, cfg.loss.clip_low,
                                  cfg.loss.clip_high, cfg.loss.dual_clip, agg, normaliser)
        ent = aggregate(entropy, mask, agg, normaliser)
        aux = {"actor/pg_loss": loss, "actor/pg_clipfrac": stats.clipfrac_upper,
               "actor/pg_clipfrac_lower": stats.clipfrac_lower, "actor/ppo_kl": stats.approx_kl}
        total = loss - cfg.loss.entropy_coef * ent
        if cfg.loss.kl_coef > 0:
            kl = aggregate(kl_penalty(logp, mb["ref_logp"], cfg.loss.kl_kind), mask, agg,
                           normaliser)
            total, aux["actor/kl_loss"] = total + cfg.loss.kl_coef * kl, kl
        return total, aux

    def actor_loss(params, mb, normaliser):
        logp, entropy = logprobs(params, mb["rollout"])
        total, _ = actor_objective(logp, entropy, mb, normaliser)
        return total, (logp, entropy)

    def critic_objective(values, mb, normaliser):
        loss, stats = value_loss(values, mb["old_values"], mb["returns"], mb["rollout"].loss_mask,
                                 cfg.loss.value_clip, cfg.loss.agg, normaliser)
        return loss, {"critic/vf_loss": loss, "critic/vf_clipfrac": stats.clipfrac,
                      "critic/vf_explained_var": stats.explained_var,
                      "critic/values_mean": stats.values_mean,
                      "critic/returns_mean": stats.returns_mean}

    def critic_loss(params, mb, normaliser):
        batch = mb["rollout"]
        values = sequence_values(nnx.merge(critic_def, params), batch.tokens, batch.lengths)
        return critic_objective(values, mb, normaliser)[0], values

    def minibatch_update(state: TrainState, mb) -> tuple[TrainState, Metrics]:
        # Every micro-batch divides by the whole minibatch's count; the metrics are computed
        # once, from the whole minibatch's per-token outputs.
        normaliser = aggregate_normaliser(mb["rollout"].loss_mask, cfg.loss.agg)
        grads, (logp, entropy) = accumulated_grad(
            lambda p, b: actor_loss(p, b, normaliser), state.actor, mb, opt.micro_batches)
        loss, aux = actor_objective(logp, entropy, mb, normaliser)
        aux["actor/grad_norm"] = optax.tree.norm(grads)
        actor, actor_opt, aux["actor/skipped_updates"] = apply_if_finite(
            actor_tx, grads, state.actor_opt, state.actor, loss, aux["actor/grad_norm"])
        state = state.replace(actor=actor, actor_opt=actor_opt)
        if ppo:
            grads, values = accumulated_grad(
                lambda p, b: critic_loss(p, b, normaliser), state.critic, mb, opt.micro_batches)
            loss, critic_aux = critic_objective(values, mb, normaliser)
            aux.update(critic_aux, **{"critic/grad_norm": optax.tree.norm(grads)})
            critic, critic_opt, aux["critic/skipped_updates"] = apply_if_finite(
                critic_tx, grads, state.critic_opt, state.critic, loss, aux["critic/grad_norm"])
            state = state.replace(critic=critic, critic_opt=critic_opt)
        return state, aux

    def update_round(state: TrainState, key, batch: Rollout, ref_logp):
        """Old log-probs / values with the current weights, advantages, then the PPO passes."""
        old_logp, entropy = forward_logprobs(state.actor, batch)
        values = None
        if ppo:
            critic = nnx.merge(critic_def, state.critic)
            values = in_row_slices(lambda b: sequence_values(critic, b.tokens, b.lengths), batch,
                                   opt.micro_batches)
        old_logp, entropy, values = mark(phase_clock, "old_logprobs", (old_logp, entropy, values))
        advantages, returns = _advantages(config, batch, values)
        data = {"rollout": batch, "old_logp": old_logp, "advantages": advantages}
        if ppo:
            data.update(old_values=values, returns=returns)
        if ref_logp is not None:
            data["ref_logp"] = ref_logp
        rows = batch.tokens.shape[0]

        def epoch(state, epoch_key):
            order = jax.random.permutation(epoch_key, rows)
            split = lambda x: constrain(x[order].reshape(opt.minibatches, -1, *x.shape[1:]))  # noqa: E731
            return jax.lax.scan(minibatch_update, state, jax.tree.map(split, data))

        state, aux = jax.lax.scan(epoch, state, jax.random.split(key, opt.ppo_epochs))
        state = mark(phase_clock, "update", state)
        aux = jax.tree.map(jnp.mean, aux)
        aux["actor/entropy"] = aggregate(entropy, batch.loss_mask)
        return state, aux

    def step(state: TrainState, key: jax.Array) -> tuple[TrainState, Metrics]:
        rollout_key, update_key = jax.random.split(jax.random.fold_in(key, state.step))
        out = constrain(chunked_rollout(actor_def, state.actor, env, codec, config.rollout,
                                        rollout_key, eos_id=eos_id, pad_id=pad_id,
                                        clock=phase_clock))
        out = mark(phase_clock, "rollout", out)
        selection = select_groups(out.scores_without_penalty.reshape(-1, group),
                                  config.filter.keep_ratio, config.filter.mode)
        batch = constrain(gather_group_rows(out, selection.indices, group))
        ref_logp = None
        if config.loss.kl_coef > 0:
            ref_logp = mark(phase_clock, "reference_logprobs",
                            forward_logprobs(state.reference, batch)[0])

        def round_(state, round_key):
            return update_round(state, round_key, batch, ref_logp)

        state, aux = jax.lax.scan(round_, state, jax.random.split(update_key, opt.rollout_reuse))
        metrics = rollout_metrics(out, batch, selection.group_std, selection.indices)
        metrics.update(jax.tree.map(jnp.mean, aux))
        for name in SKIPPED_UPDATES:  # averaged over the updates like the rest: back to a count
            if name in metrics:
                metrics[name] = jnp.round(metrics[name] * updates_per_step)
        metrics = {k: v.astype(jnp.float32) for k, v in metrics.items()}
        return state.replace(step=state.step + 1), metrics

    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    from starpo_jax.sharding import jit_sharded_step
    abstract = jax.eval_shape(lambda: init_train_state(config, jax.random.PRNGKey(0), model=model))
    return jit_sharded_step(step, abstract, model, mesh)
