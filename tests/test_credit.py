"""GiGPO, RLOO and REINFORCE++ against plain numpy/Python references written from their
definitions (GiGPO: Feng et al. 2025, arXiv 2505.10978; RLOO and REINFORCE++: verl's), on
hand-made groups; and the config's refusal of estimator parameters the estimator lacks."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from starpo_jax.algo.advantages import (AdvantageInputs, anchor_ids, anchor_share,
                                        get_advantage_estimator, gigpo, rloo)
from starpo_jax.config import AdvantageConfig, TrainConfig
from starpo_jax.rollout.host import _anchor_ids as host_anchor_ids
from test_advantages import random_rows

EPS = 1e-6

# Two groups of N = 3 trajectories, K = 4 turns; the state each turn starts from (None = turn
# not taken). Group 0: a shared first state, a state revisited within one trajectory ("b" at
# turns 1 and 3 of row 0), ragged turns (row 2 stops after 2), "c" reached by two rows at
# different turns. Group 1: the same state names as group 0 (anchors never cross groups),
# a state met only once, and a row of one turn.
STATES = [
    ["s", "b", "a", "b"], ["s", "a", "c", None], ["s", "c", None, None],
    ["t", "a", "b", "x"], ["t", "a", "y", None], ["t", None, None, None],
]
REWARDS = np.array([
    [0.0, 1.0, -0.5, 2.0], [0.0, 0.5, 3.0, 0.0], [1.0, -1.0, 0.0, 0.0],
    [0.2, 0.0, 0.0, 10.0], [0.0, 0.3, 0.1, 0.0], [5.0, 0.0, 0.0, 0.0],
], np.float32)
N, K = 3, 4


def observations_of(states):
    """[B, K, 2] int observations (a string's code points, two of them) and [B, K] taken. Turns
    not taken get the observation of state "s" on purpose: they must still be excluded."""
    obs = np.zeros((len(states), K, 2), np.int32)
    taken = np.zeros((len(states), K), bool)
    for b, row in enumerate(states):
        for k, state in enumerate(row):
            obs[b, k] = [ord((state or "s")[0]), len(state or "s")]
            taken[b, k] = state is not None
    return obs, taken


def token_turns(taken, reply=3, gap=2, length=40):
    """[B, length] turn ids: each taken turn's `reply` tokens, `gap` masked tokens between."""
    ids = np.full((taken.shape[0], length), -1, np.int32)
    for b in range(taken.shape[0]):
        t = 1
        for k in range(K):
            if taken[b, k]:
                ids[b, t: t + reply] = k
                t += reply + gap
    return ids


def normalise(xs, mode):
    xs = np.asarray(xs, np.float64)
    centred = xs - xs.mean()
    if mode == "mean":
        return centred
    std = np.std(xs, ddof=1)
    return centred / (std + EPS) if std > EPS else np.zeros_like(xs)


def gigpo_reference(states, rewards, turn_ids, gamma, omega, mode, step_mode, n=N):
    """The paper's definitions, by loops: A_E over the group's episode returns; each taken
    turn's discounted return normalised among the group's taken turns from the same state
    (alone: 0); a token of turn k gets A_E + omega * A_S(k)."""
    b = len(states)
    taken = np.array([[s is not None for s in row] for row in states])
    scores = (rewards * taken).sum(1)
    episode = np.zeros(b)
    k_turns = len(states[0])
    for g in range(b // n):
        rows = list(range(g * n, (g + 1) * n))
        episode[rows] = normalise(scores[rows], mode) if n > 1 else scores[rows]
    returns = np.zeros((b, k_turns))
    for r in range(b):
        for k in range(k_turns):
            returns[r, k] = sum(gamma ** (j - k) * rewards[r, j] for j in range(k, k_turns)
                                if taken[r, j])
    step = np.zeros((b, k_turns))
    for g in range(b // n):
        members: dict[str, list[tuple[int, int]]] = {}
        for r in range(g * n, (g + 1) * n):
            for k, state in enumerate(states[r]):
                if state is not None:
                    members.setdefault(state, []).append((r, k))
        for turns in members.values():
            if len(turns) >= 2:
                adv = normalise([returns[r, k] for r, k in turns], step_mode)
                for (r, k), a in zip(turns, adv):
                    step[r, k] = a
    out = np.zeros(turn_ids.shape)
    for r in range(b):
        for t in range(turn_ids.shape[1]):
            if turn_ids[r, t] >= 0:
                out[r, t] = episode[r] + omega * step[r, turn_ids[r, t]]
    return out, step


def test_anchor_ids_are_exact_and_group_local():
    obs, taken = observations_of(STATES)
    ids = np.asarray(anchor_ids(obs, taken, N))
    for g in range(2):
        rows = range(g * N, (g + 1) * N)
        turns = [(r, k) for r in rows for k in range(K) if STATES[r][k] is not None]
        for r1, k1 in turns:
            for r2, k2 in turns:
                assert (ids[r1, k1] == ids[r2, k2]) == (STATES[r1][k1] == STATES[r2][k2])
    assert np.all((ids == -1) == ~taken)
    # The host's ids (texts compared as strings) follow the same numbering.
    texts = np.array([[s for s in row] for row in STATES], object)
    np.testing.assert_array_equal(host_anchor_ids(texts, N), ids)


def test_anchor_share_counts_taken_turns_with_a_partner():
    obs, taken = observations_of(STATES)
    share = float(anchor_share(anchor_ids(obs, taken, N), N))
    # Group 0: s x3, b x2, a x2, c x2 = 9 of 9; group 1: t x3, a x2, b/x/y alone = 5 of 8.
    np.testing.assert_allclose(share, 14 / 17, rtol=1e-6)


@pytest.mark.parametrize("mode,step_mode", [("mean_std", "mean_std"), ("mean", "mean"),
                                            ("mean_std", "mean")])
@pytest.mark.parametrize("gamma,omega", [(0.95, 1.0), (1.0, 0.5), (0.5, 2.0)])
def test_gigpo_matches_the_papers_definitions(mode, step_mode, gamma, omega):
    obs, taken = observations_of(STATES)
    rewards = REWARDS * taken  # turns not taken carry no reward, as in a rollout
    scores = rewards.sum(1).reshape(2, N)
    turn_ids = token_turns(taken)
    got = jax.jit(functools.partial(gigpo, mode=mode, step_mode=step_mode, step_gamma=gamma,
                                    omega=omega))(scores, rewards, anchor_ids(obs, taken, N),
                                                  turn_ids)
    want, step = gigpo_reference(STATES, REWARDS, turn_ids, gamma, omega, mode, step_mode)
    assert np.abs(step).max() > 0.1  # the step level really contributes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gigpo_equal_returns_in_an_anchor_group_are_exactly_zero():
    # Every turn from "s" returns 9.4 (float32's mean of such values misses by a rounding).
    states = [["s", "s"], ["s", None], ["s", "s"]] * 1
    rewards = np.array([[0.0, 9.4], [9.4, 0.0], [0.0, 9.4]], np.float32)
    obs = np.zeros((3, 2, 1), np.int32)
    taken = np.array([[s is not None for s in row] for row in states])
    ids = np.array([[0, 0], [0, -1], [0, 0]], np.int32)
    np.testing.assert_array_equal(anchor_ids(obs, taken, 3), ids)
    turn_ids = np.array([[0, 1], [0, -1], [0, 1]], np.int32)
    got = gigpo(rewards.sum(1).reshape(1, 3), rewards, ids, turn_ids, step_gamma=1.0)
    # Episode returns are all 9.4 and turn returns all 9.4: no signal anywhere.
    assert np.all(np.asarray(got) == 0.0)


def test_gigpo_estimator_by_name_and_its_missing_inputs():
    obs, taken = observations_of(STATES)
    rewards = REWARDS * taken
    turn_ids = token_turns(taken)
    mask = (turn_ids >= 0).astype(np.int32)
    inputs = AdvantageInputs(np.zeros(turn_ids.shape, np.float32), mask, turn_ids=turn_ids,
                             scores=rewards.sum(1).reshape(2, N), turn_rewards=rewards,
                             turn_anchors=anchor_ids(obs, taken, N))
    adv, returns = get_advantage_estimator("gigpo")(inputs, omega=0.7, step_gamma=0.9)
    assert returns is None
    want, _ = gigpo_reference(STATES, REWARDS, turn_ids, 0.9, 0.7, "mean_std", "mean_std")
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="gigpo.*needs AdvantageInputs.turn_anchors"):
        get_advantage_estimator("gigpo")(inputs._replace(turn_anchors=None))


def test_rloo_matches_leave_one_out():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5):
        scores = rng.normal(size=(4, n)).astype(np.float32) * 3 + 8
        scores[0] = 9.4  # an equal group: exactly 0 (N > 1)
        want = np.array(scores, np.float64)
        if n > 1:
            for p in range(4):
                for i in range(n):
                    others = [scores[p, j] for j in range(n) if j != i]
                    want[p, i] = scores[p, i] - np.mean(np.asarray(others, np.float64))
            assert np.all(np.asarray(rloo(scores))[0] == 0.0)
        np.testing.assert_allclose(rloo(scores), want, rtol=1e-5, atol=1e-5)
    rewards, _, mask, _ = random_rows(2, batch=6)
    scores = rng.normal(size=(2, 3)).astype(np.float32)
    adv, _ = get_advantage_estimator("rloo")(AdvantageInputs(rewards, mask, scores=scores))
    np.testing.assert_allclose(adv, np.asarray(rloo(scores)).reshape(6)[:, None] * mask)


def whiten_reference(x, mask):
    on = mask != 0
    out = np.zeros(x.shape)
    out[on] = (x[on] - x[on].mean()) / np.sqrt(x[on].var(ddof=1) + 1e-8)
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_whitens_discounted_returns(gamma):
    rewards, _, mask, _ = random_rows(4)
    returns = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t]:  # the MDP runs over reply tokens; other tokens are skipped
                running = rewards[b, t] + gamma * running
                returns[b, t] = running
    fn = functools.partial(get_advantage_estimator("reinforce_plus_plus"), gamma=gamma)
    adv, ret = jax.jit(fn)(AdvantageInputs(rewards, mask))
    assert ret is None
    np.testing.assert_allclose(adv, whiten_reference(returns, mask), rtol=1e-4, atol=1e-4)


