"""PPO, value, entropy and KL losses against numpy formulas; clip-higher gradients vs analytic."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax.algo.losses import (AGG_MODES, aggregate, aggregate_normaliser, entropy_from_logits,
                                    explained_variance, kl_penalty, policy_loss, token_entropy,
                                    value_loss)

CLIP_LOW, CLIP_HIGH, DUAL = 0.2, 0.28, 3.0


def make_mask(seed: int, shape=(4, 12)) -> np.ndarray:
    """Random 0/1 mask whose row 1 is empty (a padding row)."""
    mask = (np.random.default_rng(seed).random(shape) < 0.7).astype(np.int32)
    mask[1] = 0
    return mask


def aggregate_reference(x, mask, agg, budget=None):
    """budget: seq_mean_token_sum_norm's constant (default: the mask's width, verl's)."""
    rows = [(x[b][mask[b] != 0]) for b in range(x.shape[0])]
    if agg == "token_mean":
        tokens = np.concatenate(rows)
        return tokens.mean() if tokens.size else 0.0
    per_row = [r.mean() if agg == "seq_mean_token_mean" else r.sum() for r in rows if r.size]
    if agg == "seq_mean_token_sum_norm":
        per_row = [r / (budget or x.shape[1]) for r in per_row]
    return np.mean(per_row) if per_row else 0.0


def token_weights(mask, agg):
    """d aggregate / d x_t: the weight each masked token has in the aggregate."""
    mask = mask.astype(np.float64)
    count = mask.sum(axis=1, keepdims=True)
    rows = (count > 0).sum()
    if agg == "token_mean":
        return mask / mask.sum()
    if agg == "seq_mean_token_mean":
        return mask / np.maximum(count, 1) / rows
    if agg == "seq_mean_token_sum_norm":
        return mask / rows / mask.shape[1]
    return mask / rows


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregate_matches_numpy(agg):
    x = np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32)
    mask = make_mask(0)
    x_poisoned = np.where(mask != 0, x, np.inf)  # masked entries must not leak, even as inf
    got = jax.jit(aggregate, static_argnums=2)(x_poisoned, mask, agg)
    np.testing.assert_allclose(got, aggregate_reference(x, mask, agg), rtol=1e-6)
    assert aggregate(x, np.zeros_like(mask), agg) == 0.0


@pytest.mark.parametrize("agg", AGG_MODES)
def test_row_slices_with_the_whole_normaliser_sum_to_the_whole(agg):
    # Gradient accumulation relies on it: pieces of a batch, each divided by the whole batch's
    # normaliser, add up to the whole batch's aggregate (an all-masked row included).
    mask = make_mask(3, (8, 12))
    mask[5] = 0
    x = np.random.default_rng(4).normal(size=mask.shape).astype(np.float32)
    whole = aggregate_normaliser(mask, agg)
    pieces = [aggregate(x[i:i + 2], mask[i:i + 2], agg, whole) for i in range(0, 8, 2)]
    np.testing.assert_allclose(sum(pieces), aggregate_reference(x, mask, agg), rtol=1e-5)


def test_token_sum_norm_divides_row_sums_by_the_budget_and_the_row_count():
    """Dr.GRPO's aggregate: sum_rows sum_tokens x / (budget * rows with a token); with the
    whole batch's normaliser its row slices add up to it (gradient accumulation)."""
    mask = make_mask(5, (8, 12))
    mask[6] = 0
    x = np.random.default_rng(6).normal(size=mask.shape).astype(np.float32)
    budget = 40  # e.g. max_turns 5 x reply_tokens 8, more than the 12 columns here
    whole = aggregate_normaliser(mask, "seq_mean_token_sum_norm", budget)
    rows = int((mask.sum(1) > 0).sum())
    assert float(whole) == budget * rows
    want = np.where(mask != 0, x.astype(np.float64), 0).sum() / (budget * rows)
    got = aggregate(x, mask, "seq_mean_token_sum_norm", whole)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(aggregate_reference(x, mask, "seq_mean_token_sum_norm", 40), want,
                               rtol=1e-5)
    pieces = [aggregate(x[i:i + 2], mask[i:i + 2], "seq_mean_token_sum_norm", whole)
              for i in range(0, 8, 2)]
    np.testing.assert_allclose(sum(pieces), want, rtol=1e-5)
    with pytest.raises(ValueError, match="budget must be an int >= 1; got 0"):
        aggregate_normaliser(mask, "seq_mean_token_sum_norm", 0)


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(
        ValueError, match="unknown agg 'mean'; valid: token_mean, seq_mean_token_mean"
    ):
        aggregate(np.zeros((1, 1)), np.ones((1, 1)), "mean")


