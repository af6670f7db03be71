"""The shared-prefix forward (each group's first prompt computed once) equals the per-row one:
log-probs, entropies and values against a row-by-row forward of each row alone, gradients
against the per-row forward's, and whole train steps (PPO and GRPO, micro-batches, several
mini-batches) with the switch on and off."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from starpo_jax.config import (FilterConfig, LossConfig, OptimConfig,  # noqa: E402
                               RolloutConfig, TrainConfig)
from starpo_jax.train import forward as forward_lib  # noqa: E402
from starpo_jax.train.forward import (length_widths, over_real_length,  # noqa: E402
                                      sequence_logprobs, sequence_values)
from starpo_jax.models import Decoder  # noqa: E402
from starpo_jax.rollout.jax_env import Rollout  # noqa: E402
from starpo_jax.train.shared_prefix import (PrefixPlan, aligned_slots, group_sorted,  # noqa: E402
                                            shared_logprobs, shared_values, slice_plans)
from starpo_jax.train.step import init_train_state, make_train_fns  # noqa: E402
from test_rollout import REPLY_TOKENS, tiny_bandit_setup  # noqa: E402

GROUPS, N, WIDTH, LENGTH, SLOTS = 3, 4, 10, 24, 14
PROMPTS = (4, 10, 1)  # prompt lengths of the groups: one short, one the full width, one token


def _batch() -> tuple[Rollout, np.ndarray]:
    """Rows of 3 groups of 4 in the rollout's layout (the first prompt, then at most L - W
    tokens), shuffled, the reply tokens a random subset after the prompt; and their groups."""
    rng = np.random.default_rng(0)
    b = GROUPS * N
    tokens = np.zeros((b, LENGTH), np.int32)
    lengths, prompt_lengths = np.zeros(b, np.int32), np.zeros(b, np.int32)
    mask = np.zeros((b, LENGTH), bool)
    for g, p in enumerate(PROMPTS):
        prompt = rng.integers(1, 5000, p)
        for i in range(N):
            r = g * N + i
            rest = rng.integers(1, 5000, rng.integers(2, LENGTH - WIDTH + 1))
            row = np.concatenate([prompt, rest])
            tokens[r, :len(row)], lengths[r], prompt_lengths[r] = row, len(row), p
            mask[r, p:len(row)] = rng.random(len(row) - p) < 0.7
            mask[r, p] = True  # the first reply token: predicted by the prompt's last position
    order = rng.permutation(b)
    zeros = jnp.zeros((b, LENGTH))
    batch = Rollout(tokens=jnp.asarray(tokens[order]), lengths=jnp.asarray(lengths[order]),
                    prompt_lengths=jnp.asarray(prompt_lengths[order]),
                    loss_mask=jnp.asarray(mask[order]), turn_ids=zeros, behaviour_logp=zeros,
                    behaviour_entropy=zeros, turn_rewards=None, format_penalties=None,
                    turn_taken=None, format_ok=None, think_tokens=None, reply_lengths=None,
                    success=None, num_actions=None, effective_actions=None)
    return batch, (np.arange(b) // N)[order]


@pytest.fixture(scope="module")
def models():
    model, _, _, _ = tiny_bandit_setup()
    critic = Decoder(model.config, rngs=nnx.Rngs(1), value_head=True)
    nnx.update(critic, nnx.state(model))
    return model, critic


def _reference(model, critic, batch):
    """Per-row log-softmax (numpy, float64) and values of each row's real tokens: a batched
    forward of right-padded rows is each row's own (causal attention)."""
    real = jnp.arange(LENGTH) < batch.lengths[:, None]
    logits = np.asarray(jax.jit(lambda t, m: model(t, attention_mask=m))(batch.tokens, real),
                        np.float64)
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    values = jax.jit(lambda t, m: critic.value(t, attention_mask=m))(batch.tokens, real)
    return log_p, np.asarray(values)


