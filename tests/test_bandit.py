"""Bandit: payouts, presentation order, termination, success, texts and the registry variants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.bandit import HIGH, LOW, Bandit
from envs_jax.bandit.types import GAME_TEXT

KEY = jax.random.PRNGKey(0)
N = 40_000


def pull_many(env: Bandit, action: int, n: int = N):
    """Reset and pull `action` on n keys: order, reward, last, discount, success, each [n]."""

    def one(key):
        state, _ = env.reset(key)
        _, ts = env.step(state, jnp.int32(action))
        return state.order, ts.reward, ts.last(), ts.discount, ts.extras["success"]

    return map(np.asarray, jax.jit(jax.vmap(one))(jax.random.split(KEY, n)))


def test_payout_distribution_and_success():
    env = Bandit()
    order, reward, last, discount, success = pull_many(env, HIGH)
    assert set(np.unique(reward)) <= {0.0, 1.0}
    assert abs(reward.mean() - 0.25) < 0.012, reward.mean()
    assert success.all() and last.all() and (discount == 0).all()
    assert abs(order.mean() - 0.5) < 0.015, order.mean()

    _, reward, last, discount, success = pull_many(env, LOW)
    assert (reward == np.float32(0.1)).all()
    assert not success.any() and last.all() and (discount == 0).all()


@pytest.mark.parametrize(
    "kwargs, action, values",
    [
        ({"high_prob": 1.0}, HIGH, {1.0}),
        ({"high_prob": 0.0, "high_miss_reward": -0.5}, HIGH, {-0.5}),
        ({"low_reward": 0.15}, LOW, {np.float32(0.15)}),
        ({"high_reward": 3.0}, HIGH, {0.0, 3.0}),
    ],
)
def test_configurable_payouts(kwargs, action, values):
    _, reward, *_ = pull_many(Bandit(**kwargs), action, n=2000)
    assert set(np.unique(reward).tolist()) == values


def test_presented_order_is_in_the_text():
    env = Bandit()
    for key in jax.random.split(KEY, 8):
        state, timestep = env.reset(key)
        first, second = ("Phoenix", "Dragon") if int(state.order) == 0 else ("Dragon", "Phoenix")
        assert env.render_text(state) == GAME_TEXT.format(a=first, b=second)
        assert f"named {first} and {second}\n" in env.render_text(state)
        assert (timestep.observation.symbols == env.render_symbols(state)).all()
    assert env.action_names == ("Phoenix", "Dragon")


@pytest.mark.parametrize(
    "action, arm, rewards", [(LOW, "Phoenix", (0.1,)), (HIGH, "Dragon", (1.0, 0.0))]
)
def test_feedback_text_after_the_pull(action, arm, rewards):
    env = Bandit()
    for key in jax.random.split(KEY, 8):
        after, timestep = env.step(env.reset(key)[0], jnp.int32(action))
        (reward,) = [r for r in rewards if np.float32(r) == timestep.reward]
        assert env.render_text(after) == Bandit.FEEDBACK.format(arm=arm, reward=reward)


@pytest.mark.parametrize(
    "name, low, high",
    [
        ("bandit", "Phoenix", "Dragon"),
        ("bandit_rev", "Dragon", "Phoenix"),
        ("bandit_test", "Trader", "Librarian"),
    ],
)
def test_registry_variants(name, low, high):
    env = envs_jax.make(name)
    assert (env.low_name, env.high_name, env.action_names) == (low, high, (low, high))
    state, _ = env.reset(KEY)
    _, timestep = env.step(state, jnp.int32(HIGH))
    assert bool(timestep.extras["success"])
    assert env.render_text(env.step(state, jnp.int32(LOW))[0]) == f"{low}: 0.1 points"


@pytest.mark.parametrize(
    "text",
    [
        GAME_TEXT.format(a="Phoenix", b="Dragon"),
        GAME_TEXT.format(a="Dragon", b="Phoenix"),
        "Phoenix: 0.1 points",
        "Dragon: 1.0 points",
        "Dragon: 0.0 points",
    ],
)
def test_reset_from_text_round_trips(text):
    env = Bandit()
    state, timestep = env.reset_from_text(text, KEY)
    assert env.render_text(state) == text
    assert (timestep.observation.symbols == env.render_symbols(state)).all()


def test_reset_from_text_rejects_other_text():
    with pytest.raises(ValueError, match="not a text this bandit renders: 'Dragon: 2.0 points'"):
        Bandit().reset_from_text("Dragon: 2.0 points", KEY)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"low_name": ""}, "low_name must be a non-empty one-line string"),
        ({"high_name": " Dragon"}, "high_name"),
        ({"high_name": "phoenix"}, "arm names must differ"),
        ({"high_prob": 1.5}, r"high_prob must be a probability in \[0, 1\]; got 1.5"),
        ({"low_reward": float("nan")}, "low_reward must be a finite number"),
        ({"high_reward": "1"}, "high_reward"),
    ],
)
def test_constructor_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Bandit(**kwargs)


@pytest.mark.parametrize("name", ["bandit", "bandit_rev", "bandit_test"])
def test_instructions_name_no_arm(name):
    """Only the state names the arms, in its random order: a fixed order anywhere else in the
    prompt (such as action_names = (low, high)) would tell the high arm by position. As the
    original's, the prompt has no instructions and lists no actions."""
    env = envs_jax.make(name)
    assert env.instructions == "" and not env.lists_actions and env.symbol_legend == ()


@pytest.mark.parametrize("name", ["bandit", "bandit_rev", "bandit_test"])
def test_symbol_grids_list_every_rendering(name):
    """symbol_grids (which sizes the prompts) lists exactly the grids that reset and step
    render: a grid missing from it would render as another in the prompt."""
    env = envs_jax.make(name)

    def seen(key):
        state, first = env.reset(key)
        low = env.step(state, jnp.int32(LOW))[1].observation.symbols
        high = env.step(state, jnp.int32(HIGH))[1].observation.symbols
        return jnp.stack([first.observation.symbols, low, high])

    reached = np.asarray(jax.jit(jax.vmap(seen))(jax.random.split(KEY, 2000)))
    reached = {g.tobytes() for g in reached.reshape(-1, *reached.shape[-2:]).astype(np.int32)}
    listed = {g.tobytes() for g in env.symbol_grids()}
    assert reached == listed and len(listed) == 5
