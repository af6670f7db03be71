"""The step as the original runs it: independent env streams within a group, training
log-probs at the rollout temperature, mini-batches counted in rows, entropy over every rolled-out
row; and the step as public pieces (rollout, prepare, update) whose composition is the step."""

from __future__ import annotations

import dataclasses
import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax.algo import advantages as adv_lib  # noqa: E402
from starpo_jax.config import (AdvantageConfig, FilterConfig, LossConfig, OptimConfig,  # noqa: E402
                               RolloutConfig, TrainConfig)
from starpo_jax.train.forward import sequence_logprobs  # noqa: E402
from starpo_jax.algo.losses import aggregate  # noqa: E402
from starpo_jax.rollout.jax_env import group_states  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_fns, make_train_step  # noqa: E402
from test_rollout import REPLY_TOKENS, tiny_bandit_setup  # noqa: E402

HIGH = 1  # bandit's high-risk arm (Dragon): action index 1


@pytest.mark.parametrize("shared", [False, True])
def test_rows_of_a_group_draw_their_own_env_randomness(shared):
    env = envs_jax.make("bandit")  # the high arm pays with p = 0.25
    p, n = 6, 16
    states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(0), p))
    rows = group_states(states, n, shared_randomness=shared)
    _, ts = jax.vmap(env.step)(rows, jnp.full((p * n,), HIGH, jnp.int32))
    payouts = np.asarray(ts.reward).reshape(p, n)
    mixed = [len(set(group)) > 1 for group in payouts.tolist()]
    if shared:  # every Dragon pick of a group is the same coin flip
        assert not any(mixed), payouts
    else:  # P(all 16 equal) = 0.25^16 + 0.75^16 ~ 1%: at most one group of six may be uniform
        assert sum(mixed) >= p - 1, payouts
        assert 0.1 < payouts.mean() < 0.4  # still the arm's own odds
    # The initial state itself is the group's own either way.
    np.testing.assert_array_equal(np.asarray(rows.order).reshape(p, n),
                                  np.repeat(np.asarray(states.order)[:, None], n, 1))


def _config(**optim) -> TrainConfig:
    return TrainConfig(
        algo="grpo",
        rollout=RolloutConfig(groups=4, group_size=2, max_turns=1, reply_tokens=REPLY_TOKENS,
                              mode="nothink", temperature=0.7),
        filter=FilterConfig(keep_ratio=0.5),
        loss=LossConfig(entropy_coef=0.01),
        optim=OptimConfig(**{"actor_lr": 1e-3, **optim}))


@functools.cache
def _pieces(config: TrainConfig):
    model, tok, env, codec = tiny_bandit_setup()
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    jitted = jax.jit(fns.rollout), jax.jit(fns.prepare), jax.jit(fns.update)
    return model, fns, jitted


def _state(config):
    model, _, _ = _pieces(config)
    return init_train_state(config, jax.random.PRNGKey(0), model=model)


def test_minibatches_are_counted_in_rows():
    def count(groups, keep, rows):
        return TrainConfig(rollout=RolloutConfig(groups=groups, group_size=16),
                           filter=FilterConfig(keep_ratio=keep),
                           optim=OptimConfig(minibatch_rows=rows)).minibatches
    assert count(8, 1.0, 32) == 4  # vanilla StarPO: 128 rows, 4 updates
    assert count(8, 0.25, 32) == 1  # StarPO-S: 32 kept rows, 1 update
    assert count(2, 0.5, 32) == 1  # fewer kept rows than a mini-batch: one of all of them
    config = _config(minibatch_rows=2)  # 4 kept rows in 2 mini-batches of 2
    _, _, (rollout, prepare, update) = _pieces(config)
    state = _state(config)
    batch = prepare(state, rollout(state, jax.random.PRNGKey(1)))
    assert batch.old_logp is not None  # two updates: the ratio needs the old policy
    state, _ = update(state, batch, jax.random.PRNGKey(2))
    adam = [s for s in jax.tree.leaves(state.actor_opt) if getattr(s, "shape", None) == ()]
    assert [int(c) for c in adam] == [2], adam  # AdamW's step count: one per mini-batch


