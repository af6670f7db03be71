"""RAGEN-2's switches on the scores and advantages of a step (AdvantageConfig; each off by
default, as in the original, and then absent from the traced step: Python branches on the
static config).

- Reward normalisation (the original's agent_proxy.reward_normalization, applied by its
  ctx_manager._normalize_score_tensor to each trajectory's score, format penalties included,
  before any advantage is estimated). `reward_normalization_grouping`: which trajectories are
  normalised together: "state" the N rollouts of one initial state (a group), "batch" all P x N,
  "inductive" those of one env tag (a run trains one env here, so the whole batch, as "batch").
  `reward_normalization_method`: "identity" (off), "mean" (x - mean), "mean_std" ((x - mean) /
  (std + 1e-6), std unbiased; a group whose std is <= 1e-6 gets 0), "asym_clip" (mean_std
  clipped to [-1, 3]). As the original, nothing is normalised when every group holds one
  trajectory. It runs over the whole rollout, before the filter, which still ranks the groups
  by their raw rewards (filter.metric); GiGPO's step-level turn rewards are not normalised.
- soft_advantage_reweight (its algorithm.soft_advantage_reweight; GRPO only): each kept group's
  advantages times w = std / (max std + 1e-6), std the unbiased std of the scores GRPO
  normalised (1 for a group of one, as its GRPO), the max over the groups the filter kept. It
  scales what the filter kept: to reweight instead of filtering, keep every group
  (filter.keep_ratio = 1.0).
- grpo_advantage_length_weight (its top-level key; GRPO only): each row's advantages divided by
  (its reply tokens + 1e-6) / the mean reply tokens of the rows in the loss.
- zero_task_advantage (its algorithm.zero_task_advantage): every advantage 0, after all of the
  above: the actor trains on the entropy bonus and the KL term alone; a PPO critic still
  learns its returns, which are left as they were.
The original's order: GRPO, soft reweight, filter_loss_scaling, length weight, zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from starpo_jax.config import REWARD_NORM_GROUPINGS, REWARD_NORM_METHODS, TrainConfig

EPS = 1e-6  # the original's epsilon in each rule


def normalize_scores(scores: jax.Array, group_size: int, grouping: str = "state",
                     method: str = "identity") -> jax.Array:
    """The original's reward normalisation of trajectory scores: [B] (group-major, B = P * N)
    -> [B] float32 (rules: the module docstring)."""
    if grouping not in REWARD_NORM_GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; valid: {REWARD_NORM_GROUPINGS}")
    if method not in REWARD_NORM_METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {REWARD_NORM_METHODS}")
    scores = jnp.asarray(scores, jnp.float32)
    total = scores.shape[0]
    sets = total // group_size if grouping == "state" else 1
    if method == "identity" or sets >= total:
        return scores
    x = scores.reshape(sets, -1)
    shifted = x - x[:, :1]  # a set of equal scores is exactly 0 (advantages.grpo's reason)
    centred = shifted - shifted.mean(axis=1, keepdims=True)
    if method == "mean":
        return centred.reshape(total)
    std = jnp.std(shifted, axis=1, ddof=1, keepdims=True)
    out = jnp.where(std > EPS, centred / (std + EPS), 0.0)
    if method == "asym_clip":
        out = jnp.clip(out, -1.0, 3.0)
    return out.reshape(total)


def normalized_kept_scores(config: TrainConfig, scores: jax.Array, indices: jax.Array,
                           ) -> jax.Array | None:
    """The rollout's [B] trajectory scores normalised (config.advantage), then those of the
    kept groups `indices` [K]: [K * N]; None when the method is "identity" (off)."""
    a, group = config.advantage, config.rollout.group_size
    if a.reward_normalization_method == "identity":
        return None
    normalized = normalize_scores(scores, group, a.reward_normalization_grouping,
                                  a.reward_normalization_method)
    return jnp.take(normalized.reshape(-1, group), indices, axis=0).reshape(-1)


def per_row(trajectory: jax.Array | None, rows: int) -> jax.Array | None:
    """[K * N] per-trajectory values as the batch's rows: tiled over the turns when the rows are
    turn samples (turn-major, rollout.jax_env.turn_samples); None stays None."""
    if trajectory is None:
        return None
    return jnp.tile(trajectory, rows // trajectory.shape[0])


def group_std(scores: jax.Array) -> jax.Array:
    """The std GRPO normalises a group by, as the original's GRPO keeps it: [G, N] -> [G],
    unbiased; 1 for a group of one."""
    scores = jnp.asarray(scores, jnp.float32)
    if scores.shape[1] == 1:
        return jnp.ones(scores.shape[:1], jnp.float32)
    return jnp.std(scores - scores[:, :1], axis=1, ddof=1)


def soft_weights(scores: jax.Array, kept: jax.Array) -> jax.Array:
    """soft_advantage_reweight's weight of each group: [G, N] scores, [G] bool kept -> [G]
    std / (the kept groups' largest std + 1e-6)."""
    std = group_std(scores)
    return std / (jnp.max(jnp.where(kept, std, 0.0)) + EPS)


def length_weights(mask: jax.Array) -> jax.Array:
    """grpo_advantage_length_weight's divisor of each row: [R, L] loss mask -> [R]
    (reply tokens + 1e-6) / their mean over the rows with a reply token in the loss."""
    count = jnp.asarray(mask).astype(jnp.float32).sum(-1)
    rows = jnp.maximum((count > 0).sum(), 1).astype(jnp.float32)
    return (count + EPS) / (count.sum() / rows)


def adjust_advantages(config: TrainConfig, adv: jax.Array, rows, scores: jax.Array | None,
                      kept: jax.Array) -> jax.Array:
    """The advantages [R, L] of the batch's rows (a Rollout) after soft_advantage_reweight,
    grpo_advantage_length_weight and zero_task_advantage (config.advantage); `adv` itself when
    all are off. scores: [K * N] the kept trajectories' scores GRPO saw (None: the rows' own);
    kept: [K] bool the groups really kept."""
    a, group = config.advantage, config.rollout.group_size
    if a.soft_advantage_reweight:
        trajectories = kept.shape[0] * group
        scores = rows.scores[:trajectories] if scores is None else scores  # turn 0's rows
        weights = jnp.repeat(soft_weights(scores.reshape(-1, group), kept), group)
        adv = adv * per_row(weights, adv.shape[0])[:, None]
    if a.grpo_advantage_length_weight:
        adv = adv / length_weights(rows.loss_mask)[:, None]
    if a.zero_task_advantage:
        adv = jnp.zeros_like(adv)
    return adv


def soft_weight_metrics(config: TrainConfig, out, batch) -> dict[str, jax.Array]:
    """The original's train/soft_reweight_min, _max and _mean of the kept groups' weights (0
    with none kept) for a step's rollout `out` and its Batch; {} when soft_advantage_reweight
    is off."""
    if not config.advantage.soft_advantage_reweight:
        return {}
    group, selection = config.rollout.group_size, batch.selection
    kept = selection.kept
    scores = normalized_kept_scores(config, out.scores, selection.indices)
    if scores is None:
        scores = batch.rollout.scores[:kept.shape[0] * group]
    weights = soft_weights(scores.reshape(-1, group), kept)
    some = kept.any()
    return {"train/soft_reweight_min": jnp.where(some, jnp.min(jnp.where(kept, weights, jnp.inf)),
                                                 0.0),
            "train/soft_reweight_max": jnp.max(jnp.where(kept, weights, 0.0)),
            "train/soft_reweight_mean": jnp.sum(jnp.where(kept, weights, 0.0))
            / jnp.maximum(kept.sum(), 1)}
