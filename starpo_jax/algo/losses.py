"""The StarPO / StarPO-S losses: clip-higher PPO, clipped value loss, entropy and KL estimators.

Every per-token quantity is reduced to a scalar by ONE function, `aggregate(x, mask, agg)`, so the
policy loss, the value loss, the entropy bonus and every logged statistic mean the same thing by
"mean over the reply tokens". Masked positions (environment/template tokens, padding) never
contribute, whatever they hold.

Conventions follow verl (which RAGEN trains with): `approx_kl` is KL(old || new) estimated from
samples of the old policy, the value loss carries verl's factor 0.5, k3 is verl's `low_var_kl`.
String and float hyper-parameters are static Python values: they are checked when traced, and a
bad one raises ValueError naming it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from starpo_jax.config import AGG_MODES, KL_KINDS  # noqa: F401 (with LossConfig, no JAX)

# exp() of a log-ratio beyond +-20 overflows float32 gradients long before it means anything.
_LOG_RATIO_LIMIT = 20.0
# verl clips the k3 estimate itself to [-10, 10]; its per-token value is otherwise unbounded.
_K3_LIMIT = 10.0


def _check_agg(agg: str) -> None:
    if agg not in AGG_MODES:
        raise ValueError(f"unknown agg {agg!r}; valid: {', '.join(AGG_MODES)}")


def aggregate_normaliser(mask: jax.Array, agg: str = "token_mean",
                         budget: int | None = None) -> jax.Array:
    """What `aggregate` divides by for this mask: [B, T] -> float32 scalar.

    "token_mean": the masked-token count; "seq_mean_token_mean" / "seq_mean_token_sum": the
    count of rows with a masked token (at least 1 either way); "seq_mean_token_sum_norm": that
    row count times `budget`, a constant token count (default T, the mask's width, as verl's
    default; the train step passes the reply-token budget of a row, max_turns x reply_tokens).
    Pass it to `aggregate` for the pieces (row subsets) of a batch to make their results add up
    to the whole batch's (gradient accumulation).
    """
    _check_agg(agg)
    count = (jnp.asarray(mask) != 0).sum(axis=-1).astype(jnp.float32)  # [B]
    if agg == "token_mean":
        return jnp.maximum(count.sum(), 1.0)
    rows = jnp.maximum((count > 0).astype(jnp.float32).sum(), 1.0)
    if agg == "seq_mean_token_sum_norm":
        budget = jnp.shape(mask)[-1] if budget is None else budget
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise ValueError(f"budget must be an int >= 1; got {budget!r}")
        return rows * float(budget)
    return rows


def aggregate(x: jax.Array, mask: jax.Array, agg: str = "token_mean",
              normaliser: jax.Array | None = None) -> jax.Array:
    """Masked reduction of a per-token quantity to a float32 scalar.

    Args:
      x: [B, T] per-token values (any float dtype; computed in float32).
      mask: [B, T] bool/int/float, nonzero on the tokens that count.
      agg: "token_mean": sum over all masked tokens / their count (DAPO's token-level loss);
        "seq_mean_token_mean": mean over the masked tokens of each row, then mean over rows;
        "seq_mean_token_sum": sum over the masked tokens of each row, then mean over rows;
        "seq_mean_token_sum_norm": the sum over all masked tokens divided by (rows with a
        masked token) x a constant token budget: each row's token sum over the budget, then
        the mean over rows (Dr.GRPO's constant normaliser as TRL's dr_grpo has it, and what
        RAGEN gets from verl's mode of that name at one row per micro-batch). verl's own mode
        divides the summed row sums by the budget alone, not by the rows too.
      normaliser: float32 scalar, the divisor of the final mean; default
        `aggregate_normaliser(mask, agg)`. Given the whole batch's, the results of row subsets
        sum to the whole batch's result.
    Rows with no masked token are left out of the row mean (verl would divide by zero for them, or
    count them as 0), and an all-masked batch gives 0, so padding rows never change the result.
    """
    _check_agg(agg)
    if normaliser is None:
        normaliser = aggregate_normaliser(mask, agg)
    on = jnp.asarray(mask) != 0
    x = jnp.where(on, jnp.asarray(x, jnp.float32), 0.0)
    if agg == "token_mean":
        return x.sum() / normaliser
    row = x.sum(axis=-1)
    if agg == "seq_mean_token_mean":
        row = row / jnp.maximum(on.sum(axis=-1).astype(jnp.float32), 1.0)
    # A row without masked tokens sums to 0 here, so it adds nothing to the numerator.
    return row.sum() / normaliser


def masked_var(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Unbiased (Bessel-corrected, as verl's masked_var) variance over the masked tokens.

    x, mask: [B, T]. Returns a float32 scalar; 0 when fewer than two tokens are masked.
    """
    mean = aggregate(x, mask, "token_mean")
    count = (jnp.asarray(mask) != 0).sum().astype(jnp.float32)
    biased = aggregate(jnp.square(jnp.asarray(x, jnp.float32) - mean), mask, "token_mean")
    return jnp.where(count > 1, biased * count / jnp.maximum(count - 1.0, 1.0), 0.0)


def explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var[returns - values] / Var[returns] over the masked tokens (verl's vf_explained_var).

    values, returns: [B, T]; mask: [B, T]. 1 = perfect critic, 0 = no better than a constant.
    The 1e-5 in the denominator (verl's) keeps a constant-return batch finite.
    """
    diff = jnp.asarray(returns, jnp.float32) - jnp.asarray(values, jnp.float32)
    return 1.0 - masked_var(diff, mask) / (masked_var(returns, mask) + 1e-5)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token estimate of KL(pi || ref) from tokens sampled by pi (Schulman's k1/k3).

    logp, ref_logp: [B, T] log-probabilities of the sampled tokens under pi and the reference.
    kind: "k1" = logp - ref_logp (unbiased, high variance, can be negative);
      "k3" = r - 1 - log r with r = ref/pi (verl's low_var_kl; log r clipped to +-20 and the
      result to [-10, 10] as verl does); "mse" = 0.5 (logp - ref_logp)^2; "abs" = |logp - ref_logp|.
    Returns [B, T] float32 (no masking: reduce with `aggregate`).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL kind {kind!r}; valid: {', '.join(KL_KINDS)}")
    diff = jnp.asarray(logp, jnp.float32) - jnp.asarray(ref_logp, jnp.float32)
    if kind == "k1":
        return diff
    if kind == "abs":
        return jnp.abs(diff)
    if kind == "mse":
        return 0.5 * jnp.square(diff)
    log_r = jnp.clip(-diff, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return jnp.clip(jnp.exp(log_r) - log_r - 1.0, -_K3_LIMIT, _K3_LIMIT)


def token_entropy(logits: jax.Array) -> jax.Array:
    """Entropy of the next-token distribution at every position.

    logits: [B, T, V] any float dtype (computed in float32; -inf entries allowed, e.g. masked
    vocabulary). Returns [B, T] float32 in nats.
    """
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    p = jnp.exp(logp)
    # 0 * log 0 = 0; without the where, a -inf logit gives 0 * -inf = nan.
    return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def entropy_from_logits(logits: jax.Array, mask: jax.Array, agg: str = "token_mean") -> jax.Array:
    """Masked mean token entropy (entropy bonus, collapse metric).

    logits: [B, T, V]; mask: [B, T]. Returns a float32 scalar (see `aggregate` for agg).
    """
    return aggregate(token_entropy(logits), mask, agg)


class PolicyLossStats(NamedTuple):
    """Diagnostics of one policy-loss evaluation, each a float32 scalar over the masked tokens."""

    clipfrac: jax.Array  # clipped on either band (upper or lower): verl's pg_clipfrac
    clipfrac_upper: jax.Array  # A > 0 and ratio > 1 + clip_high: pushed up as far as allowed
    clipfrac_lower: jax.Array  # A < 0 and ratio < 1 - clip_low: pushed down as far as allowed
    clipfrac_dual: jax.Array  # A < 0 and the loss capped at dual_clip * |A| (0 without dual clip)
    approx_kl: jax.Array  # k1 estimate of KL(old || new): mean(old_logp - logp) (verl's ppo_kl)
    approx_kl_k3: jax.Array  # k3 estimate of the same KL: mean(r - 1 - log r), r = new/old
    ratio_mean: jax.Array  # mean importance ratio new/old


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    normaliser: jax.Array | None = None,
) -> tuple[jax.Array, PolicyLossStats]:
    """The clip-higher PPO surrogate (DAPO / StarPO-S), optionally dual-clipped, to minimise.

    Per token, with r = exp(logp - old_logp) and A the advantage:
        l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
    and, with dual_clip = c (> 1), for A < 0 only: l = min(l, -A c), which bounds the loss of a
    bad token whose probability has already grown by more than c (Ye et al. 2019; verl).
    So the gradient w.r.t. logp is -A r where the ratio is inside the band (or outside it against
    the advantage's direction), and exactly 0 where A > 0 and r > 1 + clip_high, where A < 0 and
    r < 1 - clip_low, and (dual clip) where A < 0 and r > c.

    Args:
      logp: [B, T] log-probs of the sampled tokens under the policy being trained.
      old_logp: [B, T] log-probs under the behaviour policy (treated as constants).
      advantages: [B, T] per-token advantages (treated as constants).
      mask: [B, T] nonzero on the model's reply tokens.
      clip_low, clip_high: the band [1 - clip_low, 1 + clip_high]; clip_low in [0, 1),
        clip_high >= 0.
      dual_clip: None, or c > 1.
      agg, normaliser: see `aggregate` (the loss only; the stats are this batch's own).
    Returns:
      (loss float32 scalar, PolicyLossStats).
    """
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1); got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0; got {clip_high!r}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be None or > 1; got {dual_clip!r}")
    _check_agg(agg)

    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
    adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
    log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = jnp.exp(log_ratio)

    per_token = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high))
    if dual_clip is None:
        dual_hit = jnp.zeros(per_token.shape, bool)
    else:
        cap = -adv * dual_clip
        dual_hit = (adv < 0) & (per_token > cap)
        per_token = jnp.where(dual_hit, cap, per_token)
    loss = aggregate(per_token, mask, agg, normaliser)

    r = jax.lax.stop_gradient(ratio)
    lr = jax.lax.stop_gradient(log_ratio)

    def frac(hit: jax.Array) -> jax.Array:
        return aggregate(hit.astype(jnp.float32), mask)

    upper, lower = (adv > 0) & (r > 1.0 + clip_high), (adv < 0) & (r < 1.0 - clip_low)
    stats = PolicyLossStats(
        clipfrac=frac(upper | lower),
        clipfrac_upper=frac(upper),
        clipfrac_lower=frac(lower),
        clipfrac_dual=frac(jax.lax.stop_gradient(dual_hit)),
        approx_kl=aggregate(-lr, mask),
        approx_kl_k3=aggregate(r - 1.0 - lr, mask),
        ratio_mean=aggregate(r, mask),
    )
    return loss, stats


class ValueLossStats(NamedTuple):
    """Diagnostics of one value-loss evaluation, float32 scalars over the masked tokens."""

    clipfrac: jax.Array  # the clipped prediction gave the larger (chosen) error
    explained_var: jax.Array  # `explained_variance(values, returns, mask)`
    values_mean: jax.Array
    returns_mean: jax.Array


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    clip: float | None = 0.5,
    agg: str = "token_mean",
    normaliser: jax.Array | None = None,
) -> tuple[jax.Array, ValueLossStats]:
    """PPO's clipped value loss: 0.5 * agg(max((v - R)^2, (v_clip - R)^2)).

    v_clip = old_values + clip(values - old_values, -clip, clip), so the critic gains nothing by
    moving a prediction more than `clip` from the one it made at rollout time. clip=0.5 is
    verl's critic.cliprange_value default; None gives the plain 0.5 * squared error.

    values: [B, T] current critic predictions (differentiated); old_values, returns: [B, T]
    (constants); mask: [B, T] reply tokens; agg, normaliser: see `aggregate` (the loss only).
    Returns (loss float32 scalar, ValueLossStats).
    """
    if clip is not None and not clip > 0.0:
        raise ValueError(f"value clip must be None or > 0; got {clip!r}")
    _check_agg(agg)
    values = jnp.asarray(values, jnp.float32)
    old_values = jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32))
    returns = jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32))

    unclipped = jnp.square(values - returns)
    if clip is None:
        per_token, clipped_wins = unclipped, jnp.zeros(unclipped.shape, bool)
    else:
        v_clip = old_values + jnp.clip(values - old_values, -clip, clip)
        clipped = jnp.square(v_clip - returns)
        # Within the clip band v_clip is values in exact arithmetic; the band test keeps a
        # rounding difference of old_values + (values - old_values) from counting as a clip.
        outside = jnp.abs(values - old_values) > clip
        per_token, clipped_wins = jnp.maximum(unclipped, clipped), outside & (clipped > unclipped)
    loss = 0.5 * aggregate(per_token, mask, agg, normaliser)

    v = jax.lax.stop_gradient(values)
    stats = ValueLossStats(
        clipfrac=aggregate(clipped_wins.astype(jnp.float32), mask),
        explained_var=explained_variance(v, returns, mask),
        values_mean=aggregate(v, mask),
        returns_mean=aggregate(returns, mask),
    )
    return loss, stats
