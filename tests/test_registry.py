"""The registry, and the TextEnv contract checked on every registered grid environment
(free-text games have their own tests: test_countdown, test_sudoku, test_text_free)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jumanji.wrappers import VmapAutoResetWrapper, VmapWrapper

import envs_jax
from envs_jax.base import FreeTextEnv, TextEnv, symbol_text

# Symbol-grid envs: free-text games and envs shown as text and slots (observation_parts:
# 2048, the Rubik's cube) have their own tests.
NAMES = tuple(n for n in envs_jax.names() if not isinstance(envs_jax.make(n), FreeTextEnv)
              and getattr(envs_jax.make(n), "observation_parts", None) is None)
KEY = jax.random.PRNGKey(0)
BATCH = 4


@functools.cache
def compiled(name: str):
    """(env, a batch of BATCH reset states via jumanji's VmapWrapper, jitted unbatched step).

    Built once per env and shared: compiling the level generators dominates these tests.
    """
    env = envs_jax.make(name)
    states, timesteps = jax.jit(VmapWrapper(env).reset)(jax.random.split(KEY, BATCH))
    return env, (states, timesteps), jax.jit(env.step)


def lane(tree, i: int = 0):
    return jax.tree.map(lambda x: x[i], tree)


def random_actions(env: TextEnv, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.randint(key, shape, 0, len(env.action_names), dtype=jnp.int32)


def trees_equal(a, b) -> bool:
    same = jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(jax.tree.leaves(same))


def test_names_include_the_games():
    assert {"bandit", "bandit_rev", "bandit_test", "frozen_lake"} <= set(NAMES)
    assert list(NAMES) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_make_builds_a_text_env(name):
    env = envs_jax.make(name)
    assert isinstance(env, TextEnv)
    assert env.action_spec.num_values == len(env.action_names) >= 2
    assert env.symbol_strings and env.max_steps >= 1
    assert env.settings == envs_jax.settings(name)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown environment 'frozenlake'; registered: ") as err:
        envs_jax.make("frozenlake")
    assert all(name in str(err.value) for name in NAMES)


@pytest.mark.parametrize(
    "name, overrides, check",
    [
        ("frozen_lake", {"size": 5}, lambda e: e.observation_spec.grid.shape == (5, 5)),
        ("frozen_lake", {"slippery": False, "max_steps": 10}, lambda e: e.max_steps == 10),
        ("bandit", {"low_reward": 0.15}, lambda e: " 0.15" in e.symbol_strings),
        ("bandit_rev", {"high_prob": 0.5}, lambda e: e.high_prob == 0.5),
        ("bandit_rev", {"high_reward": 2.0}, lambda e: e.high_reward == 2.0),
    ],
)
def test_overrides_reach_the_constructor(name, overrides, check):
    assert check(envs_jax.make(name, **overrides))


@pytest.mark.parametrize(
    "name, overrides, error, match",
    [
        ("frozen_lake", {"p": 1.5}, ValueError, r"p \(probability a tile is frozen\).*got 1.5"),
        ("frozen_lake", {"size": "4"}, ValueError, "size must be an int >= 2; got '4'"),
        ("bandit", {"high_prob": -0.1}, ValueError, "high_prob .* got -0.1"),
        ("bandit_test", {"low_name": "librarian"}, ValueError, "arm names must differ"),
        ("frozen_lake", {"sizes": 4}, TypeError, "sizes"),
    ],
)
def test_bad_overrides_fail_clearly(name, overrides, error, match):
    with pytest.raises(error, match=match):
        envs_jax.make(name, **overrides)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_wrapper(name):
    env, (state, first), _ = compiled(name)
    assert bool(first.first().all())
    actions = random_actions(env, KEY, (BATCH,))
    state, timestep = jax.jit(VmapWrapper(env).step)(state, actions)
    assert timestep.reward.shape == (BATCH,) and timestep.step_type.shape == (BATCH,)
    for i in range(BATCH):
        env.observation_spec.validate(lane(first.observation, i))
        env.observation_spec.validate(lane(timestep.observation, i))


@pytest.mark.parametrize("name", NAMES)
def test_vmap_auto_reset_wrapper(name):
    # The wrapper's reset is VmapWrapper's (AutoResetWrapper adds nothing to it by default).
    env, (state, _), _ = compiled(name)
    wrapped = VmapAutoResetWrapper(env)

    def run(state, actions):
        def body(state, action):
            state, timestep = wrapped.step(state, action)
            return state, (timestep.last(), state.step_count)

        return jax.lax.scan(body, state, actions)

    actions = random_actions(env, KEY, (12, BATCH))
    _, (last, step_count) = jax.jit(run)(state, actions)
    # A finished lane continues from a fresh episode; the others count on.
    assert (np.asarray(step_count)[np.asarray(last)] == 0).all()
    assert (np.asarray(step_count)[~np.asarray(last)] > 0).all()
    if name.startswith("bandit"):
        assert np.asarray(last).all()


@pytest.mark.parametrize("name", NAMES)
def test_jit_step_equals_eager_step(name):
    env, (states, _), step = compiled(name)
    state = lane(states)
    for action in range(len(env.action_names)):
        assert trees_equal(step(state, jnp.int32(action)), env.step(state, jnp.int32(action)))


def states_along_a_random_episode(name: str, steps: int = 4):
    env, (batch, _), step = compiled(name)
    state = lane(batch)
    states = [state]
    for action in np.asarray(random_actions(env, jax.random.PRNGKey(1), (steps,))):
        state, timestep = step(state, jnp.int32(action))
        states.append(state)
        if bool(timestep.last()):
            break
    return env, states


@pytest.mark.parametrize("name", NAMES)
def test_render_text_follows_the_symbol_rule(name):
    env, states = states_along_a_random_episode(name)
    for state in states:
        ids = np.asarray(env.render_symbols(state))
        assert ids.ndim == 2 and ids.dtype == np.int32
        assert 0 <= ids.min() and ids.max() < len(env.symbol_strings)
        assert env.render_text(state) == symbol_text(env.symbol_strings, ids)


@pytest.mark.parametrize("name", NAMES)
def test_reset_from_text_round_trips(name):
    env, states = states_along_a_random_episode(name)
    for state in states:
        text = env.render_text(state)
        try:
            rebuilt, timestep = env.reset_from_text(text, KEY)
        except NotImplementedError:
            pytest.skip(f"{name} has no text levels")
        assert env.render_text(rebuilt) == text
        assert np.array_equal(env.render_symbols(rebuilt), env.render_symbols(state))
        env.observation_spec.validate(timestep.observation)


def test_the_catalogue_holds_the_registered_builtins():
    """envs_jax.catalog (read without JAX by run_config) is what the games register."""
    from envs_jax.catalog import BUILTIN

    assert set(BUILTIN) <= set(envs_jax.names())
    for name, settings in BUILTIN.items():
        assert envs_jax.settings(name) == settings, name
        assert envs_jax.make(name).settings == settings, name


def test_import_envs_jax_is_light():
    """`import envs_jax` loads neither JAX nor jumanji until the registry is used."""
    import subprocess
    import sys

    code = ("import sys, envs_jax, starpo_jax.run.schema; "
            "print(sorted(m for m in ('jax', 'jumanji', 'flax') if m in sys.modules)); "
            "envs_jax.names(); print('jumanji' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    assert done.stdout.split() == ["[]", "True"]