def test_shared_prefix_equals_each_row_alone(models):
    """Log-probs, entropies and values of shuffled rows of groups with different prompt lengths
    (4, the whole width, 1 token) equal those of each row run alone (numpy log-softmax), for
    the whole batch and for a slice of 5 rows holding parts of groups."""
    model, critic = models
    batch, groups = _batch()
    log_p, want_v = _reference(model, critic, batch)

    @jax.jit
    def forward(b, g):
        plan = PrefixPlan(width=WIDTH, slots=GROUPS)
        return (*shared_logprobs(model, b, g, plan, SLOTS, 4), shared_values(critic, b, g, plan))

    for rows in (np.arange(GROUPS * N), np.arange(5)):
        part = jax.tree.map(lambda x: x[rows], batch)
        logp, entropy, values = map(np.asarray, forward(part, jnp.asarray(groups[rows])))
        tokens, lengths = np.asarray(part.tokens), np.asarray(part.lengths)
        mask = np.asarray(part.loss_mask)
        for i, r in enumerate(rows):
            for t in range(1, lengths[i] + 1):
                if t < lengths[i] and mask[i, t]:
                    assert abs(logp[i, t] - log_p[r, t - 1, tokens[i, t]]) < 2e-5, (r, t)
                    want_h = -np.sum(np.exp(log_p[r, t - 1]) * log_p[r, t - 1])
                    assert abs(entropy[i, t] - want_h) < 2e-4, (r, t)
                assert abs(values[i, t] - want_v[r, t - 1]) < 2e-5, (r, t)
            assert values[i, 0] == 0
        assert np.all(logp[~mask] == 0) and np.all(entropy[~mask] == 0)


def test_gradients_through_the_shared_prefix_equal_the_per_row_ones(models):
    """The gradient of a loss on log-probs, entropies and values (through each prefix once,
    summed over the rows that read it) equals the per-row forward's, for both models."""
    model, critic = models
    batch, groups = _batch()
    weights = jax.random.normal(jax.random.PRNGKey(0), batch.tokens.shape)
    plan = PrefixPlan(width=WIDTH, slots=GROUPS)
    # Values after a row's end are of padding (different junk on each path): out of the loss.
    real = jnp.arange(LENGTH) <= batch.lengths[:, None]

    def loss(actor_params, critic_params, shared):
        actor = nnx.merge(nnx.graphdef(model), actor_params)
        value_model = nnx.merge(nnx.graphdef(critic), critic_params)
        b = batch
        if shared:
            logp, ent = shared_logprobs(actor, b, jnp.asarray(groups), plan, SLOTS, 4)
            values = shared_values(value_model, b, jnp.asarray(groups), plan)
        else:
            logp, ent = sequence_logprobs(actor, b.tokens, b.lengths, b.loss_mask, SLOTS, 4)
            values = sequence_values(value_model, b.tokens, b.lengths)
        return jnp.sum((logp + 0.1 * ent + jnp.where(real, values, 0.0)) * weights)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=(2,))
    params = (nnx.state(model), nnx.state(critic))
    want, got = grad(*params, False), grad(*params, True)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = float(jnp.max(jnp.abs(b))) + 1e-6
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5 * scale)


