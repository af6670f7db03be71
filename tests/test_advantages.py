"""Advantage estimators against plain Python/numpy loop references on random multi-turn rows."""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax import estimators
from starpo_jax.algo import advantages as adv_lib
from starpo_jax.algo.advantages import (AdvantageInputs, advantage_estimator_names, bi_level_gae,
                                        broadcast_to_tokens, gae, get_advantage_estimator, grpo,
                                        register_advantage_estimator, whiten)
from starpo_jax.config import AdvantageConfig
from starpo_jax.estimators import EstimatorSpec


def random_rows(seed: int, batch: int = 6, length: int = 40):
    """Rows of [prompt][reply][env msg][reply]...[padding] with per-turn rewards on turn ends.

    Returns float32 rewards, values, reply mask (0/1 int32) and int32 turn ids (-1 off replies).
    Some rewards also sit inside replies and on masked tokens (which must be ignored); the last
    row has no reply at all (a padding row).
    """
    rng = np.random.default_rng(seed)
    turn_ids = np.full((batch, length), -1, np.int32)
    rewards = rng.normal(size=(batch, length)).astype(np.float32) * (
        rng.random((batch, length)) < 0.1
    )
    for b in range(batch - 1):
        t, turn = int(rng.integers(1, 4)), 0
        while True:
            reply_len = int(rng.integers(1, 6))
            if t + reply_len > length:
                break
            turn_ids[b, t : t + reply_len] = turn
            rewards[b, t + reply_len - 1] += rng.normal()
            t += reply_len + int(rng.integers(1, 5))
            turn += 1
    values = rng.normal(size=(batch, length)).astype(np.float32)
    return rewards, values, (turn_ids >= 0).astype(np.int32), turn_ids


def gae_reference_masked_steps(rewards, values, mask, gamma, lam):
    """RAGEN's formulation: run over every token; masked ones use gamma = lam = 1, zero TD error
    and pass on the value of the next reply token. Then masked positions are zeroed."""
    batch, length = rewards.shape
    adv = np.zeros((batch, length))
    for b in range(batch):
        next_reply_value, running = 0.0, 0.0
        for t in reversed(range(length)):
            if t + 1 < length and mask[b, t + 1]:
                next_reply_value = values[b, t + 1]
            if mask[b, t]:
                delta = rewards[b, t] + gamma * next_reply_value - values[b, t]
                running = delta + gamma * lam * running
                adv[b, t] = running
            # masked token: delta 0, gamma = lam = 1 -> running unchanged.
    return adv, np.where(mask, adv + values, 0.0)


def gae_reference_compressed(rewards, values, mask, gamma, lam):
    """Textbook GAE on the reply tokens of each row taken out of the row."""
    adv = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx = np.flatnonzero(mask[b])
        r, v = rewards[b, idx], values[b, idx]
        running = 0.0
        for i in reversed(range(len(idx))):
            next_v = v[i + 1] if i + 1 < len(idx) else 0.0
            running = r[i] + gamma * next_v - v[i] + gamma * lam * running
            adv[b, idx[i]] = running
    return adv, np.where(mask, adv + values, 0.0)


def bi_level_reference(rewards, values, turn_ids, gamma, lam, gamma_turn, lam_turn):
    """Turn-level GAE over turns, then token-level GAE per turn, written with explicit lists."""
    adv = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        turns = []  # list of token-position lists, in time order
        for t in np.flatnonzero(turn_ids[b] >= 0):
            if not turns or turn_ids[b, turns[-1][-1]] != turn_ids[b, t]:
                turns.append([])
            turns[-1].append(t)
        start_value = [values[b, ts[0]] for ts in turns] + [0.0]
        turn_reward = [sum(rewards[b, t] for t in ts) for ts in turns]
        turn_adv = [0.0] * (len(turns) + 1)
        for k in reversed(range(len(turns))):
            delta = turn_reward[k] + gamma_turn * start_value[k + 1] - start_value[k]
            turn_adv[k] = delta + gamma_turn * lam_turn * turn_adv[k + 1]
        for k, ts in enumerate(turns):
            next_v, next_a = start_value[k + 1], turn_adv[k + 1]
            for t in reversed(ts):
                a = rewards[b, t] + gamma * next_v - values[b, t] + gamma * lam * next_a
                adv[b, t] = a
                next_v, next_a = values[b, t], a
    return adv, np.where(turn_ids >= 0, adv + values, 0.0)


