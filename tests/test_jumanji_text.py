"""The jumanji adapter (envs_jax.jumanji_text): a jumanji env wrapped in a few lines plays as a
text env, bad arguments are named, and the third jumanji game (`maze`, not in the original)
trains by name."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jumanji.environments import Game2048, Maze
from jumanji.environments.routing.maze.types import Position

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import TextSlot  # noqa: E402
from envs_jax.jumanji_text import JumanjiTextEnv  # noqa: E402


def tiny_2048(**overrides):
    """jumanji's own 2048, its board's exponents shown as a digit grid."""
    kwargs = dict(action_names=("Up", "Right", "Down", "Left"), render=lambda s: s.board,
                  symbol_strings=tuple("0123456789") + tuple("abcdefgh"),
                  success=lambda s, a, s2, ts: jnp.max(s2.board) >= 11, instructions="Play.")
    return JumanjiTextEnv(Game2048(), **{**kwargs, **overrides})


def test_a_wrapped_jumanji_env_plays_as_text():
    env = tiny_2048()
    state, first = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert not bool(first.extras["success"]) and not bool(first.extras["action_is_effective"])
    text = env.render_text(state)
    assert len(text.split("\n")) == 4 and set(text) <= set("012\n")
    step = jax.jit(env.step)
    moved = [bool(step(state, a)[1].extras["action_is_effective"]) for a in range(4)]
    # effective by default = the rendered symbols changed = jumanji's own action mask
    assert moved == np.asarray(state.action_mask).tolist()
    _, ts = step(state, 0)
    assert ts.reward.dtype == jnp.float32 and env.action_spec.num_values == 4


@pytest.mark.parametrize("overrides, match", [
    ({"action_names": ("Up",)}, r"action_names must be 2 or more non-empty strings"),
    ({"observation_parts": ("x", TextSlot("s", ("a",), 1, lambda r: np.zeros(1, int)))},
     "give exactly one of symbol_strings"),
    ({"symbol_strings": None}, "give exactly one of symbol_strings"),
    ({"action_values": np.zeros((3,), np.int32)}, r"action_values has shape \(3,\)"),
    ({"max_steps": 0}, "max_steps must be an int >= 1; got 0"),
])
def test_bad_arguments_are_named(overrides, match):
    with pytest.raises(ValueError, match=match):
        tiny_2048(**overrides)


def test_not_a_jumanji_env_is_named():
    with pytest.raises(ValueError, match="env must be a jumanji Environment; got 'maze'"):
        JumanjiTextEnv("maze", action_names=("a", "b"), render=None, success=None,
                       symbol_strings=("x",), instructions="")


def test_maze_text_walls_and_goal():
    env = envs_jax.make("maze")
    assert isinstance(env.env, Maze)
    state, _ = env.reset(jax.random.PRNGKey(1))
    text = env.render_text(state)
    assert text.count("P") == 1 and text.count("G") == 1 and len(text.split("\n")) == 5
    # Beside the goal: the step onto it succeeds and ends the episode.
    goal = state.target_position
    walls = jnp.zeros_like(state.walls)
    start = Position(row=goal.row, col=jnp.where(goal.col > 0, goal.col - 1, goal.col + 1))
    beside = state.replace(walls=walls, agent_position=start,
                           action_mask=env.env._compute_action_mask(walls, start))
    toward = jnp.where(goal.col > start.col, 1, 3)  # Right / Left
    _, ts = env.step(beside, toward)
    assert bool(ts.extras["success"]) and bool(ts.last()) and float(ts.reward) == 1.0
    with pytest.raises(ValueError, match="size must be an int >= 3; got 2"):
        envs_jax.make("maze", size=2)


@pytest.mark.slow  # the slow tier (README): a tiny-model training run
def test_maze_trains_by_name():
    from starpo_jax import api

    c = api.config_for("maze", "grpo", groups=2, group_size=2, max_turns=2, reply_tokens=6,
                       max_actions_per_turn=2, max_actions_per_traj=4)
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", verify=20,
                    turn="Turn {turn}:\n{state}\nActions left: {actions_left}.")
    c.check_memory = False
    c.progress_after = 0
    exp = api.build(c)
    for _ in range(2):
        metrics = exp.step()
        assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert exp.steps_done == 2 and "train/success" in metrics