def ppo_inputs(seed: int, shape=(6, 16)):
    """logp, old_logp, advantages, mask; ratios drawn from bands below, inside and above the
    clip band and above the dual-clip bound, each at least 0.03 away from every edge."""
    rng = np.random.default_rng(seed)
    bands = np.array([[0.3, 0.77], [0.83, 1.25], [1.31, 2.97], [3.03, 4.5]])
    low, high = bands[rng.integers(0, len(bands), size=shape)].transpose(2, 0, 1)
    ratio = rng.uniform(low, high)
    logp = rng.uniform(-5, -0.1, size=shape)
    old_logp = logp - np.log(ratio)
    adv = rng.normal(size=shape) * (rng.random(shape) < 0.9)  # some exact zeros
    f32 = np.float32
    return logp.astype(f32), old_logp.astype(f32), adv.astype(f32), make_mask(seed, shape)


def ppo_reference(logp, old_logp, adv, dual_clip):
    """Per-token clip-higher (+ dual clip) loss and its gradient w.r.t. logp, from the cases."""
    r = np.exp(logp.astype(np.float64) - old_logp)
    loss = np.maximum(-adv * r, -adv * np.clip(r, 1 - CLIP_LOW, 1 + CLIP_HIGH))
    grad = -adv * r
    upper = (adv > 0) & (r > 1 + CLIP_HIGH)
    lower = (adv < 0) & (r < 1 - CLIP_LOW)
    dual = np.zeros_like(upper)
    if dual_clip is not None:
        dual = (adv < 0) & (r > dual_clip)
        loss = np.where(dual, -adv * dual_clip, loss)
    grad = np.where(upper | lower | dual, 0.0, grad)
    return loss, grad, upper, lower, dual, r