# One compiled program per function, shared by the tests (all rows have the same shape).
gae_jit = jax.jit(gae)
bi_level_jit = jax.jit(bi_level_gae)
whiten_jit = jax.jit(whiten)

GAMMA_LAM = [(1.0, 1.0), (0.9, 0.95), (0.99, 0.5), (0.7, 0.0), (1.0, 0.8)]


@pytest.mark.parametrize("gamma,lam", GAMMA_LAM)
@pytest.mark.parametrize("seed", [0, 1])
def test_gae_matches_both_references(seed, gamma, lam):
    rewards, values, mask, _ = random_rows(seed)
    got_adv, got_ret = gae_jit(rewards, values, mask, gamma, lam)
    for reference in (gae_reference_masked_steps, gae_reference_compressed):
        want_adv, want_ret = reference(rewards, values, mask, gamma, lam)
        np.testing.assert_allclose(got_adv, want_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got_ret, want_ret, rtol=1e-5, atol=1e-5)
    assert got_adv.dtype == jnp.float32
    assert np.all(np.asarray(got_adv)[mask == 0] == 0)
    assert np.all(np.asarray(got_adv)[-1] == 0)  # the padding row


def test_gae_ignores_masked_entries():
    rewards, values, mask, _ = random_rows(3)
    noise = np.random.default_rng(9).normal(size=rewards.shape).astype(np.float32) * 100
    base = gae_jit(rewards, values, mask, 0.9, 0.9)
    poked = gae_jit(rewards + noise * (1 - mask), values + noise * (1 - mask), mask, 0.9, 0.9)
    for a, b in zip(base, poked):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "gamma,lam,gamma_turn,lam_turn",
    [(1.0, 1.0, 0.95, 1.0), (0.9, 0.95, 0.8, 0.7), (0.99, 0.0, 0.5, 0.9), (1.0, 0.5, 1.0, 0.0)],
)
@pytest.mark.parametrize("seed", [0, 5])
def test_bi_level_gae_matches_reference(seed, gamma, lam, gamma_turn, lam_turn):
    rewards, values, _, turn_ids = random_rows(seed)
    got_adv, got_ret = bi_level_jit(rewards, values, turn_ids, gamma, lam, gamma_turn, lam_turn)
    want_adv, want_ret = bi_level_reference(
        rewards, values, turn_ids, gamma, lam, gamma_turn, lam_turn
    )
    np.testing.assert_allclose(got_adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_ret, want_ret, rtol=1e-5, atol=1e-5)