def test_reinforce_plus_plus_baseline_whitens_centred_scores():
    rewards, _, mask, _ = random_rows(5, batch=6)
    scores = np.random.default_rng(5).normal(size=(2, 3)).astype(np.float32)
    centred = scores - scores.mean(1, keepdims=True)
    x = centred.reshape(6)[:, None] * np.ones(mask.shape)
    adv, _ = get_advantage_estimator("reinforce_plus_plus_baseline")(
        AdvantageInputs(rewards, mask, scores=scores))
    np.testing.assert_allclose(adv, whiten_reference(x, mask), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("estimator,field,value", [
    ("grpo", "gamma_turn", 0.9), ("grpo", "step_gamma", 0.5), ("gigpo", "lam", 0.9),
    ("rloo", "grpo_mode", "mean"), ("reinforce_plus_plus", "omega", 2.0),
])
def test_a_parameter_the_estimator_does_not_read_is_refused(estimator, field, value):
    with pytest.raises(ValueError, match=rf"advantage.{field} = {value!r} is invalid; valid: its "
                                         rf"default: estimator '{estimator}' does not read it"):
        TrainConfig(algo="grpo", advantage=AdvantageConfig(estimator=estimator,
                                                           **{field: value}))
    # The estimator's own parameters are accepted.
    TrainConfig(algo="grpo", advantage=AdvantageConfig(estimator="gigpo", step_gamma=0.5,
                                                       omega=0.3, step_mode="mean",
                                                       grpo_mode="mean"))


@pytest.mark.parametrize("estimator", ["gigpo", "rloo", "reinforce_plus_plus", "grpo"])
def test_critic_free_estimators_refuse_ppo(estimator):
    with pytest.raises(ValueError, match=rf"advantage.estimator = '{estimator}' is invalid; "
                                         "valid: one with a critic for algo 'ppo'"):
        TrainConfig(algo="ppo", advantage=AdvantageConfig(estimator=estimator))
