"""The learner: everything a step does after its rollout, built from the config and the model
alone (no env, no codec), so any `Rollout` trains through it, a JAX env's compiled one
(train/step.py) or a host env's (run/host_train.py).

    learner = make_learner(config, model=model)         # + prompt_width, first_turn, mesh, clock
    batch = learner.prepare(state, out)                 # filter, old log-probs, values, advantages
    state, metrics = learner.update(state, batch, key)  # ppo_epochs x mini-batch updates
    state, metrics = learner.learn(state, out, key)     # Online-k rounds of both, metrics, step + 1
    state, metrics = learner.sft(state, rows)           # one supervised step (starpo_jax.run.sft)

After the rollout: uncertainty filter on the summed env rewards' in-group std or another
filter.metric (K of P groups kept, static shapes [K * N, L]) -> Online-k rounds of { old
log-probs and critic values with the current weights, advantages from the registry (times
filter.loss_scaling's kept share), ppo_epochs passes of mini-batches of `optim.minibatch_rows`
rows (AdamW; a mini-batch's gradient may be summed over optim.micro_batches row slices, and the
forwards without a gradient run in as many slices) } -> a flat dict of float32 metrics. A
mini-batch update whose loss or gradients are not finite leaves the weights and optimiser state
as they were and is counted (actor/skipped_updates, critic/skipped_updates). With exactly one
update on a rollout (one mini-batch, one epoch, k = 1) the ratio is 1 by construction and the
separate old-log-prob forward is skipped. The reference forward exists only when
loss.kl_coef > 0 (a Python branch on the static config). Given a prompt_width, every forward over
rows runs each group's first prompt once per row slice, the rows attending to its keys and
values (optim.shared_prefix, train/shared_prefix.py). Parameters are arguments of the compiled
function, never constants inside it. With LoRA see train/state.py.

The module reads in execution order: make_learner (prepare, update, the mini-batch update and its
losses, learn, sft), then the module-level pieces of each phase in the same order.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from starpo_jax.algo import advantages as adv_lib
from starpo_jax.algo import reweighting
from starpo_jax.algo.filtering import (VALUE_METRICS, GroupSelection, gather_group_rows,
                                       kept_share, select_groups)
from starpo_jax.algo.losses import (aggregate, aggregate_normaliser, kl_penalty, policy_loss,
                                    value_loss)
from starpo_jax.config import ESTIMATOR_PARAMS, LossConfig, TrainConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.lora import base_config, joined, policy_structure, trainable_split
from starpo_jax.models.sharding import constrain_batch, gather_for_compute
from starpo_jax.phases import PhaseClock, mark
from starpo_jax.rollout.jax_env import Rollout, turn_samples
from starpo_jax.train.batch import Batch, MiniBatch
from starpo_jax.train.collapse import FirstTurn, collapse_step_metrics
from starpo_jax.train.forward import (accumulated_grad, in_row_slices, over_real_length,
                                      sequence_logprobs, sequence_values)
from starpo_jax.train.metrics import (SKIPPED_UPDATES, Metrics, logprob_diff, mean_over_updates,
                                      rollout_metrics)
from starpo_jax.train.shared_prefix import (PrefixPlan, aligned_slots, group_sorted, plan_for,
                                            shared_logprobs, shared_values, slice_plans)
from starpo_jax.train.state import TrainState, apply_if, optimizer


class Learner(NamedTuple):
    """The pure pieces of learning from a rollout (not jitted: compose them, or `jax.jit`
    each)."""

    prepare: Callable[..., Batch]  # (state, rollout, ref_logp=None) -> Batch
    update: Callable[[TrainState, Batch, jax.Array], tuple[TrainState, Metrics]]
    learn: Callable[[TrainState, Rollout, jax.Array], tuple[TrainState, Metrics]]
    # Supervised steps on reply tokens (starpo_jax.run.sft): (state, rows, shared) -> ...
    sft: Callable[..., tuple[TrainState, Metrics]]
    sft_loss: Callable[..., Metrics]


def make_learner(config: TrainConfig, *, model: Decoder, prompt_width: int | None = None,
                 first_turn: Callable[[Rollout], FirstTurn] | None = None,
                 mesh: jax.sharding.Mesh | None = None,
                 phase_clock: PhaseClock | None = None) -> Learner:
    """prepare / update / learn / sft (see the module docstring) for rollouts of config.rollout's
    shape.

    prompt_width: the padded width of the first prompt every row of a group starts with, run
    once per group by the forwards (`step.shared_width` of a JAX env's rollout); None: every
    row runs whole (a host rollout). first_turn: where a rollout's first prompts and replies
    lie (`collapse.first_turn` with the rollout's codec), needed when config.collapse.every > 0.
    With `mesh`, batch axes are constrained to "fsdp". With `phase_clock`, the host is told as
    each phase ends (phases.py): "reference_logprobs" (kl_coef > 0), then per Online-k round
    "old_logprobs" (with the critic's values) and "update".
    """
    opt, loss = config.optim, config.loss
    ppo, lora = config.algo == "ppo", config.lora.rank > 0
    group, minibatches = config.rollout.group_size, config.minibatches
    model = policy_structure(model, config.lora)
    actor_def = nnx.graphdef(model)  # the collapse metrics' cached forward never rematerialises
    actor_tx, critic_tx = optimizer(opt.actor_lr, config), optimizer(opt.critic_lr, config)
    constrain = lambda tree, axis=0: constrain_batch(tree, mesh, axis)  # noqa: E731
    # Weights gathered for each forward (stored sharded); the rows split instead.
    gather = lambda params: gather_for_compute(params, model, mesh)  # noqa: E731
    forwards = Forwards.of(config, model, gather, mesh)
    # The plans of the shared-prefix forward over prepare's and update's row slices (None: per
    # row).
    prepare_plan, update_plan = slice_plans(prompt_width, config)
    kept_groups = jnp.arange(config.kept_rows, dtype=jnp.int32) // group  # of each kept row

    def prepare(state: TrainState, out: Rollout, ref_logp: jax.Array | None = None) -> Batch:
        """Filter, then (with the current weights) reference / old log-probs, values and
        advantages of the kept rows. ref_logp: the reference log-probs of an earlier round."""
        selection = filter_selection(out, config)
        kept = gather_group_rows(out, selection.indices, group)
        # Groups not really kept stay in the static batch but out of every loss and statistic.
        kept = kept.replace(loss_mask=kept.loss_mask & jnp.repeat(selection.kept, group)[:, None])
        # advantage.reward_normalization_* (None: off), over the whole rollout (algo/reweighting)
        scores = reweighting.normalized_kept_scores(config, out.scores, selection.indices)
        if config.rollout.turn_samples:  # the kept trajectories' turn samples, as rows
            kept = turn_samples(kept)
        kept = constrain(kept)
        if loss.kl_coef > 0 and ref_logp is None:
            # The barrier also holds back `kept`, so the forwards below come after this mark.
            ref_logp, kept = mark(phase_clock, "reference_logprobs",
                                  (reference_logprobs(state, kept), kept))
        old_logp = None if config.single_update else forwards.no_grad_logprobs(
            state.actor, kept, kept_groups, prepare_plan)
        values = None
        if ppo:
            values = forwards.no_grad_values(critic_params(state, lora), kept, kept_groups,
                                             prepare_plan)
        # With `kept` inside, the mark waits for the rollout even when nothing was computed.
        old_logp, values, kept = mark(phase_clock, "old_logprobs", (old_logp, values, kept))
        adv, returns = advantages(config, kept, values,
                                  reweighting.per_row(scores, kept.tokens.shape[0]))
        adv = adv * kept_share(selection, config.filter)  # filter.loss_scaling
        # RAGEN-2's soft reweight, length weight, zero task advantage (no-ops when off)
        adv = reweighting.adjust_advantages(config, adv, kept, scores, selection.kept)
        return Batch(rollout=kept, selection=selection, advantages=adv, returns=returns,
                     old_values=values, old_logp=old_logp, ref_logp=ref_logp)

    def reference_logprobs(state: TrainState, kept: Rollout) -> jax.Array:
        """The KL reference's log-probs of the kept rows: with LoRA the base weights (the
        adapters switched off), else the frozen copy."""
        if lora:
            base = trainable_split(state.actor, lora)[1]
            return forwards.no_grad_logprobs(base, kept, kept_groups, prepare_plan,
                                             forwards.reference_def)
        return forwards.no_grad_logprobs(state.reference, kept, kept_groups, prepare_plan)

    def update(state: TrainState, batch: Batch, key: jax.Array) -> tuple[TrainState, Metrics]:
        """ppo_epochs passes over the batch in shuffled mini-batches -> (state, mean metrics)."""
        every_row = MiniBatch.of(batch, kept_groups)
        rows = batch.advantages.shape[0]

        def epoch(state: TrainState, epoch_key: jax.Array) -> tuple[TrainState, Metrics]:
            order = jax.random.permutation(epoch_key, rows)
            # Rows of kept groups first: the mini-batches left without one make no update, so
            # as many updates are made as the original's mini-batches of the kept rows.
            order = order[jnp.argsort(~batch.rollout.loss_mask[order].any(1), stable=True)]
            order = group_sorted(order, minibatches, group)  # each mini-batch's rows by group
            # [minibatches, rows, ...]: each mini-batch's rows split over the devices (axis 1),
            # not the mini-batch index (that would leave each scanned mini-batch on one device).
            split = lambda x: x[order].reshape(minibatches, -1, *x.shape[1:])  # noqa: E731
            return jax.lax.scan(minibatch_update, state,
                                constrain(jax.tree.map(split, every_row), 1))

        state, aux = jax.lax.scan(epoch, state, jax.random.split(key, opt.ppo_epochs))
        state = mark(phase_clock, "update", state)
        aux = mean_over_updates(aux)
        if batch.old_logp is not None:
            aux.update(logprob_diff(batch.rollout.behaviour_logp, batch.old_logp,
                                    batch.rollout.loss_mask))
        return state, aux

    def minibatch_update(state: TrainState, mb: MiniBatch) -> tuple[TrainState, Metrics]:
        """One AdamW step of the actor (and the critic) on one mini-batch, skipped when the
        mini-batch holds no kept token or is not finite (apply_if); its metrics and "used"."""
        # Every micro-batch divides by the whole minibatch's count; the metrics are computed
        # once, from the whole minibatch's per-token outputs.
        normaliser = aggregate_normaliser(mb.rollout.loss_mask, loss.agg, forwards.slots)
        used = mb.rollout.loss_mask.any()
        trainable, frozen = trainable_split(state.actor, lora)
        # The passes run over the mini-batch's real length (forward.over_real_length).
        grads, (logp, entropy) = over_rows_length(lambda mb: accumulated_grad(
            lambda p, b: actor_loss(joined(p, frozen), b, normaliser), trainable, mb,
            opt.micro_batches, mesh), mb.rollout, mb, update_plan)
        total, aux = actor_objective(logp, entropy, mb, normaliser, loss)
        if mb.old_logp is None:  # the one update: these log-probs are the pre-update ones
            aux.update(logprob_diff(mb.rollout.behaviour_logp, logp, mb.rollout.loss_mask))
        aux["actor/grad_norm"] = optax.tree.norm(grads)
        actor, actor_opt, aux["actor/skipped_updates"] = apply_if(
            used, actor_tx, grads, state.actor_opt, trainable, total, aux["actor/grad_norm"])
        state = state.replace(actor=joined(actor, frozen), actor_opt=actor_opt)
        aux["used"] = used
        if ppo:
            grads, values = over_rows_length(lambda mb: accumulated_grad(
                lambda p, b: critic_loss(joined(p, frozen), b, normaliser), state.critic, mb,
                opt.micro_batches, mesh), mb.rollout, mb, update_plan)
            total, critic_aux = critic_objective(values, mb, normaliser, loss)
            aux.update(critic_aux, **{"critic/grad_norm": optax.tree.norm(grads)})
            critic, critic_opt, aux["critic/skipped_updates"] = apply_if(
                used, critic_tx, grads, state.critic_opt, state.critic, total,
                aux["critic/grad_norm"])
            state = state.replace(critic=critic, critic_opt=critic_opt)
        return state, aux

    def actor_loss(params: nnx.State, mb: MiniBatch, normaliser: jax.Array) -> tuple[Any, Any]:
        """(actor_objective's loss, (log-probs, entropies)) of a micro-batch: what is
        differentiated."""
        logp, entropy = forwards.logprobs(params, mb.rollout, mb.groups, update_plan)
        total, _ = actor_objective(logp, entropy, mb, normaliser, loss)
        return total, (logp, entropy)

    def critic_loss(params: nnx.State, mb: MiniBatch, normaliser: jax.Array) -> tuple[Any, Any]:
        """(critic_objective's loss, values) of a micro-batch: what is differentiated."""
        values = forwards.values(params, mb.rollout, mb.groups, update_plan)
        return critic_objective(values, mb, normaliser, loss)[0], values

    def learn(state: TrainState, out: Rollout, update_key: jax.Array,
              ) -> tuple[TrainState, Metrics]:
        """Everything after the rollout: Online-k rounds of prepare + update, the metrics, and
        the step counter advanced."""
        collapse = collapse_step_metrics(config.collapse, config.rollout, first_turn, actor_def,
                                         gather(state.actor), out, state.step,
                                         logit_chunk=opt.logit_chunk)
        keys = jax.random.split(update_key, opt.rollout_reuse)
        batch = prepare(state, out)
        state, aux = update(state, batch, keys[0])
        if opt.rollout_reuse > 1:  # Online-k: later rounds re-prepare with the current weights
            def again(state, round_key):
                return update(state, prepare(state, out, batch.ref_logp), round_key)

            state, more = jax.lax.scan(again, state, keys[1:])
            aux = {k: (v + more[k].sum()) / (1 if k in SKIPPED_UPDATES
                                                        else opt.rollout_reuse)
                   for k, v in aux.items()}
        metrics = rollout_metrics(out, batch)
        metrics.update(aux, **collapse, **reweighting.soft_weight_metrics(config, out, batch))
        metrics = {k: v.astype(jnp.float32) for k, v in metrics.items()}
        return state.replace(step=state.step + 1), metrics

    def sft(state: TrainState, rows: Any, shared: bool = False) -> tuple[TrainState, Metrics]:
        """One AdamW step on the token-mean cross-entropy of rows' loss_mask tokens (rows: a
        Rollout or demonstrations.TokenizedRows, [R, L]), through the update's forward
        (shared prefix, micro-batches, LoRA adapters only, skipped when not finite)."""
        plan, groups = sft_plan(config, prompt_width, rows, shared)
        normaliser = jnp.maximum(rows.loss_mask.sum(), 1).astype(jnp.float32)
        trainable, frozen = trainable_split(state.actor, lora)
        grads, logp = accumulated_grad(
            lambda p, mb: sft_objective(forwards, joined(p, frozen), mb, plan, normaliser),
            trainable, {"rows": rows, "groups": groups}, opt.micro_batches, mesh)
        total = -jnp.sum(logp * rows.loss_mask) / normaliser
        aux = {"sft/loss": total, "actor/grad_norm": optax.tree.norm(grads),
               "sft/reply_tokens": rows.loss_mask.sum() / rows.loss_mask.shape[0]}
        actor, actor_opt, aux["actor/skipped_updates"] = apply_if(
            rows.loss_mask.any(), actor_tx, grads, state.actor_opt, trainable, total,
            aux["actor/grad_norm"])
        aux = {k: v.astype(jnp.float32) for k, v in aux.items()}
        return state.replace(actor=joined(actor, frozen), actor_opt=actor_opt,
                             step=state.step + 1), aux

    def sft_loss(actor: nnx.State, rows: Any, shared: bool = False) -> Metrics:
        """{"loss": token-mean cross-entropy} of rows' loss_mask tokens under the policy
        `actor` (a TrainState's), no gradient, in optim.micro_batches slices."""
        plan, groups = sft_plan(config, prompt_width, rows, shared)
        logp = in_row_slices(lambda b: forwards.logprobs(actor, b[0], b[1], plan)[0],
                             (rows, groups), opt.micro_batches, mesh)
        return {"loss": -jnp.sum(logp * rows.loss_mask) / jnp.maximum(rows.loss_mask.sum(), 1)}

    return Learner(prepare=prepare, update=update, learn=learn, sft=sft, sft_loss=sft_loss)


# Prepare: the filter, the advantages.

def filter_selection(out: Rollout, config: TrainConfig) -> GroupSelection:
    """The uncertainty filter's choice of groups for this rollout (config.filter; the scores
    without the format penalty, and the per-row values its metric ranks by)."""
    group = config.rollout.group_size
    per_row = filter_values(out, config.filter.metric)
    return select_groups(out.scores_without_penalty.reshape(-1, group), config.filter,
                         None if per_row is None else per_row.reshape(-1, group))


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


def advantages(config: TrainConfig, batch: Rollout, values: jax.Array | None,
               scores: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
    """(advantages, returns | None) [R, L] of config.estimator (a name in the advantage
    registry), called with the AdvantageConfig values its signature names (ESTIMATOR_PARAMS).
    TrainConfig has already refused a value set away from its default for a parameter the
    estimator does not have, so the ones left out here are defaults it has no use for.
    scores: [R] the rows' trajectory scores (None: batch.scores; the normalised ones)."""
    a = config.advantage
    inputs = adv_lib.AdvantageInputs(
        token_rewards=token_rewards(batch, a.reward_placement, scores),
        reply_mask=batch.loss_mask, values=values, turn_ids=batch.turn_ids,
        scores=(batch.scores if scores is None else scores).reshape(
            -1, config.rollout.group_size),
        turn_rewards=batch.turn_rewards + batch.format_penalties,
        turn_anchors=batch.turn_anchors)
    fn = adv_lib.get_advantage_estimator(config.estimator)
    accepted = inspect.signature(fn).parameters
    offered = {param: getattr(a, field) for field, param in ESTIMATOR_PARAMS.items()
               if param in accepted and getattr(a, field) is not None}
    return fn(inputs, **offered)


def token_rewards(batch: Rollout, placement: str, scores: jax.Array | None = None) -> jax.Array:
    """Rewards (format penalties included) on reply tokens: [B, L] float32.

    "trajectory": the score (`scores` [B], default batch.scores) on the last reply token of the
    row; "turn": each turn's reward on the last reply token of that turn.
    """
    positions = jnp.arange(batch.tokens.shape[1])
    if placement == "trajectory":
        last = jnp.max(jnp.where(batch.loss_mask, positions, -1), axis=1)
        score = batch.scores if scores is None else scores
        return jnp.where(positions == last[:, None], score[:, None], 0.0)
    per_turn = batch.turn_rewards + batch.format_penalties  # [B, T]
    nxt = jnp.pad(batch.turn_ids[:, 1:], ((0, 0), (0, 1)), constant_values=-1)
    ends = batch.loss_mask & (nxt != batch.turn_ids)
    reward = jnp.take_along_axis(per_turn, jnp.maximum(batch.turn_ids, 0), axis=1)
    return jnp.where(ends, reward, 0.0)


# The forwards of prepare and update.

@dataclasses.dataclass(frozen=True)
class Forwards:
    """The learner's teacher-forced forwards over rows [R, L] (static, built once): log-probs
    at the rollout temperature and the critic's values, under a shared-prefix plan (each
    group's first prompt once; None: each row whole), the weights gathered for compute."""

    train_def: nnx.GraphDef  # the policy, layers rematerialised when optim.remat
    critic_def: nnx.GraphDef | None  # PPO's: the policy's trunk with a value head
    reference_def: nnx.GraphDef | None  # LoRA with kl_coef > 0: the base without adapters
    gather: Callable[[Any], Any]  # stored (sharded) weights -> as a forward uses them
    slots: int  # reply tokens a row holds at most (a turn sample holds one turn's)
    chunk: int  # logit columns computed at a time
    temperature: float
    micro_batches: int
    mesh: jax.sharding.Mesh | None

    @classmethod
    def of(cls, config: TrainConfig, model: Decoder, gather: Callable[[Any], Any],
           mesh: jax.sharding.Mesh | None) -> Forwards:
        opt = config.optim
        reference_def = None
        if config.lora.rank > 0 and config.loss.kl_coef > 0:
            base = nnx.eval_shape(lambda: Decoder(base_config(model.config), rngs=nnx.Rngs(0)))
            reference_def = train_graphdef(base, value_head=False, remat=opt.remat)
        slots = config.rollout.reply_tokens * (1 if config.rollout.turn_samples
                                               else config.rollout.max_turns)
        return cls(train_def=train_graphdef(model, value_head=False, remat=opt.remat),
                   critic_def=(train_graphdef(model, value_head=True, remat=opt.remat)
                               if config.algo == "ppo" else None),
                   reference_def=reference_def, gather=gather, slots=slots,
                   chunk=min(opt.logit_chunk, slots), temperature=config.rollout.temperature,
                   micro_batches=opt.micro_batches, mesh=mesh)

    def logprobs(self, params: nnx.State, rows: Any, groups: jax.Array,
                 plan: PrefixPlan | None, graph: nnx.GraphDef | None = None,
                 ) -> tuple[jax.Array, jax.Array]:
        """(log-probs, entropies) [R, L] of rows' reply tokens under params (in `graph`,
        default the policy's)."""
        model = nnx.merge(self.train_def if graph is None else graph, self.gather(params))
        if plan is None:
            return sequence_logprobs(model, rows.tokens, rows.lengths, rows.loss_mask,
                                     self.slots, self.chunk, self.temperature)
        return shared_logprobs(model, rows, groups, plan, self.slots, self.chunk,
                               self.temperature)

    def values(self, params: nnx.State, rows: Any, groups: jax.Array,
               plan: PrefixPlan | None) -> jax.Array:
        """The critic's values [R, L] of rows."""
        critic = nnx.merge(self.critic_def, self.gather(params))
        if plan is None:
            return sequence_values(critic, rows.tokens, rows.lengths)
        return shared_values(critic, rows, groups, plan)

    def no_grad_logprobs(self, params: nnx.State, rows: Rollout, groups: jax.Array,
                         plan: PrefixPlan | None, graph: nnx.GraphDef | None = None,
                         ) -> jax.Array:
        """Log-probs [R, L] without a gradient (in_slices_over_real_length)."""
        return self.in_slices_over_real_length(
            lambda b: self.logprobs(params, *b, plan, graph)[0], rows, groups, plan)

    def no_grad_values(self, params: nnx.State, rows: Rollout, groups: jax.Array,
                       plan: PrefixPlan | None) -> jax.Array:
        """The critic's values [R, L] before an update (in_slices_over_real_length)."""
        return self.in_slices_over_real_length(
            lambda b: self.values(params, *b, plan), rows, groups, plan)

    def in_slices_over_real_length(self, fn: Callable[[Any], jax.Array], rows: Rollout,
                                   groups: jax.Array, plan: PrefixPlan | None) -> jax.Array:
        """fn((rows, groups)) -> [R, L], a forward without a gradient, in optim.micro_batches
        row slices (bounds memory) over the rows' real length (0 past the width that ran)."""
        def run(rows):
            return (), in_row_slices(fn, (rows, groups), self.micro_batches, self.mesh)

        return over_rows_length(run, rows, rows, plan)[1]


def over_rows_length(fn: Callable[[Any], tuple[Any, Any]], rows: Any, tree: Any,
                     plan: PrefixPlan | None) -> tuple[Any, Any]:
    """over_real_length(fn, tree) for the forward over `rows` under `plan`: the columns it
    reads are the longest row's, or with a shared prefix the prefix width (the least width it
    takes) and the longest suffix."""
    if plan is None:
        need, floor = jnp.max(rows.lengths), 1
    else:
        need, floor = jnp.max(rows.lengths - rows.prompt_lengths) + plan.width, plan.width
    return over_real_length(fn, tree, need, rows.tokens.shape[1], floor)


def critic_params(state: TrainState, lora: bool) -> nnx.State:
    """The critic's weights as its forward takes them: with LoRA its adapters and value head
    joined to the actor's frozen base."""
    return joined(state.critic, trainable_split(state.actor, lora)[1])


def train_graphdef(model: Decoder, *, value_head: bool, remat: bool) -> nnx.GraphDef:
    """The structure of `model` (with a value head: the critic's), layers rematerialised in the
    backward pass when `remat`; the user's model and its config are left as they are."""
    if not value_head and remat == model.config.remat:
        return nnx.graphdef(model)
    config = dataclasses.replace(model.config, remat=remat)
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), value_head=value_head))
    return nnx.graphdef(abstract)


# Update: the losses of one mini-batch.

def actor_objective(logp: jax.Array, entropy: jax.Array, mb: MiniBatch, normaliser: jax.Array,
                    loss: LossConfig) -> tuple[jax.Array, Metrics]:
    """(loss to minimise, metrics) of reply log-probs [rows, L] under the minibatch's
    normaliser: the loss of a slice of the minibatch is its share of the minibatch's."""
    mask, agg = mb.rollout.loss_mask, loss.agg
    old = mb.old_logp if mb.old_logp is not None else jax.lax.stop_gradient(logp)
    pg, stats = policy_loss(logp, old, mb.advantages, mask, loss.clip_low, loss.clip_high,
                            loss.dual_clip, agg, normaliser)
    ent = aggregate(entropy, mask, agg, normaliser)
    # verl's names with verl's meaning (either band; the dual-clip share), and this
    # project's split of the bands under names of its own.
    aux = {"actor/pg_loss": pg, "actor/pg_clipfrac": stats.clipfrac,
           "actor/pg_clipfrac_lower": stats.clipfrac_dual,
           "actor/pg_clipfrac_high": stats.clipfrac_upper,
           "actor/pg_clipfrac_low": stats.clipfrac_lower, "actor/ppo_kl": stats.approx_kl,
           "actor/entropy_kept": aggregate(entropy, mask)}  # token mean, as actor/entropy
    total = pg - loss.entropy_coef * ent
    if loss.kl_coef > 0:
        kl = aggregate(kl_penalty(logp, mb.ref_logp, loss.kl_kind), mask, agg, normaliser)
        total, aux["actor/kl_loss"] = total + loss.kl_coef * kl, kl
    return total, aux


def critic_objective(values: jax.Array, mb: MiniBatch, normaliser: jax.Array,
                     loss: LossConfig) -> tuple[jax.Array, Metrics]:
    """(value loss, metrics) of the critic's values [rows, L] against the mini-batch's
    returns, clipped around its old values."""
    vf, stats = value_loss(values, mb.old_values, mb.returns, mb.rollout.loss_mask,
                           loss.value_clip, loss.agg, normaliser)
    return vf, {"critic/vf_loss": vf, "critic/vf_clipfrac": stats.clipfrac,
                "critic/vf_explained_var": stats.explained_var,
                "critic/values_mean": stats.values_mean,
                "critic/returns_mean": stats.returns_mean}


# SFT: supervised steps through the update's forward.

def sft_plan(config: TrainConfig, prompt_width: int | None, rows: Any, shared: bool,
             ) -> tuple[PrefixPlan | None, jax.Array]:
    """(the forward plan, each row's group [R] int32) for rows [R, L] cut in optim.micro_batches
    slices: each group's first prompt (prompt_width) once when `shared` (group-major rollout
    rows of group_size), else every row whole."""
    count, pieces = rows.tokens.shape[0], config.optim.micro_batches
    group = config.rollout.group_size
    if count % pieces:
        raise ValueError(f"optim.micro_batches = {pieces} must divide the {count} rows of an "
                         "SFT batch")
    per = count // pieces
    groups = jnp.arange(count, dtype=jnp.int32) // (group if shared else 1)
    width = prompt_width if shared else None
    return plan_for(width, per, aligned_slots(count, per, group) if shared else per), groups


def sft_objective(forwards: Forwards, params: nnx.State, mb: dict[str, Any],
                  plan: PrefixPlan | None, normaliser: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(summed negative log-likelihood of the slice's reply tokens / normaliser, the log-probs)
    of mb = {"rows": [r, L] rows, "groups": [r] int32}."""
    logp, _ = forwards.logprobs(params, mb["rows"], mb["groups"], plan)
    return -jnp.sum(logp * mb["rows"].loss_mask) / normaliser, logp