def test_bi_level_gae_is_gae_when_undiscounted():
    rewards, values, mask, turn_ids = random_rows(7)
    undiscounted = bi_level_jit(rewards, values, turn_ids, 1.0, 1.0, 1.0, 1.0)
    for a, b in zip(undiscounted, gae_jit(rewards, values, mask, 1.0, 1.0)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bi_level_gae_docstring_example_and_lam_turn_default():
    rewards = np.array([[0, 1, 0, 0, 0, 6]], np.float32)
    values = np.array([[2, 3, 0, 4, 0, 6]], np.float32)
    turn_ids = np.array([[0, 0, -1, 1, -1, 2]], np.int32)
    adv, _ = bi_level_jit(rewards, values, turn_ids, 1.0, 1.0, 0.5, 1.0)
    np.testing.assert_allclose(adv, [[2, 1, 0, 2, 0, 0]])
    # lam_turn=None (the default) means lam_turn = lam. With a final reward of 8, A^turn_2 = 2
    # and A^turn_1 = -1 + 0.5 * lam_turn * 2 reaches turn 0's tokens, so lam_turn shows.
    rewards[0, 5] = 8.0
    default = bi_level_jit(rewards, values, turn_ids, 1.0, 0.5, 0.5)[0]
    np.testing.assert_allclose(
        default, bi_level_reference(rewards, values, turn_ids, 1.0, 0.5, 0.5, 0.5)[0]
    )
    assert not np.allclose(
        default, bi_level_reference(rewards, values, turn_ids, 1.0, 0.5, 0.5, 1.0)[0]
    )


def grpo_reference(scores, mode, eps=1e-6):
    out = np.array(scores, np.float64)
    if mode == "none" or out.shape[1] == 1:
        return out
    for p in range(out.shape[0]):
        row = out[p].copy()
        centred = row - row.mean()
        if mode == "mean":
            out[p] = centred
        else:
            std = np.std(row, ddof=1)
            out[p] = centred / (std + eps) if std > eps else 0.0
    return out


@pytest.mark.parametrize("mode", ["mean_std", "mean", "none"])
@pytest.mark.parametrize("shape", [(4, 8), (3, 2), (5, 1)])
def test_grpo_matches_reference(mode, shape):
    rng = np.random.default_rng(11)
    scores = rng.normal(size=shape).astype(np.float32)
    scores[0] = 0.25  # an all-equal group: no signal, advantage 0 under mean_std and mean
    got = jax.jit(grpo, static_argnames="mode")(scores, mode=mode)
    np.testing.assert_allclose(got, grpo_reference(scores, mode), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["mean_std", "mean"])
def test_grpo_equal_groups_are_exactly_zero(mode):
    """A group of equal scores carries no signal: exactly 0 at any magnitude and size (the
    float32 mean of 32 x 9.4 misses 9.4 by a rounding step; a plain std would pass eps)."""
    for size in (2, 3, 5, 8, 16, 32):
        values = np.array([0.1, 0.7, 1.0, 8.3, 9.4, 10.0, 37.9, 123.4, 999.7, 1e3], np.float32)
        scores = np.repeat(values[:, None], size, axis=1)
        got = np.asarray(jax.jit(grpo, static_argnames="mode")(scores, mode=mode))
        assert np.all(got == 0.0), (size, got[np.any(got != 0, axis=1)])


def test_grpo_random_groups_match_float64_reference():
    rng = np.random.default_rng(5)
    for size in (2, 3, 7, 32):
        scores = (rng.normal(size=(20, size)) * 3 + rng.uniform(-1e3, 1e3, (20, 1)))
        scores = scores.astype(np.float32)
        want = grpo_reference(scores.astype(np.float64), "mean_std")
        np.testing.assert_allclose(grpo(scores, "mean_std"), want, rtol=2e-3, atol=2e-4)


def test_grpo_bandit_example():
    # One group of four pulls of the high-risk arm: two paid 1.0, two paid 0.
    got = grpo(np.array([[1.0, 0.0, 1.0, 0.0]]), "mean_std")
    std = np.std([1, 0, 1, 0], ddof=1)
    np.testing.assert_allclose(got, [[0.5 / std, -0.5 / std, 0.5 / std, -0.5 / std]], rtol=1e-5)


@pytest.mark.parametrize("bad", [{"mode": "std"}, {"scores": np.zeros(4)}])
def test_grpo_rejects_bad_input(bad):
    args = {"scores": np.zeros((2, 2)), "mode": "mean"} | bad
    with pytest.raises(ValueError, match="mode|shape"):
        grpo(**args)


def test_broadcast_and_whiten():
    rewards, _, mask, _ = random_rows(4)
    traj = np.arange(mask.shape[0], dtype=np.float32)
    np.testing.assert_array_equal(broadcast_to_tokens(traj, mask), traj[:, None] * mask)

    x = rewards + 3.0
    got = np.asarray(whiten_jit(x, mask))
    on = mask != 0
    want = (x[on] - x[on].mean()) / np.sqrt(x[on].var(ddof=1) + 1e-8)
    np.testing.assert_allclose(got[on], want, rtol=1e-4, atol=1e-5)
    assert np.all(got[~on] == 0)


def test_registry_lists_and_rejects_names():
    assert {"gae", "bi_level_gae", "grpo"} <= set(advantage_estimator_names())
    with pytest.raises(ValueError, match="registered: .*bi_level_gae.*gae.*grpo"):
        get_advantage_estimator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("gae")(lambda inputs: (inputs.token_rewards, None))


def test_registering_a_new_estimator_is_one_function(monkeypatch):
    # The registry and its JAX-free metadata are restored afterwards.
    monkeypatch.setattr(adv_lib, "_ESTIMATORS", dict(adv_lib._ESTIMATORS))
    monkeypatch.setattr(estimators, "_SPECS", dict(estimators._SPECS))

    @register_advantage_estimator("test_reward_to_go")
    def reward_to_go(inputs: AdvantageInputs, gamma: float = 1.0):
        zeros = jnp.zeros_like(inputs.token_rewards)
        return gae_jit(inputs.token_rewards, zeros, inputs.reply_mask, gamma, 1.0)

    rewards, _, mask, _ = random_rows(6)
    adv, _ = get_advantage_estimator("test_reward_to_go")(AdvantageInputs(rewards, mask), gamma=0.5)
    np.testing.assert_allclose(
        adv, gae_reference_compressed(rewards, 0 * rewards, mask, 0.5, 1.0)[0], atol=1e-5
    )
    assert estimators.estimator_spec("test_reward_to_go") == EstimatorSpec(False, ("gamma",))
    assert AdvantageConfig(estimator="test_reward_to_go").estimator == "test_reward_to_go"


def test_the_config_metadata_are_the_registered_functions():
    """starpo_jax.estimators (no JAX: what the config checks) declares exactly the registered
    estimators, each with its function's parameters after `inputs` and its critic use: critic
    estimators return the critic's targets, critic-free ones None. So the two cannot drift."""
    assert estimators.estimator_names() == advantage_estimator_names()
    rewards, values, mask, turn_ids = random_rows(8)
    turns = int(turn_ids.max()) + 1
    inputs = AdvantageInputs(
        rewards, mask, values, turn_ids,
        scores=np.random.default_rng(8).normal(size=(3, 2)).astype(np.float32),
        turn_rewards=np.ones((6, turns), np.float32),
        turn_anchors=np.zeros((6, turns), np.int32))
    for name in advantage_estimator_names():
        fn = get_advantage_estimator(name)
        spec = estimators.estimator_spec(name)
        assert spec.params == tuple(inspect.signature(fn).parameters)[1:], name
        _, returns = fn(inputs)
        assert spec.critic == (returns is not None) == adv_lib.estimator_uses_critic(name), name
    with pytest.raises(ValueError, match="'gae' is declared as .*critic=True.* but its "
                                         "registration has .*critic=False"):
        estimators.declare_estimator("gae", critic=False, params=("gamma", "lam",
                                                                  "whiten_advantages"))


def test_registered_estimators_match_the_functions_under_jit():
    rewards, values, mask, turn_ids = random_rows(8)
    scores = np.random.default_rng(8).normal(size=(3, 2)).astype(np.float32)
    inputs = AdvantageInputs(rewards, mask, values, turn_ids, scores)

    def run(name, **params):
        return jax.jit(functools.partial(get_advantage_estimator(name), **params))(inputs)

    adv, ret = run("gae", gamma=0.9, lam=0.8, whiten_advantages=False)
    want = gae_jit(rewards, values, mask, 0.9, 0.8)
    np.testing.assert_allclose(adv, want[0], atol=1e-6)
    np.testing.assert_allclose(ret, want[1], atol=1e-6)
    adv, _ = run("gae", gamma=0.9, lam=0.8)  # whitened by default, as RAGEN
    np.testing.assert_allclose(adv, whiten_jit(want[0], mask), atol=1e-5)

    adv, ret = run("bi_level_gae", gamma=0.9, lam=0.8, gamma_turn=0.7, whiten_advantages=False)
    want = bi_level_reference(rewards, values, turn_ids, 0.9, 0.8, 0.7, 0.8)
    np.testing.assert_allclose(adv, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want[1], rtol=1e-5, atol=1e-5)

    adv, ret = run("grpo", mode="mean")
    assert ret is None
    np.testing.assert_allclose(
        adv, grpo_reference(scores, "mean").reshape(6)[:, None] * mask, atol=1e-6
    )


@pytest.mark.parametrize(
    "name,inputs,match",
    [
        ("gae", AdvantageInputs(np.zeros((2, 3)), np.ones((2, 3))), "needs AdvantageInputs.values"),
        (
            "bi_level_gae",
            AdvantageInputs(np.zeros((2, 3)), np.ones((2, 3)), np.zeros((2, 3))),
            "turn_ids",
        ),
        ("grpo", AdvantageInputs(np.zeros((2, 3)), np.ones((2, 3))), "scores"),
        (
            "grpo",
            AdvantageInputs(np.zeros((2, 3)), np.ones((2, 3)), scores=np.zeros((2, 2))),
            "do not match",
        ),
    ],
)
def test_estimators_name_missing_inputs(name, inputs, match):
    with pytest.raises(ValueError, match=match):
        get_advantage_estimator(name)(inputs)
