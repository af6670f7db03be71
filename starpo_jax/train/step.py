"""The StarPO / StarPO-S training step, as three public pieces and their composition.

    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    out = fns.rollout(state, key)                 # P x N trajectories (rollout.Rollout)
    batch = fns.prepare(state, out)               # filter, old log-probs, values, advantages
    state, metrics = fns.update(state, batch, key)  # the PPO / GRPO mini-batch updates
    state, metrics = fns.learn(state, out, key)   # Online-k rounds of both, metrics, step + 1
    state, metrics = fns.sft(state, rows)         # one supervised step (starpo_jax.run.sft)
    step = make_train_step(config, env, codec, ...)  # jit of the whole iteration, one program
    state, metrics = step(state, key)             # the state is donated: use the returned one

`prepare` and `update` take any `Rollout`, however it was produced (a JAX env's compiled
rollout, or a host-driven one). One iteration: rollout -> uncertainty filter on the summed env
rewards' in-group std or another filter.metric (K of P groups kept, static shapes [K * N, L])
-> Online-k rounds of { old log-probs and critic values with the current weights, advantages
from the registry (times filter.loss_scaling's kept share), ppo_epochs passes of
mini-batches of `optim.minibatch_rows` rows (AdamW; a mini-batch's gradient may be summed over
optim.micro_batches row slices, and the forwards without a gradient run in as many slices) }
-> a flat dict of float32 metrics. A mini-batch update whose loss or gradients are not finite
leaves the weights and optimiser state as they were and is counted (actor/skipped_updates,
critic/skipped_updates). With exactly one update on a rollout (one mini-batch, one
epoch, k = 1) the ratio is 1 by construction and the separate old-log-prob forward is skipped.
The reference forward exists only when loss.kl_coef > 0 (a Python branch on the static config).
Every forward over rows runs each group's first prompt once per row slice, the rows attending to
its keys and values (optim.shared_prefix, train/shared_prefix.py; a host rollout's rows run whole).
Parameters are arguments of the compiled function, never constants inside it.

With LoRA (config.lora.rank > 0; models/lora.py) the actor is the model with adapters; only the
adapters are differentiated and optimised, the base weights are frozen and shared: the critic
holds only its own adapters and value head (its base is the actor's), and the KL reference is
the base model (the actor's frozen weights without the adapters), not a copy.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax.algo import advantages as adv_lib
from starpo_jax.train.collapse import collapse_step_metrics
from starpo_jax.config import ESTIMATOR_PARAMS, TrainConfig
from starpo_jax.algo.failures import failure_fractions
from starpo_jax.algo.filtering import (VALUE_METRICS, GroupSelection, gather_group_rows, kept_share,
                                  select_groups)
from starpo_jax.train.forward import (accumulated_grad, in_row_slices, over_real_length,
                                sequence_logprobs, sequence_values)
from starpo_jax.algo.losses import aggregate, aggregate_normaliser, kl_penalty, policy_loss, value_loss
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import (adapted, base_config, fresh_trainable, joined,
                                    policy_structure, split_trainable, trainable_split)
from starpo_jax.models.sampler_weights import sampler_graphdef, sampler_params
from starpo_jax.phases import PhaseClock, mark
from starpo_jax.rollout.jax_env import Rollout, _prompt_widths, chunked_rollout, turn_samples
from starpo_jax.train.shared_prefix import (aligned_slots, group_sorted, plan_for, shared_logprobs,
                                      shared_values, slice_plans)
from starpo_jax.models.sharding import constrain_batch, gather_for_compute
from starpo_jax.text.codec import Codec

Metrics = dict[str, jax.Array]
# Per step: how many mini-batch updates were dropped for a non-finite loss or gradient (sums
# over the updates, where every other update metric is a mean).
SKIPPED_UPDATES = ("actor/skipped_updates", "critic/skipped_updates")


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


class Batch(flax.struct.PyTreeNode):
    """What an update learns from: the kept rows of a rollout (R = K * N) and what `prepare`
    computed on them. Optional fields are None when the config does not need them."""

    rollout: Rollout  # the kept rows, [R, L] / [R, T]
    selection: GroupSelection  # which groups were kept, and every group's reward std
    advantages: jax.Array  # [R, L] float32
    returns: jax.Array | None  # [R, L] float32 (PPO)
    old_values: jax.Array | None  # [R, L] float32 (PPO)
    old_logp: jax.Array | None  # [R, L] float32; None: one update, ratio 1 by construction
    ref_logp: jax.Array | None  # [R, L] float32 (kl_coef > 0)


class TrainFns(NamedTuple):
    """The pure pieces of one iteration (not jitted: compose them, or `jax.jit` each)."""

    rollout: Callable[[TrainState, jax.Array], Rollout]
    prepare: Callable[..., Batch]  # (state, rollout, ref_logp=None) -> Batch
    update: Callable[[TrainState, Batch, jax.Array], tuple[TrainState, Metrics]]
    learn: Callable[[TrainState, Rollout, jax.Array], tuple[TrainState, Metrics]]
    step: Callable[[TrainState, jax.Array], tuple[TrainState, Metrics]]
    # Supervised steps on reply tokens (starpo_jax.run.sft): (state, rows, shared) -> ...
    sft: Callable[..., tuple[TrainState, Metrics]]
    sft_loss: Callable[..., Metrics]


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
        critic_opt = _optimizer(config.optim.critic_lr, config).init(critic)
    reference = copy(actor) if config.loss.kl_coef > 0 else None
    return TrainState(actor=actor, actor_opt=_optimizer(config.optim.actor_lr, config).init(actor),
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
        critic_opt = _optimizer(config.optim.critic_lr, config).init(critic)
    actor_opt = _optimizer(config.optim.actor_lr, config).init(split_trainable(actor)[0])
    return TrainState(actor=actor, actor_opt=actor_opt, critic=critic, critic_opt=critic_opt,
                      reference=None, step=jnp.int32(0))


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


def advantages(config: TrainConfig, batch: Rollout, values: jax.Array | None,
               ) -> tuple[jax.Array, jax.Array | None]:
    """(advantages, returns | None) [R, L] of config.estimator (a name in the advantage
    registry), called with the AdvantageConfig values its signature names (ESTIMATOR_PARAMS;
    TrainConfig refuses a value set for a parameter the estimator does not have)."""
    a = config.advantage
    inputs = adv_lib.AdvantageInputs(
        token_rewards=token_rewards(batch, a.reward_placement), reply_mask=batch.loss_mask,
        values=values, turn_ids=batch.turn_ids,
        scores=batch.scores.reshape(-1, config.rollout.group_size),
        turn_rewards=batch.turn_rewards + batch.format_penalties,
        turn_anchors=batch.turn_anchors)
    fn = adv_lib.get_advantage_estimator(config.estimator)
    accepted = inspect.signature(fn).parameters
    offered = {param: getattr(a, field) for field, param in ESTIMATOR_PARAMS.items()
               if param in accepted and getattr(a, field) is not None}
    return fn(inputs, **offered)


def filter_values(out: Rollout, metric: str) -> jax.Array | None:
    """The per-trajectory values a filter metric ranks by besides the scores: [B] float32 mean
    sampled-token entropy (the sampler's, at the rollout temperature: the trainer's own up to
    rounding) for the entropy metrics, sampled-token count for "length"; None otherwise."""
    if metric not in VALUE_METRICS:
        return None
    mask = out.loss_mask.astype(jnp.float32)
    count = mask.sum(-1)
    if metric == "length":
        return count
    return jnp.sum(out.behaviour_entropy * mask, -1) / jnp.maximum(count, 1.0)


def filter_selection(out: Rollout, config: TrainConfig) -> GroupSelection:
    """The uncertainty filter's choice of groups for this rollout (config.filter; the scores
    without the format penalty, and the per-row values its metric ranks by)."""
    group = config.rollout.group_size
    per_row = filter_values(out, config.filter.metric)
    return select_groups(out.scores_without_penalty.reshape(-1, group), config.filter,
                         None if per_row is None else per_row.reshape(-1, group))


def _mean(x: jax.Array, where: jax.Array) -> jax.Array:
    w = where.astype(jnp.float32)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def logprob_diff(behaviour: jax.Array, logp: jax.Array, mask: jax.Array) -> Metrics:
    """Sampler / trainer mismatch: |behaviour log-prob - trainer log-prob| over sampled tokens."""
    diff = jnp.abs(behaviour - logp)
    return {"rollout/logprob_diff_mean": _mean(diff, mask),
            "rollout/logprob_diff_max": jnp.max(jnp.where(mask, diff, 0.0))}


def rollout_metrics(out: Rollout, batch: Batch) -> Metrics:
    """Statistics of the whole rollout and of its kept rows (the original's names, and
    rollout/anchor_share: GiGPO's share of taken turns whose start state another turn of the
    group shares)."""
    selection = batch.selection
    group = out.success.shape[0] // selection.group_std.shape[0]  # rollout.group_size
    reward = out.scores_without_penalty
    # The kept trajectories' rewards (batch.rollout's rows may be their turn samples), and the
    # groups really kept (a variable-count strategy keeps fewer than the static bound).
    kept = gather_group_rows(reward, selection.indices, group)
    really = jnp.repeat(selection.kept, group)
    kept_reward_mean = _mean(kept, really)
    kept_reward_std = jnp.sqrt(_mean(jnp.square(kept - kept_reward_mean), really))
    turns = out.turn_taken.sum(-1)
    steps = out.num_actions
    return {
        "train/success": out.success.mean(),
        "rollout/reward_mean": reward.mean(), "rollout/reward_std": reward.std(),
        "rollout/kept_reward_mean": kept_reward_mean, "rollout/kept_reward_std": kept_reward_std,
        "rollout/kept_groups": selection.kept.sum(),
        "rollout/score_mean": out.scores.mean(),
        "rollout/in_group_std_mean": selection.group_std.mean(),
        "rollout/in_group_std_max": selection.group_std.max(),
        "rollout/chosen_in_group_std": _mean(selection.group_std[selection.indices],
                                             selection.kept),
        "rollout/response_length": _mean(out.reply_lengths, out.turn_taken),
        "rollout/sequence_length": out.lengths.mean(),  # buffer tokens: prompts, env text, replies
        "rollout/think_length": _mean(out.think_tokens, out.turn_taken),
        "rollout/num_turns": turns.mean(),
        "rollout/num_actions": steps.mean(),
        "rollout/action_is_valid": _mean(out.format_ok, out.turn_taken),
        "rollout/action_is_effective": out.effective_actions.sum() / jnp.maximum(steps.sum(), 1),
        "rollout/format_penalty_rate": _mean(out.format_penalties < 0, out.turn_taken),
        # The sampler's entropy over every rolled-out row (the collapse monitor's signal; the
        # kept rows alone are the highest-std groups and would bias it upward).
        "actor/entropy": aggregate(out.behaviour_entropy, out.loss_mask),
        **({} if out.turn_anchors is None else {
            "rollout/anchor_share": adv_lib.anchor_share(out.turn_anchors, group)}),
        **{f"train/failure/{kind}": value
           for kind, value in failure_fractions(out.failure).items()},
    }


def shared_width(config: TrainConfig, codec: Codec | None,
                 mesh: jax.sharding.Mesh | None) -> int | None:
    """The width of the first prompt the update's forwards compute once per group, or None
    (every row whole): a host rollout (no codec) has no static first-prompt width, over a
    mesh the rows run whole (the packed shared-prefix forward is one row: it would not split),
    and turn samples (the limited context modes) share no first prompt."""
    if (config.optim.shared_prefix and codec is not None and mesh is None
            and not config.rollout.turn_samples):  # a turn sample's window is its own
        return _prompt_widths(codec)[0]
    return None


def make_train_fns(config: TrainConfig, env: Any, codec: Codec, *, model: Decoder, eos_id: int,
                   pad_id: int, mesh: jax.sharding.Mesh | None = None,
                   phase_clock: PhaseClock | None = None) -> TrainFns:
    """rollout / prepare / update and their composition `step` (see the module docstring).

    codec must be built for this env and tokenizer with config.rollout's mode,
    max_actions_per_turn, max_actions_per_traj and announced_tokens (as max_tokens). With
    `mesh`, batch axes are constrained to "fsdp".
    With `phase_clock`, the host is told as each phase ends (phases.py): "rollout_chunk" (index
    c, when rollout.chunks > 1), "rollout", "reference_logprobs" (kl_coef > 0), then per Online-k
    round "old_logprobs" (with the critic's values) and "update".
    """
    cfg, opt = config, config.optim
    ppo = config.algo == "ppo"
    lora = config.lora.rank > 0
    model = policy_structure(model, config.lora)
    actor_def = nnx.graphdef(model)  # the cached forward never rematerialises
    # The rollout samples with the policy as one plain model (adapters merged), in
    # rollout.sampler_dtype (models/sampler_weights.py).
    sampler_dtype = config.rollout.sampler_dtype
    sampler_def = sampler_graphdef(model, sampler_dtype)
    train_def = _graphdef(model, value_head=False, remat=opt.remat)
    critic_def = _graphdef(model, value_head=True, remat=opt.remat) if ppo else None
    if lora and cfg.loss.kl_coef > 0:  # the reference: the base, the adapters switched off
        base = nnx.eval_shape(lambda: Decoder(base_config(model.config), rngs=nnx.Rngs(0)))
        reference_def = _graphdef(base, value_head=False, remat=opt.remat)
    actor_tx, critic_tx = _optimizer(opt.actor_lr, config), _optimizer(opt.critic_lr, config)
    group, minibatches = config.rollout.group_size, config.minibatches
    constrain = lambda tree, axis=0: constrain_batch(tree, mesh, axis)  # noqa: E731
    # Weights gathered for each forward (stored sharded); the rows split instead.
    gather = lambda params: gather_for_compute(params, model, mesh)  # noqa: E731

    # Reply tokens a row holds at most: a turn sample holds one turn's.
    slots = config.rollout.reply_tokens * (1 if config.rollout.turn_samples
                                           else config.rollout.max_turns)
    chunk = min(opt.logit_chunk, slots)
    temperature = config.rollout.temperature
    # The plans of the shared-prefix forward over prepare's and update's row slices (None: per
    # row).
    prepare_plan, update_plan = slice_plans(shared_width(config, codec, mesh), config)
    kept_groups = jnp.arange(config.kept_rows, dtype=jnp.int32) // group  # of each kept row

    def logprobs(params, batch, groups, plan, graph=train_def):
        model = nnx.merge(graph, gather(params))
        if plan is None:
            return sequence_logprobs(model, batch.tokens, batch.lengths, batch.loss_mask, slots,
                                     chunk, temperature)
        return shared_logprobs(model, batch, groups, plan, slots, chunk, temperature)

    def critic_values(params, batch, groups, plan):
        critic = nnx.merge(critic_def, gather(params))
        if plan is None:
            return sequence_values(critic, batch.tokens, batch.lengths)
        return shared_values(critic, batch, groups, plan)

    def over_length(fn, rows, tree, plan):
        """over_real_length(fn, tree) for the forward over `rows` under `plan`: the columns it
        reads are the longest row's, or with a shared prefix the prefix width (the least width
        it takes) and the longest suffix."""
        if plan is None:
            need, floor = jnp.max(rows.lengths), 1
        else:
            need, floor = jnp.max(rows.lengths - rows.prompt_lengths) + plan.width, plan.width
        return over_real_length(fn, tree, need, rows.tokens.shape[1], floor)

    def forward_logprobs(params, batch, graph=train_def):
        """Log-probs without a gradient, in optim.micro_batches row slices (bounds memory),
        over the batch's real length."""
        def run(batch):
            return (), in_row_slices(lambda b: logprobs(params, *b, prepare_plan, graph)[0],
                                     (batch, kept_groups), opt.micro_batches, mesh)

        return over_length(run, batch, batch, prepare_plan)[1]

    def reference_logprobs(state, batch):
        if lora:
            base = trainable_split(state.actor, lora)[1]
            return forward_logprobs(base, batch, reference_def)
        return forward_logprobs(state.reference, batch)

    def critic_params(state):
        return joined(state.critic, trainable_split(state.actor, lora)[1])

    def actor_objective(logp, entropy, mb, normaliser):
        """(loss to minimise, metrics) of reply log-probs [rows, L] under the minibatch's
        normaliser: the loss of a slice of the minibatch is its share of the minibatch's."""
        mask, agg = mb["rollout"].loss_mask, cfg.loss.agg
        old = mb["old_logp"] if "old_logp" in mb else jax.lax.stop_gradient(logp)
        loss, stats = policy_loss(logp, old, mb["advantages"], mask, cfg.loss.clip_low,
                                  cfg.loss.clip_high, cfg.loss.dual_clip, agg, normaliser)
        ent = aggregate(entropy, mask, agg, normaliser)
        # verl's names with verl's meaning (either band; the dual-clip share), and this
        # project's split of the bands under names of its own.
        aux = {"actor/pg_loss": loss, "actor/pg_clipfrac": stats.clipfrac,
               "actor/pg_clipfrac_lower": stats.clipfrac_dual,
               "actor/pg_clipfrac_high": stats.clipfrac_upper,
               "actor/pg_clipfrac_low": stats.clipfrac_lower, "actor/ppo_kl": stats.approx_kl,
               "actor/entropy_kept": aggregate(entropy, mask)}  # token mean, as actor/entropy
        total = loss - cfg.loss.entropy_coef * ent
        if cfg.loss.kl_coef > 0:
            kl = aggregate(kl_penalty(logp, mb["ref_logp"], cfg.loss.kl_kind), mask, agg,
                           normaliser)
            total, aux["actor/kl_loss"] = total + cfg.loss.kl_coef * kl, kl
        return total, aux

    def actor_loss(params, mb, normaliser):
        logp, entropy = logprobs(params, mb["rollout"], mb["groups"], update_plan)
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
        values = critic_values(params, mb["rollout"], mb["groups"], update_plan)
        return critic_objective(values, mb, normaliser)[0], values

    def minibatch_update(state: TrainState, mb) -> tuple[TrainState, Metrics]:
        # Every micro-batch divides by the whole minibatch's count; the metrics are computed
        # once, from the whole minibatch's per-token outputs.
        normaliser = aggregate_normaliser(mb["rollout"].loss_mask, cfg.loss.agg, slots)
        used = mb["rollout"].loss_mask.any()
        trainable, frozen = trainable_split(state.actor, lora)
        # The passes run over the mini-batch's real length (forward.over_real_length).
        grads, (logp, entropy) = over_length(lambda mb: accumulated_grad(
            lambda p, b: actor_loss(joined(p, frozen), b, normaliser), trainable, mb,
            opt.micro_batches, mesh), mb["rollout"], mb, update_plan)
        loss, aux = actor_objective(logp, entropy, mb, normaliser)
        if "old_logp" not in mb:  # the one update: these log-probs are the pre-update ones
            aux.update(logprob_diff(mb["rollout"].behaviour_logp, logp, mb["rollout"].loss_mask))
        aux["actor/grad_norm"] = optax.tree.norm(grads)
        actor, actor_opt, aux["actor/skipped_updates"] = apply_if(
            used, actor_tx, grads, state.actor_opt, trainable, loss, aux["actor/grad_norm"])
        state = state.replace(actor=joined(actor, frozen), actor_opt=actor_opt)
        aux["used"] = used
        if ppo:
            grads, values = over_length(lambda mb: accumulated_grad(
                lambda p, b: critic_loss(joined(p, frozen), b, normaliser), state.critic, mb,
                opt.micro_batches, mesh), mb["rollout"], mb, update_plan)
            loss, critic_aux = critic_objective(values, mb, normaliser)
            aux.update(critic_aux, **{"critic/grad_norm": optax.tree.norm(grads)})
            critic, critic_opt, aux["critic/skipped_updates"] = apply_if(
                used, critic_tx, grads, state.critic_opt, state.critic, loss,
                aux["critic/grad_norm"])
            state = state.replace(critic=critic, critic_opt=critic_opt)
        return state, aux

    def rollout(state: TrainState, key: jax.Array) -> Rollout:
        params = sampler_params(gather(state.actor), model.config, sampler_dtype)
        out = chunked_rollout(sampler_def, params, env, codec, config.rollout, key,
                              eos_id=eos_id, pad_id=pad_id, clock=phase_clock, mesh=mesh)
        return mark(phase_clock, "rollout", constrain(out))

    def prepare(state: TrainState, out: Rollout, ref_logp: jax.Array | None = None) -> Batch:
        """Filter, then (with the current weights) reference / old log-probs, values and
        advantages of the kept rows. ref_logp: the reference log-probs of an earlier round."""
        selection = filter_selection(out, config)
        kept = gather_group_rows(out, selection.indices, group)
        # Groups not really kept stay in the static batch but out of every loss and statistic.
        kept = kept.replace(loss_mask=kept.loss_mask & jnp.repeat(selection.kept, group)[:, None])
        if config.rollout.turn_samples:  # the kept trajectories' turn samples, as rows
            kept = turn_samples(kept)
        kept = constrain(kept)
        if cfg.loss.kl_coef > 0 and ref_logp is None:
            # The barrier also holds back `kept`, so the forwards below come after this mark.
            ref_logp, kept = mark(phase_clock, "reference_logprobs",
                                  (reference_logprobs(state, kept), kept))
        old_logp = None if config.single_update else forward_logprobs(state.actor, kept)
        values = None
        if ppo:
            values = in_row_slices(
                lambda b: critic_values(critic_params(state), *b, prepare_plan),
                (kept, kept_groups), opt.micro_batches, mesh)
        # With `kept` inside, the mark waits for the rollout even when nothing was computed.
        old_logp, values, kept = mark(phase_clock, "old_logprobs", (old_logp, values, kept))
        adv, returns = advantages(config, kept, values)
        adv = adv * kept_share(selection, config.filter)  # filter.loss_scaling
        return Batch(rollout=kept, selection=selection, advantages=adv, returns=returns,
                     old_values=values, old_logp=old_logp, ref_logp=ref_logp)

    def update(state: TrainState, batch: Batch, key: jax.Array) -> tuple[TrainState, Metrics]:
        """ppo_epochs passes over the batch in shuffled mini-batches -> (state, mean metrics)."""
        data = {"rollout": batch.rollout, "advantages": batch.advantages, "groups": kept_groups}
        for name in ("old_logp", "ref_logp", "old_values", "returns"):
            if getattr(batch, name) is not None:
                data[name] = getattr(batch, name)
        rows = batch.advantages.shape[0]

        def epoch(state, epoch_key):
            order = jax.random.permutation(epoch_key, rows)
            # Rows of kept groups first: the mini-batches left without one make no update, so
            # as many updates are made as the original's mini-batches of the kept rows.
            order = order[jnp.argsort(~batch.rollout.loss_mask[order].any(1), stable=True)]
            order = group_sorted(order, minibatches, group)  # each mini-batch's rows by group
            # [minibatches, rows, ...]: each mini-batch's rows split over the devices (axis 1),
            # not the mini-batch index (that would leave each scanned mini-batch on one device).
            split = lambda x: x[order].reshape(minibatches, -1, *x.shape[1:])  # noqa: E731
            return jax.lax.scan(minibatch_update, state,
                                constrain(jax.tree.map(split, data), 1))

        state, aux = jax.lax.scan(epoch, state, jax.random.split(key, opt.ppo_epochs))
        state = mark(phase_clock, "update", state)
        skipped = {k: aux.pop(k).sum() for k in SKIPPED_UPDATES if k in aux}
        used = aux.pop("used").astype(jnp.float32)  # means over the mini-batches that updated
        aux = jax.tree.map(lambda v: jnp.sum(v * used) / jnp.maximum(used.sum(), 1.0), aux)
        aux.update(skipped)
        if batch.old_logp is not None:
            aux.update(logprob_diff(batch.rollout.behaviour_logp, batch.old_logp,
                                    batch.rollout.loss_mask))
        return state, aux

    def learn(state: TrainState, out: Rollout, update_key: jax.Array,
              ) -> tuple[TrainState, Metrics]:
        """Everything after the rollout: Online-k rounds of prepare + update, the metrics, and
        the step counter advanced (a host rollout trains through this too)."""
        collapse = collapse_step_metrics(config.collapse, config.rollout, codec, actor_def,
                                         gather(state.actor), out, state.step,
                                         logit_chunk=opt.logit_chunk)
        keys = jax.random.split(update_key, opt.rollout_reuse)
        batch = prepare(state, out)
        state, aux = update(state, batch, keys[0])
        if opt.rollout_reuse > 1:  # Online-k: later rounds re-prepare with the current weights
            def again(state, round_key):
                return update(state, prepare(state, out, batch.ref_logp), round_key)

            state, more = jax.lax.scan(again, state, keys[1:])
            aux = {k: (v + more[k].sum()) / (1 if k in SKIPPED_UPDATES else opt.rollout_reuse)
                   for k, v in aux.items()}
        metrics = rollout_metrics(out, batch)
        metrics.update(aux, **collapse)
        metrics = {k: v.astype(jnp.float32) for k, v in metrics.items()}
        return state.replace(step=state.step + 1), metrics

    def step(state: TrainState, key: jax.Array) -> tuple[TrainState, Metrics]:
        rollout_key, update_key = jax.random.split(jax.random.fold_in(key, state.step))
        return learn(state, rollout(state, rollout_key), update_key)

    def sft_plan(rows: Any, shared: bool):
        """The update's forward plan for rows [R, L] cut in optim.micro_batches slices: each
        group's first prompt once when `shared` (group-major rollout rows of group_size),
        else every row whole."""
        count = rows.tokens.shape[0]
        if count % opt.micro_batches:
            raise ValueError(f"optim.micro_batches = {opt.micro_batches} must divide the "
                             f"{count} rows of an SFT batch")
        per = count // opt.micro_batches
        groups = jnp.arange(count, dtype=jnp.int32) // (group if shared else 1)
        width = shared_width(config, codec, mesh) if shared else None
        return plan_for(width, per, aligned_slots(count, per, group) if shared else per), groups

    def sft_objective(params, mb, plan, normaliser):
        """Summed negative log-likelihood of the slice's reply tokens / normaliser."""
        logp, _ = logprobs(params, mb["rows"], mb["groups"], plan)
        return -jnp.sum(logp * mb["rows"].loss_mask) / normaliser, logp

    def sft(state: TrainState, rows: Any, shared: bool = False) -> tuple[TrainState, Metrics]:
        """One AdamW step on the token-mean cross-entropy of rows' loss_mask tokens (rows: a
        Rollout or demonstrations.TokenizedRows, [R, L]), through the update's forward
        (shared prefix, micro-batches, LoRA adapters only, skipped when not finite)."""
        plan, groups = sft_plan(rows, shared)
        normaliser = jnp.maximum(rows.loss_mask.sum(), 1).astype(jnp.float32)
        trainable, frozen = trainable_split(state.actor, lora)
        grads, logp = accumulated_grad(
            lambda p, mb: sft_objective(joined(p, frozen), mb, plan, normaliser), trainable,
            {"rows": rows, "groups": groups}, opt.micro_batches, mesh)
        loss = -jnp.sum(logp * rows.loss_mask) / normaliser
        aux = {"sft/loss": loss, "actor/grad_norm": optax.tree.norm(grads),
               "sft/reply_tokens": rows.loss_mask.sum() / rows.loss_mask.shape[0]}
        actor, actor_opt, aux["actor/skipped_updates"] = apply_if(
            rows.loss_mask.any(), actor_tx, grads, state.actor_opt, trainable, loss,
            aux["actor/grad_norm"])
        aux = {k: v.astype(jnp.float32) for k, v in aux.items()}
        return state.replace(actor=joined(actor, frozen), actor_opt=actor_opt,
                             step=state.step + 1), aux

    def sft_loss(actor: nnx.State, rows: Any, shared: bool = False) -> Metrics:
        """{"loss": token-mean cross-entropy} of rows' loss_mask tokens under the policy
        `actor` (a TrainState's), no gradient, in optim.micro_batches slices."""
        plan, groups = sft_plan(rows, shared)
        logp = in_row_slices(lambda b: logprobs(actor, b[0], b[1], plan)[0],
                             (rows, groups), opt.micro_batches, mesh)
        return {"loss": -jnp.sum(logp * rows.loss_mask) / jnp.maximum(rows.loss_mask.sum(), 1)}

    return TrainFns(rollout=rollout, prepare=prepare, update=update, learn=learn, step=step,
                    sft=sft, sft_loss=sft_loss)


def make_train_step(config: TrainConfig, env: Any, codec: Codec, *, model: Decoder, eos_id: int,
                    pad_id: int, mesh: jax.sharding.Mesh | None = None,
                    phase_clock: PhaseClock | None = None,
                    ) -> Callable[[TrainState, jax.Array], tuple[TrainState, Metrics]]:
    """The compiled step(train_state, key) -> (train_state, metrics): `make_train_fns(...).step`
    under one jax.jit (with `mesh`: the partition rules of `models/sharding.py`, batch over "fsdp",
    weights by logical axes). The state is donated."""
    step = make_train_fns(config, env, codec, model=model, eos_id=eos_id, pad_id=pad_id,
                          mesh=mesh, phase_clock=phase_clock).step
    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    from starpo_jax.models.sharding import jit_sharded_step
    abstract = jax.eval_shape(lambda: init_train_state(config, jax.random.PRNGKey(0), model=model))
    return jit_sharded_step(step, abstract, policy_structure(model, config.lora), mesh)
