"""The step's metrics besides the update's own losses: the rollout's statistics and its kept
rows' (`rollout_metrics`), the sampler / trainer log-prob mismatch (`logprob_diff`), and how the
mini-batch updates' metrics become the step's (`mean_over_updates`). Every value is a float32
scalar in the flat dict a step returns."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from starpo_jax.algo.advantages import anchor_share
from starpo_jax.algo.failures import failure_fractions
from starpo_jax.algo.filtering import gather_group_rows
from starpo_jax.algo.losses import aggregate
from starpo_jax.rollout.jax_env import Rollout
from starpo_jax.train.batch import Batch

Metrics = dict[str, jax.Array]
# Per step: how many mini-batch updates were dropped for a non-finite loss or gradient (sums
# over the updates, where every other update metric is a mean).
SKIPPED_UPDATES = ("actor/skipped_updates", "critic/skipped_updates")


def _mean(x: jax.Array, where: jax.Array) -> jax.Array:
    w = where.astype(jnp.float32)
    return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


def logprob_diff(behaviour: jax.Array, logp: jax.Array, mask: jax.Array) -> Metrics:
    """Sampler / trainer mismatch: |behaviour log-prob - trainer log-prob| over sampled tokens."""
    diff = jnp.abs(behaviour - logp)
    return {"rollout/logprob_diff_mean": _mean(diff, mask),
            "rollout/logprob_diff_max": jnp.max(jnp.where(mask, diff, 0.0))}


def mean_over_updates(aux: Metrics) -> Metrics:
    """The metrics of a pass of mini-batch updates (each leaf [epochs, minibatches], with
    "used": whether that mini-batch updated) as the pass's: SKIPPED_UPDATES summed, every other
    metric averaged over the mini-batches that updated; "used" dropped."""
    skipped = {k: aux.pop(k).sum() for k in SKIPPED_UPDATES if k in aux}
    used = aux.pop("used").astype(jnp.float32)
    aux = jax.tree.map(lambda v: jnp.sum(v * used) / jnp.maximum(used.sum(), 1.0), aux)
    aux.update(skipped)
    return aux


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
            "rollout/anchor_share": anchor_share(out.turn_anchors, group)}),
        **world_model_metrics(out, "rollout"),
        **{f"train/failure/{kind}": value
           for kind, value in failure_fractions(out.failure).items()},
    }


def world_model_metrics(out: Rollout, prefix: str) -> Metrics:
    """rollout.world_model's probe (rollout/world_model.py) over the taken turns:
    <prefix>/observation_acc (the reply's <observation> is the turn's state) and
    <prefix>/prediction_acc (its <prediction> is the state the turn led to); {} when off."""
    if out.prediction_ok is None:
        return {}
    return {f"{prefix}/observation_acc": _mean(out.observation_ok, out.turn_taken),
            f"{prefix}/prediction_acc": _mean(out.prediction_ok, out.turn_taken)}