@pytest.mark.parametrize("shared", [False, True])
def test_passes_over_the_real_length_equal_the_whole_buffer(models, monkeypatch, shared):
    """The rows padded to a 40-column buffer, their log-probs, entropies and gradients over the
    shortest width that holds their real tokens (over_real_length, widths 22 .. 40) equal the
    whole buffer's; the chosen width is a cut one."""
    monkeypatch.setattr(forward_lib, "TRIM_FROM", 1)
    monkeypatch.setattr(forward_lib, "WIDTH_MULTIPLE", 1)
    model, _ = models
    batch, groups = _batch()
    wide = 40
    batch = jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (0, wide - LENGTH)))
                         if x is not None and x.ndim == 2 else x, batch)
    weights = jax.random.normal(jax.random.PRNGKey(1), batch.tokens.shape)
    plan = PrefixPlan(width=WIDTH, slots=GROUPS)
    need = (jnp.max(batch.lengths - batch.prompt_lengths) + WIDTH if shared
            else jnp.max(batch.lengths))
    widths = length_widths(wide)
    assert widths == (22, 28, 34, 40), widths
    assert next(w for w in widths if w >= int(need)) < wide  # a cut width runs

    def grad_and_logprobs(params, rows):
        def loss(params):
            actor = nnx.merge(nnx.graphdef(model), params)
            if shared:
                logp, ent = shared_logprobs(actor, rows, jnp.asarray(groups), plan, SLOTS, 4)
            else:
                logp, ent = sequence_logprobs(actor, rows.tokens, rows.lengths, rows.loss_mask,
                                              SLOTS, 4)
            width = logp.shape[1]
            return jnp.sum((logp + 0.1 * ent) * weights[:, :width]), (logp, ent)

        return jax.grad(loss, has_aux=True)(params)

    params = nnx.state(model)
    trimmed = jax.jit(lambda p, b: over_real_length(lambda r: grad_and_logprobs(p, r), b, need,
                                                    wide))(params, batch)
    whole = jax.jit(grad_and_logprobs)(params, batch)
    for got, want in zip(jax.tree.leaves(trimmed), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_slot_bounds_hold_for_every_slicing():
    """aligned_slots is the most groups a contiguous slice of group-major rows holds (counted
    by brute force); group_sorted keeps each mini-batch's rows and orders them by group."""
    for rows, group in ((16, 8), (12, 3), (24, 4), (8, 8)):
        for size in (d for d in range(1, rows + 1) if rows % d == 0):
            want = max(len({i // group for i in range(j, j + size)})
                       for j in range(0, rows, size))
            assert aligned_slots(rows, size, group) == want, (rows, size, group)
    order = jnp.asarray(np.random.default_rng(0).permutation(16))
    got = np.asarray(group_sorted(order, 2, 4)).reshape(2, 8)
    for half, want in zip(got, np.asarray(order).reshape(2, 8)):
        assert sorted(half) == sorted(want)
        assert np.all(np.diff(half // 4) >= 0)
    with pytest.raises(ValueError, match="slice_rows = 3 must divide rows = 8"):
        aligned_slots(8, 3, 4)


ROLLOUT = RolloutConfig(groups=4, group_size=8, max_turns=2, reply_tokens=REPLY_TOKENS,
                        mode="nothink")


def _fns(config, setup):
    model, tok, env, codec = setup
    return make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                          pad_id=tok.pad_token_id)


@pytest.fixture(scope="module")
def rollout_out():
    """One two-turn rollout of 4 groups of 8 (the suffixes hold env messages and replies),
    learned from by every step below."""
    setup = tiny_bandit_setup()
    config = TrainConfig(algo="grpo", rollout=ROLLOUT, filter=FilterConfig(keep_ratio=1.0))
    state = init_train_state(config, jax.random.PRNGKey(0), model=setup[0])
    return jax.jit(_fns(config, setup).rollout)(state, jax.random.PRNGKey(5))


def _learn(config, setup, out):
    state = init_train_state(config, jax.random.PRNGKey(0), model=setup[0])
    state, metrics = jax.jit(_fns(config, setup).learn)(state, out, jax.random.PRNGKey(6))
    return jax.device_get((state.actor, state.critic, metrics))


# 2 of the 4 groups kept (16 rows). PPO: 2 mini-batches of 8 rows (any rows of the 2 groups),
# 2 micro-batches each; GRPO with KL: one mini-batch in 2 micro-batches, 2 epochs (old and
# reference log-probs).
@pytest.mark.parametrize("algo,optim,loss", [
    pytest.param("ppo", dict(minibatch_rows=8, micro_batches=2), dict(agg="seq_mean_token_mean"),
                 marks=pytest.mark.slow),  # the slow tier (README)
    ("grpo", dict(minibatch_rows=16, micro_batches=2, ppo_epochs=2), dict(kl_coef=0.01)),
])
def test_train_step_equals_the_per_row_step(algo, optim, loss, rollout_out):
    """With shared prefixes the step's metrics (losses, grad norms, log-prob diffs, values,
    KL) and the updated weights are the per-row step's."""
    setup = tiny_bandit_setup()
    base = TrainConfig(
        algo=algo, rollout=ROLLOUT, filter=FilterConfig(keep_ratio=0.5),
        loss=LossConfig(entropy_coef=0.01, **loss),
        optim=OptimConfig(actor_lr=1e-3, critic_lr=1e-3, shared_prefix=False, **optim))
    on = dataclasses.replace(base, optim=dataclasses.replace(base.optim, shared_prefix=True))
    plans = slice_plans(8, on)
    assert all(plan is not None for plan in plans), plans  # the shared path really runs
    want_actor, want_critic, want = _learn(base, setup, rollout_out)
    actor, critic, got = _learn(on, setup, rollout_out)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # Adam moves each weight by about lr whatever the gradient's size: equal weights to 5% of
    # lr mean equal gradients (a near-zero gradient element's step is its rounding's; the
    # gradients themselves are compared in the test above).
    for a, b in zip(jax.tree.leaves((actor, critic)), jax.tree.leaves((want_actor, want_critic))):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_prepare_over_the_real_length_equals_the_whole_buffer(rollout_out, monkeypatch, shared):
    """PPO's prepare (old log-probs, the critic's values, advantages, returns) over the
    shortest width that holds the kept rows' real tokens equals the whole buffer's wherever
    they are read (the reply tokens); past the width that ran, the values are 0."""
    setup = tiny_bandit_setup()
    config = TrainConfig(
        algo="ppo", rollout=ROLLOUT, filter=FilterConfig(keep_ratio=0.5),
        optim=OptimConfig(minibatch_rows=8, micro_batches=2, shared_prefix=shared))

    # 200 more columns of padding (a longer buffer), so that a cut width holds the real tokens.
    extra = 200
    pad = lambda x, value: jnp.pad(x, ((0, 0), (0, extra)), constant_values=value)  # noqa: E731
    out = rollout_out.replace(
        tokens=pad(rollout_out.tokens, 0), loss_mask=pad(rollout_out.loss_mask, False),
        turn_ids=pad(rollout_out.turn_ids, -1),
        behaviour_logp=pad(rollout_out.behaviour_logp, 0.0),
        behaviour_entropy=pad(rollout_out.behaviour_entropy, 0.0))

    def prepare():
        state = init_train_state(config, jax.random.PRNGKey(0), model=setup[0])
        return jax.device_get(jax.jit(_fns(config, setup).prepare)(state, out))

    monkeypatch.setattr(forward_lib, "TRIM_FROM", 10 ** 9)  # one width: the whole buffer
    whole = prepare()
    monkeypatch.setattr(forward_lib, "TRIM_FROM", 1)
    monkeypatch.setattr(forward_lib, "WIDTH_MULTIPLE", 1)
    trimmed = prepare()
    length = whole.rollout.tokens.shape[1]
    need = int(np.max(whole.rollout.lengths))
    assert next(w for w in length_widths(length) if w >= need) < length  # a cut width runs
    reply = np.asarray(whole.rollout.loss_mask)
    assert reply.any() and whole.old_logp is not None
    for name in ("old_logp", "old_values", "advantages", "returns"):
        got, want = np.asarray(getattr(trimmed, name)), np.asarray(getattr(whole, name))
        np.testing.assert_allclose(got[reply], want[reply], rtol=1e-5, atol=1e-6, err_msg=name)
    # The last column is past the width that ran: 0 there, the critic's value of a pad token
    # in the whole buffer's pass.
    assert np.all(np.asarray(trimmed.old_values)[:, -1] == 0)
    assert np.any(np.asarray(whole.old_values)[:, -1] != 0)


def test_switch_is_validated_and_plans_fall_back_when_nothing_is_shared():
    """optim.shared_prefix must be a bool; a slice with as many groups as rows, or no known
    first-prompt width (a host rollout), runs the per-row forward."""
    with pytest.raises(ValueError, match="optim.shared_prefix = 1 is invalid; valid: True or"):
        OptimConfig(shared_prefix=1)
    config = TrainConfig(rollout=RolloutConfig(groups=4, group_size=2),
                         filter=FilterConfig(keep_ratio=1.0),
                         optim=OptimConfig(minibatch_rows=4, micro_batches=2))
    # prepare: 2 slices of 4 group-major rows (2 groups each); update: 2-row slices of
    # mini-batches of any 4 rows (up to 2 groups): no fewer prefixes than rows.
    assert slice_plans(8, config) == (PrefixPlan(8, 2), None)
    assert slice_plans(None, config) == (None, None)
