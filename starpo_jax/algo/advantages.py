"""Advantage estimators for multi-turn trajectories: GAE, bi-level GAE, GRPO, GiGPO, RLOO and
REINFORCE++ (with and without the group baseline).

A trajectory is one token row [T] holding every turn: environment/template tokens (mask 0), the
model's replies (mask 1) and padding (mask 0). Only reply tokens are decisions, so the token MDP
runs over reply tokens alone: masked tokens are skipped, never discounted over, and get
advantage and return 0. Rewards sit on reply tokens (the last reply token of the trajectory, or
of each turn); a reward on a masked token is ignored.

Estimators are registered by name (`register_advantage_estimator`) and share one signature,
`fn(inputs: AdvantageInputs, **params) -> (advantages [B, T], returns [B, T] | None)`, so the
train step picks one from the config and a new estimator is one new function. Registering one
also records its metadata (critic, parameters) in starpo_jax.estimators, the JAX-free table the
configuration checks `advantage.estimator` against; the built-ins are declared there too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from starpo_jax.algo.losses import aggregate, masked_var
from starpo_jax.estimators import declare_estimator, estimator_spec

GRPO_MODES = ("mean_std", "mean", "none")


def _reverse_scan_over_time(step: Callable, carry, *xs: jax.Array) -> jax.Array:
    """Runs `step` from the last token to the first on [B, T] inputs; returns its [B, T] output."""
    _, out = jax.lax.scan(step, carry, tuple(x.T for x in xs), reverse=True)
    return out.T


def gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over the reply tokens of multi-turn rows.

    For the reply tokens t_1 < ... < t_n of a row (mask nonzero), with V(t_{n+1}) = A(t_{n+1}) = 0:
        delta_i = r(t_i) + gamma V(t_{i+1}) - V(t_i)
        A(t_i)  = delta_i + gamma lam A(t_{i+1}),      R(t_i) = A(t_i) + V(t_i).
    This equals RAGEN's `compute_gae_advantage_return_multi_turn` on reply tokens (it runs over
    every token but uses gamma = lam = 1 and a zero TD error on masked ones, with the value of the
    next unmasked token); here masked tokens get 0 instead of the advantage carried through them.

    Args:
      rewards: [B, T] per-token rewards (only reply-token entries are used).
      values: [B, T] critic values.
      mask: [B, T] bool/int/float, nonzero on reply tokens.
      gamma, lam: discount and GAE lambda (RAGEN's defaults are 1.0, 1.0).
    Returns:
      (advantages [B, T] float32, returns [B, T] float32), both 0 on masked tokens.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    reply = jnp.asarray(mask) != 0

    def step(carry, x):
        next_value, next_adv = carry
        r, v, m = x
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        carry = (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv))
        return carry, jnp.where(m, adv, 0.0)

    zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
    advantages = _reverse_scan_over_time(step, (zeros, zeros), rewards, values, reply)
    return advantages, jnp.where(reply, advantages + values, 0.0)


def _turn_starts(turn_ids: jax.Array) -> jax.Array:
    """[B, T] bool: reply tokens whose previous reply token (if any) has another turn id."""
    reply = turn_ids >= 0
    positions = jnp.broadcast_to(jnp.arange(turn_ids.shape[1]), turn_ids.shape)
    last_reply_upto = jax.lax.cummax(jnp.where(reply, positions, -1), axis=1)
    last_reply_before = jnp.pad(last_reply_upto[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    prev_turn = jnp.take_along_axis(turn_ids, jnp.maximum(last_reply_before, 0), axis=1)
    prev_turn = jnp.where(last_reply_before >= 0, prev_turn, -1)
    return reply & (turn_ids != prev_turn)


def bi_level_gae(
    rewards: jax.Array,
    values: jax.Array,
    turn_ids: jax.Array,
    gamma: float = 1.0,
    lam: float = 1.0,
    gamma_turn: float = 0.95,
    lam_turn: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Bi-level GAE: GAE over turns, then GAE over tokens inside each turn (RAGEN's option).

    Turns are identified by `turn_ids`: [B, T] int32, the turn index of each reply token and -1 on
    every other token; the tokens of one turn are consecutive among the reply tokens of the row
    (masked tokens may sit between them). Turn level, for the turns k = 0..K-1 of a row:
        s_k = V(first reply token of turn k),  R_k = sum of the rewards on turn k's tokens,
        D_k = R_k + gamma_turn s_{k+1} - s_k,  A^turn_k = D_k + gamma_turn lam_turn A^turn_{k+1},
    with s_K = A^turn_K = 0. Token level, inside turn k with tokens t_1..t_m:
        A(t_i) = r(t_i) + gamma V(t_{i+1}) - V(t_i) + gamma lam A(t_{i+1})        for i < m,
        A(t_m) = r(t_m) + gamma s_{k+1}    - V(t_m) + gamma lam A^turn_{k+1}    (bootstrap from
    the next turn's start value and its turn-level advantage; both 0 after the last turn).
    Returns R(t) = A(t) + V(t) on reply tokens, 0 elsewhere.

    Worked example (one row, gamma = lam = lam_turn = 1, gamma_turn = 0.5):
        turn_ids = [0, 0, -1, 1, -1, 2]     (turn 0, env message, turn 1, env message, turn 2)
        values   = [2, 3,  0, 4,  0, 6]
        rewards  = [0, 1,  0, 0,  0, 6]
      Turn level: s = (2, 4, 6), R = (1, 0, 6);
        A^turn_2 = 6 - 6 = 0,  A^turn_1 = 0 + 0.5*6 - 4 + 0.5*0 = -1.
      Token level: A(5) = 6 - 6 = 0;  A(3) = 0 + s_2 - 4 + A^turn_2 = 2;
        A(1) = 1 + s_1 - 3 + A^turn_1 = 1;  A(0) = 3 - 2 + A(1) = 2.
      advantages = [2, 1, 0, 2, 0, 0]   (plain `gae` with gamma = 1 gives [5, 4, 0, 2, 0, 0]).
    With gamma = gamma_turn = 1 and lam = lam_turn = 1 this equals `gae`.

    Differences from RAGEN's `compute_bi_level_gae_advantage_return`, which finds turns as the
    tokens with a nonzero reward and uses the critic value at a turn's *last* token as its state
    value: here turn boundaries come from `turn_ids` (a turn with reward 0 is still a turn) and a
    turn's state value is the value at its first token, as the design brief asks.

    Args:
      rewards, values: [B, T] float; turn_ids: [B, T] int32 (-1 = not a reply token).
      gamma, lam: token-level discount and lambda. gamma_turn: turn-level discount (RAGEN's
        high_level_gamma, 0.95). lam_turn: turn-level lambda; None = lam, as RAGEN uses lam there.
    Returns:
      (advantages [B, T] float32, returns [B, T] float32).
    """
    lam_turn = lam if lam_turn is None else lam_turn
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    turn_ids = jnp.asarray(turn_ids, jnp.int32)
    starts = _turn_starts(turn_ids)

    def step(carry, x):
        # next_*: the next reply token in time; turn_*: the start of the next turn.
        next_value, next_adv, next_turn_id, turn_value, turn_adv, turn_reward = carry
        r, v, tid, start = x
        reply = tid >= 0
        end = reply & (tid != next_turn_id)
        boot_value = jnp.where(end, turn_value, next_value)
        boot_adv = jnp.where(end, turn_adv, next_adv)
        adv = r + gamma * boot_value - v + gamma * lam * boot_adv
        # Walking backwards, a turn's reward is complete when its first token is reached.
        turn_reward_here = jnp.where(end, 0.0, turn_reward) + r
        at_start = reply & start
        adv_of_turn = (
            turn_reward_here + gamma_turn * turn_value - v + gamma_turn * lam_turn * turn_adv
        )
        carry = (
            jnp.where(reply, v, next_value),
            jnp.where(reply, adv, next_adv),
            jnp.where(reply, tid, next_turn_id),
            jnp.where(at_start, v, turn_value),
            jnp.where(at_start, adv_of_turn, turn_adv),
            jnp.where(reply, turn_reward_here, turn_reward),
        )
        return carry, jnp.where(reply, adv, 0.0)

    zeros = jnp.zeros(rewards.shape[:1], jnp.float32)
    none = jnp.full(rewards.shape[:1], -1, jnp.int32)
    init = (zeros, zeros, none, zeros, zeros, zeros)
    advantages = _reverse_scan_over_time(step, init, rewards, values, turn_ids, starts)
    return advantages, jnp.where(turn_ids >= 0, advantages + values, 0.0)