@pytest.mark.parametrize("dual_clip", [None, DUAL])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_clip_higher_gradient_is_zero_exactly_where_clipped(agg, dual_clip):
    logp, old_logp, adv, mask = ppo_inputs(1)
    fn = functools.partial(
        policy_loss, clip_low=CLIP_LOW, clip_high=CLIP_HIGH, dual_clip=dual_clip, agg=agg
    )
    (loss, _), grad = jax.jit(jax.value_and_grad(fn, has_aux=True))(logp, old_logp, adv, mask)
    ref_loss, ref_grad, upper, lower, dual, _ = ppo_reference(logp, old_logp, adv, dual_clip)
    weights = token_weights(mask, agg)
    grad = np.asarray(grad)

    zero = (upper | lower | dual) | (mask == 0)
    assert upper.any() and lower.any() and (dual_clip is None or dual.any())
    assert np.all(grad[zero] == 0.0)
    np.testing.assert_allclose(grad[~zero], (ref_grad * weights)[~zero], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(loss, aggregate_reference(ref_loss, mask, agg), rtol=1e-5)


def test_dual_clip_bounds_the_loss_of_bad_tokens():
    logp, old_logp, adv, mask = ppo_inputs(2)
    r = np.exp(logp.astype(np.float64) - old_logp)
    capped = (adv < 0) & (r > DUAL) & (mask != 0)
    assert capped.any()
    # Restricted to the capped tokens, the loss is c |A| with the dual clip and r |A| without.
    with_cap, _ = policy_loss(logp, old_logp, adv, capped, dual_clip=DUAL)
    without, _ = policy_loss(logp, old_logp, adv, capped, dual_clip=None)
    np.testing.assert_allclose(with_cap, np.mean(-adv[capped] * DUAL), rtol=1e-5)
    np.testing.assert_allclose(without, np.mean(-adv[capped] * r[capped]), rtol=1e-5)


@pytest.mark.parametrize("dual_clip", [None, DUAL])
def test_policy_loss_stats_match_numpy(dual_clip):
    logp, old_logp, adv, mask = ppo_inputs(3)
    _, stats = jax.jit(functools.partial(policy_loss, dual_clip=dual_clip))(
        logp, old_logp, adv, mask
    )
    _, _, upper, lower, dual, r = ppo_reference(logp, old_logp, adv, dual_clip)
    on = mask != 0
    # verl's pg_clipfrac: tokens whose clipped surrogate term exceeds the unclipped one.
    r_ = np.exp(logp.astype(np.float64) - old_logp)
    verl = -adv * np.clip(r_, 1 - CLIP_LOW, 1 + CLIP_HIGH) > -adv * r_
    np.testing.assert_allclose(stats.clipfrac, verl[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(stats.clipfrac, (upper | lower)[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(stats.clipfrac_upper, upper[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(stats.clipfrac_lower, lower[on].mean(), rtol=1e-6)
    np.testing.assert_allclose(stats.clipfrac_dual, dual[on].mean(), rtol=1e-6, atol=0)
    log_r = np.log(r)
    np.testing.assert_allclose(stats.approx_kl, (-log_r)[on].mean(), rtol=1e-5)
    np.testing.assert_allclose(stats.approx_kl_k3, (r - 1 - log_r)[on].mean(), rtol=1e-5)
    np.testing.assert_allclose(stats.ratio_mean, r[on].mean(), rtol=1e-5)


def test_symmetric_clip_equals_vanilla_ppo_at_equal_policies():
    logp, _, adv, mask = ppo_inputs(4)
    loss, stats = policy_loss(logp, logp, adv, mask, clip_low=0.2, clip_high=0.2)
    np.testing.assert_allclose(loss, aggregate_reference(-adv, mask, "token_mean"), rtol=1e-5)
    assert stats.clipfrac_upper == 0 and stats.clipfrac_lower == 0 and stats.approx_kl == 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"clip_low": 1.0}, r"clip_low must be in \[0, 1\); got 1.0"),
        ({"clip_low": -0.1}, "clip_low"),
        ({"clip_high": -0.2}, "clip_high must be >= 0; got -0.2"),
        ({"dual_clip": 1.0}, "dual_clip must be None or > 1; got 1.0"),
        ({"agg": "sum"}, "unknown agg 'sum'"),
    ],
)
def test_policy_loss_rejects_bad_hyperparameters(kwargs, match):
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError, match=match):
        policy_loss(x, x, x, x, **kwargs)


@pytest.mark.parametrize(
    "clip,agg", [(0.5, "token_mean"), (0.1, "seq_mean_token_mean"), (None, "token_mean")]
)
def test_value_loss_matches_numpy(clip, agg):
    rng = np.random.default_rng(5)
    values, old_values, returns = rng.normal(size=(3, 4, 12)).astype(np.float32)
    mask = make_mask(5)
    fn = jax.jit(functools.partial(value_loss, clip=clip, agg=agg))
    (loss, stats), grad = jax.value_and_grad(fn, has_aux=True)(values, old_values, returns, mask)

    unclipped = (values - returns) ** 2
    if clip is None:
        per_token, chosen_clipped, d = unclipped, np.zeros(values.shape, bool), values - returns
    else:
        v_clip = old_values + np.clip(values - old_values, -clip, clip)
        clipped = (v_clip - returns) ** 2
        per_token, chosen_clipped = np.maximum(unclipped, clipped), clipped > unclipped
        # A chosen clipped branch does not move with `values` (its prediction is pinned).
        d = np.where(chosen_clipped, 0.0, values - returns)
    np.testing.assert_allclose(loss, 0.5 * aggregate_reference(per_token, mask, agg), rtol=1e-5)
    np.testing.assert_allclose(grad, d * token_weights(mask, agg), rtol=1e-5, atol=1e-7)
    on = mask != 0
    np.testing.assert_allclose(stats.clipfrac, chosen_clipped[on].mean(), rtol=1e-6)
    if clip == 0.1:
        assert 0 < stats.clipfrac < 1
    ev = 1 - np.var((returns - values)[on], ddof=1) / (np.var(returns[on], ddof=1) + 1e-5)
    np.testing.assert_allclose(stats.explained_var, ev, rtol=1e-5)


def test_explained_variance_extremes():
    returns = np.random.default_rng(6).normal(size=(2, 8)).astype(np.float32)
    mask = np.ones_like(returns)
    np.testing.assert_allclose(explained_variance(returns, returns, mask), 1.0)
    constant = np.full_like(returns, returns.mean())
    np.testing.assert_allclose(explained_variance(constant, returns, mask), 0.0, atol=1e-4)


@pytest.mark.parametrize(
    "kind,formula",
    [
        ("k1", lambda d: d),
        ("abs", np.abs),
        ("mse", lambda d: 0.5 * d**2),
        ("k3", lambda d: np.clip(np.exp(np.clip(-d, -20, 20)) + d - 1, -10, 10)),
    ],
)
def test_kl_penalty_matches_formulas(kind, formula):
    rng = np.random.default_rng(7)
    logp = rng.uniform(-6, 0, size=(3, 10)).astype(np.float32)
    ref = rng.uniform(-6, 0, size=(3, 10)).astype(np.float32)
    ref[0, :3] = logp[0, :3] + np.array([5.0, 30.0, -30.0])  # k3 hits its clip and the exp guard
    got = jax.jit(kl_penalty, static_argnums=2)(logp, ref, kind)
    np.testing.assert_allclose(got, formula(logp.astype(np.float64) - ref), rtol=1e-5, atol=1e-6)
    if kind == "k3":
        assert got[0, 1] == 10.0 and np.all(np.asarray(got) >= 0)


def test_kl_penalty_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown KL kind 'k2'; valid: k1, k3, mse, abs"):
        kl_penalty(np.zeros(2), np.zeros(2), "k2")


def test_entropy_matches_numpy_and_is_stable():
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(4, 12, 7)).astype(np.float32) * 3
    logits[0, 0] = [1e4, 1e4, -1e4, 0, 0, 0, 0]  # overflow-prone: entropy log 2
    logits[0, 1, 2:] = -np.inf  # masked vocabulary: 0 log 0 = 0
    mask = make_mask(8)

    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)

    got = np.asarray(jax.jit(token_entropy)(logits))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0, 0], np.log(2), rtol=1e-6)
    mean = jax.jit(entropy_from_logits)(logits, mask)
    np.testing.assert_allclose(mean, aggregate_reference(want, mask, "token_mean"), rtol=1e-5)
    half = entropy_from_logits(jnp.asarray(logits, jnp.bfloat16), mask)
    assert half.dtype == jnp.float32 and np.isfinite(half)