def test_one_update_skips_the_old_forward_with_the_same_result():
    """One mini-batch, one epoch, k = 1: prepare computes no old log-probs; the update (ratio
    stop_gradient(exp(0)) = 1) equals one given the old log-probs of a separate forward."""
    config = _config()
    assert config.single_update
    model, fns, (rollout, prepare, update) = _pieces(config)
    state = _state(config)
    batch = prepare(state, rollout(state, jax.random.PRNGKey(1)))
    assert batch.old_logp is None
    kept = batch.rollout
    old, _ = jax.jit(lambda p: sequence_logprobs(
        nnx.merge(nnx.graphdef(model), p), kept.tokens, kept.lengths, kept.loss_mask,
        REPLY_TOKENS, REPLY_TOKENS, config.rollout.temperature))(state.actor)
    skipped, m1 = update(state, batch, jax.random.PRNGKey(2))
    given, m2 = update(_state(config), batch.replace(old_logp=old), jax.random.PRNGKey(2))
    for a, b in zip(jax.tree.leaves(skipped.actor), jax.tree.leaves(given.actor)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    for name in ("actor/pg_loss", "actor/grad_norm", "rollout/logprob_diff_mean"):
        np.testing.assert_allclose(m1[name], m2[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert float(m1["actor/pg_clipfrac"]) == 0.0


def test_training_logprobs_are_the_samplers_at_its_temperature():
    """At temperature 0.7 the trainer scores the tokens as the sampler drew them: the
    sampler/trainer mismatch is float rounding (float32 cache), and the sampler's entropy is
    the teacher-forced one. Without the temperature both would be off by ~O(1)."""
    config = _config()
    _, _, (rollout, prepare, update) = _pieces(config)
    state = _state(config)
    out = rollout(state, jax.random.PRNGKey(3))
    assert out.loss_mask.any()
    _, metrics = update(state, prepare(state, out), jax.random.PRNGKey(2))
    assert float(metrics["rollout/logprob_diff_mean"]) < 1e-4, metrics
    assert float(metrics["rollout/logprob_diff_max"]) < 1e-3, metrics
    model, _, _ = _pieces(config)
    logp, entropy = sequence_logprobs(model, out.tokens, out.lengths, out.loss_mask,
                                      REPLY_TOKENS, REPLY_TOKENS, 0.7)
    mask = np.asarray(out.loss_mask)
    np.testing.assert_allclose(np.asarray(out.behaviour_entropy)[mask], np.asarray(entropy)[mask],
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.behaviour_logp)[mask], np.asarray(logp)[mask],
                               rtol=1e-4, atol=1e-5)


def test_entropy_is_over_every_row_and_the_step_is_its_pieces():
    """actor/entropy averages the sampler's entropy over all P * N rows, actor/entropy_kept
    over the kept ones; the jitted step equals rollout -> prepare -> update run one by one."""
    config = _config()
    model, tok, env, codec = tiny_bandit_setup()
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    key = jax.random.PRNGKey(4)
    _, _, (rollout, prepare, update) = _pieces(config)
    state = _state(config)
    rollout_key, update_key = jax.random.split(jax.random.fold_in(key, state.step))
    out = rollout(state, rollout_key)
    batch = prepare(state, out)
    by_hand, aux = update(state, batch, jax.random.split(update_key, 1)[0])
    stepped, metrics = step(_state(config), key)
    # One program against three: XLA may fuse (and so round) differently across the pieces'
    # boundaries; 1e-6 is 1/1000 of this Adam step's size (lr 1e-3).
    for a, b in zip(jax.tree.leaves(by_hand.actor), jax.tree.leaves(stepped.actor)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    for name, value in aux.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    everyone = aggregate(out.behaviour_entropy, out.loss_mask)
    np.testing.assert_allclose(metrics["actor/entropy"], everyone, rtol=1e-6)
    kept = aggregate(batch.rollout.behaviour_entropy, batch.rollout.loss_mask)
    np.testing.assert_allclose(metrics["actor/entropy_kept"], kept, rtol=1e-4)


_TOY = "toy_sign_of_score"


def test_a_registered_estimator_trains_by_name():
    """The registry is the source of valid names: a new estimator is usable by name in the
    config, and an unregistered name is refused, listing the registered ones."""
    if _TOY not in adv_lib.advantage_estimator_names():
        @adv_lib.register_advantage_estimator(_TOY)
        def _toy(inputs, mode: str = "mean_std"):  # reads one config field by its name
            score = jnp.sign(inputs.scores.reshape(-1))
            return adv_lib.broadcast_to_tokens(score, inputs.reply_mask), None
    with pytest.raises(ValueError, match=r"advantage.estimator = 'nope' is invalid; .*" + _TOY):
        AdvantageConfig(estimator="nope")
    config = dataclasses.replace(_config(), advantage=AdvantageConfig(estimator=_TOY))
    _, _, (rollout, prepare, update) = _pieces(config)
    state = _state(config)
    batch = prepare(state, rollout(state, jax.random.PRNGKey(5)))
    want = np.sign(np.asarray(batch.rollout.scores))[:, None] * np.asarray(batch.rollout.loss_mask)
    np.testing.assert_array_equal(np.asarray(batch.advantages), want)
    _, metrics = update(state, batch, jax.random.PRNGKey(6))
    assert np.isfinite(float(metrics["actor/pg_loss"]))


def test_a_critic_estimator_needs_ppo():
    with pytest.raises(ValueError, match="advantage.estimator = 'gae' is invalid; valid: one "
                                         "without a critic"):
        TrainConfig(algo="grpo", advantage=AdvantageConfig(estimator="gae"))