def grpo(scores: jax.Array, mode: str = "mean_std", eps: float = 1e-6) -> jax.Array:
    """Group-relative advantages of trajectory scores (GRPO; RAGEN's reward normalisation).

    scores: [P, N] one score per trajectory, N trajectories per group (same initial state).
    mode: "mean_std": (s - mean) / (std + eps), std unbiased (torch's default, which RAGEN uses),
      and 0 for a group whose std is <= eps (RAGEN's guard: all-equal groups carry no signal);
      "mean": s - mean; "none": s unchanged.
    With N = 1 the scores are returned unchanged in every mode: RAGEN skips normalisation when
    groups have one member (there is no baseline to subtract).
    Returns [P, N] float32.
    """
    if mode not in GRPO_MODES:
        raise ValueError(f"unknown GRPO mode {mode!r}; valid: {', '.join(GRPO_MODES)}")
    scores = jnp.asarray(scores, jnp.float32)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [P, N]; got shape {scores.shape}")
    if mode == "none" or scores.shape[1] == 1:
        return scores
    # Shifting by one member first makes a group of equal scores exactly 0 in float32 (its mean
    # can miss the shared value by a rounding step, e.g. 32 x 9.4, which would give +-0.5).
    shifted = scores - scores[:, :1]
    centred = shifted - shifted.mean(axis=1, keepdims=True)
    if mode == "mean":
        return centred
    std = jnp.std(shifted, axis=1, keepdims=True, ddof=1)
    return jnp.where(std > eps, centred / (std + eps), 0.0)


def broadcast_to_tokens(trajectory_values: jax.Array, mask: jax.Array) -> jax.Array:
    """Puts one value per trajectory on each of its reply tokens.

    trajectory_values: [B]; mask: [B, T]. Returns [B, T] float32, 0 on masked tokens.
    """
    values = jnp.asarray(trajectory_values, jnp.float32)[:, None]
    return jnp.where(jnp.asarray(mask) != 0, values, 0.0)


def whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean) / sqrt(var + eps) over the masked tokens (verl's masked_whiten, shift_mean=True).

    x, mask: [B, T]; the mean and unbiased variance are over all masked tokens of the batch.
    Returns [B, T] float32, 0 on masked tokens.
    """
    mean = aggregate(x, mask, "token_mean")
    scaled = (jnp.asarray(x, jnp.float32) - mean) * jax.lax.rsqrt(masked_var(x, mask) + eps)
    return jnp.where(jnp.asarray(mask) != 0, scaled, 0.0)


class AdvantageInputs(NamedTuple):
    """Everything an estimator may read; fields an estimator does not need may be None.

    Row b of the [B, T] arrays is trajectory n of group p with b = p * N + n (group-major), so
    B = P * N and `scores.reshape(B)` lines up with the rows. The per-turn fields are [B, K]
    (K = max_turns).
    """

    token_rewards: jax.Array  # [B, T] float32, rewards on reply tokens
    reply_mask: jax.Array  # [B, T] nonzero on the model's reply tokens
    values: jax.Array | None = None  # [B, T] float32 critic values
    turn_ids: jax.Array | None = None  # [B, T] int32 turn index on reply tokens, -1 elsewhere
    scores: jax.Array | None = None  # [P, N] float32 trajectory scores (GRPO)
    turn_rewards: jax.Array | None = None  # [B, K] float32 each turn's reward (+ penalty)
    # [B, K] int32 anchor-state id of each turn (equal within a group <=> the turns start from
    # the same env state), -1 for turns not taken (GiGPO).
    turn_anchors: jax.Array | None = None


AdvantageEstimator = Callable[..., tuple[jax.Array, jax.Array | None]]
_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(name: str, *, critic: bool = False,
                                 ) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: registers `fn(inputs: AdvantageInputs, **params) -> (adv [B,T], returns|None)`.

    critic: the estimator reads the critic's values and returns the critic's targets (PPO's
    estimators); critic-free ones return None for them and train with algo "grpo".
    The estimator's metadata (critic, the names of fn's parameters after `inputs`) are also
    recorded in starpo_jax.estimators, which the configuration checks without JAX."""

    def decorate(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        declare_estimator(name, critic=critic, params=tuple(inspect.signature(fn).parameters)[1:])
        _ESTIMATORS[name] = fn
        return fn

    return decorate


def estimator_uses_critic(name: str) -> bool:
    """Whether the registered estimator `name` needs the critic (registered with critic=True)."""
    get_advantage_estimator(name)
    return estimator_spec(name).critic


def advantage_estimator_names() -> tuple[str, ...]:
    """The registered estimator names, sorted."""
    return tuple(sorted(_ESTIMATORS))


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; ValueError listing the registered names otherwise."""
    if name not in _ESTIMATORS:
        known = ", ".join(advantage_estimator_names())
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {known}")
    return _ESTIMATORS[name]


def _require(inputs: AdvantageInputs, estimator: str, *fields: str) -> None:
    missing = [f for f in fields if getattr(inputs, f) is None]
    if missing:
        raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{missing[0]}")


@register_advantage_estimator("gae", critic=True)
def _gae_estimator(
    inputs: AdvantageInputs, gamma: float = 1.0, lam: float = 1.0, whiten_advantages: bool = True
) -> tuple[jax.Array, jax.Array]:
    """`gae` on the inputs; whitened by default because RAGEN's multi-turn GAE always whitens."""
    _require(inputs, "gae", "values")
    adv, returns = gae(inputs.token_rewards, inputs.values, inputs.reply_mask, gamma, lam)
    return (whiten(adv, inputs.reply_mask) if whiten_advantages else adv), returns


@register_advantage_estimator("bi_level_gae", critic=True)
def _bi_level_gae_estimator(
    inputs: AdvantageInputs,
    gamma: float = 1.0,
    lam: float = 1.0,
    gamma_turn: float = 0.95,
    lam_turn: float | None = None,
    whiten_advantages: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """`bi_level_gae` on the inputs (needs values and turn_ids); whitened by default as RAGEN."""
    _require(inputs, "bi_level_gae", "values", "turn_ids")
    adv, returns = bi_level_gae(
        inputs.token_rewards, inputs.values, inputs.turn_ids, gamma, lam, gamma_turn, lam_turn
    )
    return (whiten(adv, inputs.reply_mask) if whiten_advantages else adv), returns


@register_advantage_estimator("grpo")
def _grpo_estimator(
    inputs: AdvantageInputs,
    mode: str = "mean_std",
    eps: float = 1e-6,
    whiten_advantages: bool = False,
) -> tuple[jax.Array, None]:
    """`grpo` of inputs.scores [P, N], broadcast onto each row's reply tokens; no returns."""
    _require(inputs, "grpo", "scores")
    batch = inputs.reply_mask.shape[0]
    if inputs.scores.size != batch:
        raise ValueError(
            f"scores of shape {inputs.scores.shape} do not match the {batch} rows of reply_mask"
        )
    adv = broadcast_to_tokens(grpo(inputs.scores, mode, eps).reshape(batch), inputs.reply_mask)
    return (whiten(adv, inputs.reply_mask) if whiten_advantages else adv), None


def rloo(scores: jax.Array) -> jax.Array:
    """REINFORCE leave-one-out advantages: each score less the mean of the other N - 1 of its
    group (verl's rloo: s_i N / (N - 1) - mean N / (N - 1)).

    scores: [P, N]. With N = 1 the scores are returned unchanged (no other member: verl's
    baseline is then 0). Returns [P, N] float32; a group of equal scores gives exactly 0.
    """
    scores = jnp.asarray(scores, jnp.float32)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [P, N]; got shape {scores.shape}")
    n = scores.shape[1]
    if n == 1:
        return scores
    shifted = scores - scores[:, :1]  # exact 0 for equal groups (see `grpo`)
    return (shifted * n - shifted.sum(axis=1, keepdims=True)) / (n - 1)


def discounted_turn_returns(turn_rewards: jax.Array, gamma: float) -> jax.Array:
    """R_t = sum_{k >= t} gamma^(k - t) r_k over the turns of each row: [B, K] -> [B, K].

    Turns not taken come after the taken ones and hold reward 0, so they add nothing."""
    def step(carry, x):
        carry = x[0] + gamma * carry
        return carry, carry

    rewards = jnp.asarray(turn_rewards, jnp.float32)
    return _reverse_scan_over_time(step, jnp.zeros(rewards.shape[:1], jnp.float32), rewards)


def _same_anchor(anchors: jax.Array) -> jax.Array:
    """[P, M] int32 anchor ids (-1 = no turn) -> [P, M, M] bool: i and j share an anchor."""
    valid = anchors >= 0
    return valid[:, :, None] & valid[:, None, :] & (anchors[:, :, None] == anchors[:, None, :])


def anchor_ids(observations: jax.Array, taken: jax.Array, group_size: int) -> jax.Array:
    """Exact anchor-state ids: [B, K, S] int observations of the state each turn starts from,
    [B, K] bool turns taken -> [B, K] int32.

    The id of turn (n, k) of group p is the flat index n * K + k' of the first turn of the
    group (in that order) whose observation is identical in all S entries; -1 for turns not
    taken. Two turns of a group share an id exactly when their observations are equal: no
    hash, so no collisions.
    """
    b, k, s = observations.shape
    obs = observations.reshape(b // group_size, group_size * k, s)
    valid = taken.reshape(b // group_size, group_size * k)
    same = jnp.all(obs[:, :, None, :] == obs[:, None, :, :], axis=-1)
    same = same & valid[:, :, None] & valid[:, None, :]
    first = jnp.argmax(same, axis=-1).astype(jnp.int32)
    return jnp.where(valid, first, -1).reshape(b, k)


def anchor_share(turn_anchors: jax.Array, group_size: int) -> jax.Array:
    """Share of the taken turns (anchor >= 0) whose anchor group within their trajectory group
    has >= 2 members: [B, K] int32 -> float32 scalar (0 with no turn taken)."""
    anchors = jnp.asarray(turn_anchors).reshape(-1, group_size * turn_anchors.shape[1])
    shared = _same_anchor(anchors).sum(-1) >= 2
    taken = (anchors >= 0).sum()
    return shared.sum() / jnp.maximum(taken, 1).astype(jnp.float32)


def step_advantages(returns: jax.Array, anchors: jax.Array, mode: str = "mean_std",
                    eps: float = 1e-6) -> jax.Array:
    """GiGPO's step-level advantages: each turn's return normalised within its anchor group.

    returns: [P, M] float32 turn returns; anchors: [P, M] int32 ids (-1 = no turn), the M
    turns of group p being all turns of its N trajectories. Within the turns of a group that
    share an anchor: "mean_std": (R - mean) / (std + eps), std unbiased, 0 where std <= eps
    (as `grpo`); "mean": R - mean. A turn alone in its anchor group, or not taken, gets 0.
    Returns [P, M] float32.
    """
    if mode not in ("mean_std", "mean"):
        raise ValueError(f"unknown step mode {mode!r}; valid: mean_std, mean")
    returns = jnp.asarray(returns, jnp.float32)
    same = _same_anchor(jnp.asarray(anchors))
    count = same.sum(-1).astype(jnp.float32)
    # Shifted by the group's first member: equal returns give exactly 0 (as `grpo`).
    first = jnp.argmax(same, axis=-1)
    shifted = returns - jnp.take_along_axis(returns, first, axis=1)
    mean = jnp.sum(jnp.where(same, shifted[:, None, :], 0.0), -1) / jnp.maximum(count, 1.0)
    adv = shifted - mean
    if mode == "mean_std":
        dev = jnp.where(same, shifted[:, None, :] - mean[:, :, None], 0.0)
        std = jnp.sqrt(jnp.sum(jnp.square(dev), -1) / jnp.maximum(count - 1.0, 1.0))
        adv = jnp.where(std > eps, adv / (std + eps), 0.0)
    return jnp.where(count >= 2, adv, 0.0)


def gigpo(scores: jax.Array, turn_rewards: jax.Array, turn_anchors: jax.Array,
          turn_ids: jax.Array, mode: str = "mean_std", step_mode: str = "mean_std",
          step_gamma: float = 0.95, omega: float = 1.0, eps: float = 1e-6) -> jax.Array:
    """GiGPO (group-in-group policy optimisation, Feng et al. 2025, arXiv 2505.10978).

    A_E(row) = grpo(scores, mode): the episode-level advantage of each trajectory in its group.
    A_S(row, k) = step_advantages over the turns of the group that start from the same env
    state (anchor), of each turn's discounted return R_k = sum_{j >= k} step_gamma^(j-k) r_j.
    Each reply token of turn k takes A_E(row) + omega * A_S(row, k); other tokens 0.

    scores: [P, N]; turn_rewards, turn_anchors: [B, K] (B = P * N; anchors -1 on turns not
    taken); turn_ids: [B, T] int32 turn of each reply token, -1 elsewhere.
    Returns [B, T] float32.
    """
    p, n = jnp.shape(scores)
    b, k = jnp.shape(turn_rewards)
    episode = grpo(scores, mode, eps).reshape(b)
    returns = discounted_turn_returns(turn_rewards, step_gamma).reshape(p, n * k)
    step = step_advantages(returns, jnp.asarray(turn_anchors).reshape(p, n * k), step_mode,
                           eps).reshape(b, k)
    turn_ids = jnp.asarray(turn_ids)
    per_token = jnp.take_along_axis(step, jnp.maximum(turn_ids, 0), axis=1)
    return jnp.where(turn_ids >= 0, episode[:, None] + omega * per_token, 0.0)


@register_advantage_estimator("gigpo")
def _gigpo_estimator(
    inputs: AdvantageInputs,
    mode: str = "mean_std",
    step_mode: str = "mean_std",
    step_gamma: float = 0.95,
    omega: float = 1.0,
    eps: float = 1e-6,
) -> tuple[jax.Array, None]:
    """`gigpo` on the inputs (scores, turn_rewards, turn_anchors, turn_ids); no returns."""
    _require(inputs, "gigpo", "scores", "turn_rewards", "turn_anchors", "turn_ids")
    adv = gigpo(inputs.scores, inputs.turn_rewards, inputs.turn_anchors, inputs.turn_ids, mode,
                step_mode, step_gamma, omega, eps)
    return jnp.where(jnp.asarray(inputs.reply_mask) != 0, adv, 0.0), None


@register_advantage_estimator("rloo")
def _rloo_estimator(inputs: AdvantageInputs) -> tuple[jax.Array, None]:
    """`rloo` of inputs.scores [P, N] on each row's reply tokens (verl's rloo); no returns."""
    _require(inputs, "rloo", "scores")
    batch = inputs.reply_mask.shape[0]
    return broadcast_to_tokens(rloo(inputs.scores).reshape(batch), inputs.reply_mask), None


@register_advantage_estimator("reinforce_plus_plus")
def _reinforce_pp_estimator(inputs: AdvantageInputs, gamma: float = 1.0,
                            ) -> tuple[jax.Array, None]:
    """REINFORCE++ (verl's): each reply token's discounted return over the row's later reply
    tokens (masked tokens skipped, as in `gae`), whitened over the batch's reply tokens."""
    zeros = jnp.zeros(jnp.shape(inputs.token_rewards), jnp.float32)
    # GAE with zero values and lambda 1 is the discounted return.
    returns, _ = gae(inputs.token_rewards, zeros, inputs.reply_mask, gamma, 1.0)
    return whiten(returns, inputs.reply_mask), None


@register_advantage_estimator("reinforce_plus_plus_baseline")
def _reinforce_pp_baseline_estimator(inputs: AdvantageInputs) -> tuple[jax.Array, None]:
    """REINFORCE++ with the group baseline (verl's): each score less its group's mean (as
    verl: unchanged for N = 1), on every reply token of the row, whitened over the batch."""
    _require(inputs, "reinforce_plus_plus_baseline", "scores")
    batch = inputs.reply_mask.shape[0]
    centred = broadcast_to_tokens(grpo(inputs.scores, "mean").reshape(batch), inputs.reply_mask)
    return whiten(centred, inputs.reply_mask), None
