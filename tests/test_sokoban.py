"""Sokoban environment: gym-sokoban's rules, text round trips, jumanji wrappers, bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jumanji.types import StepType
from jumanji.wrappers import VmapAutoResetWrapper, VmapWrapper

import envs_jax
from envs_jax.sokoban import NEW_VOCAB_SYMBOLS, Sokoban

UP, DOWN, LEFT, RIGHT = range(4)


def _assert_trees_equal(a, b):
    def same(x, y):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(x, y)

    jax.tree.map(same, a, b)


@functools.cache
def _generated(num: int = 4):
    """(env, batched states) of `num` generated 6x6 levels; compiled once for the module."""
    env = VmapWrapper(envs_jax.make("sokoban"))
    states, _ = jax.jit(env.reset)(jax.random.split(jax.random.key(0), num))
    return env.unwrapped, states


@functools.cache
def _jit_step(env):
    return jax.jit(env.step)


def _env(**kwargs) -> Sokoban:
    return Sokoban(dim_room=(5, 7), **kwargs)


# --- plain-Python reference of gym-sokoban's step, on the text grid -------------------------
def reference_step(text: str, action: int) -> tuple[str, float, bool]:
    """(next text, reward, solved) for a level in the default symbols."""
    grid = [list(row) for row in text.split("\n")]
    h, w = len(grid), len(grid[0])
    targets = {(r, c) for r in range(h) for c in range(w) if grid[r][c] in "O√S"}
    boxes = {(r, c) for r in range(h) for c in range(w) if grid[r][c] in "X√"}
    walls = {(r, c) for r in range(h) for c in range(w) if grid[r][c] == "#"}
    (player,) = [(r, c) for r in range(h) for c in range(w) if grid[r][c] in "PS"]
    dr, dc = [(-1, 0), (1, 0), (0, -1), (0, 1)][action]

    def free(cell):
        inside = 0 <= cell[0] < h and 0 <= cell[1] < w
        return inside and cell not in walls and cell not in boxes

    ahead = (player[0] + dr, player[1] + dc)
    beyond = (ahead[0] + dr, ahead[1] + dc)
    on_before = len(boxes & targets)
    if ahead in boxes and free(beyond):
        boxes = (boxes - {ahead}) | {beyond}
        player = ahead
    elif free(ahead):
        player = ahead
    on_after = len(boxes & targets)
    solved = boxes == targets
    reward = -0.1 + (on_after > on_before) - (on_after < on_before) + 10 * solved
    out = []
    for r in range(h):
        row = ""
        for c in range(w):
            cell = (r, c)
            if cell == player:
                row += "S" if cell in targets else "P"
            elif cell in boxes:
                row += "√" if cell in targets else "X"
            elif cell in walls:
                row += "#"
            else:
                row += "O" if cell in targets else "_"
        out.append(row)
    return "\n".join(out), reward, solved


# --- hand-written rule cases -----------------------------------------------------------------
# name: (level, action, expected level (None: unchanged), reward, action_is_effective)
RULES = {
    "walk": (
        "#######\n#O____#\n#_P_X_#\n#_____#\n#######",
        RIGHT,
        "#######\n#O____#\n#__PX_#\n#_____#\n#######",
        -0.1,
        True,
    ),
    "walk into wall": (
        "#######\n#OP___#\n#___X_#\n#_____#\n#######",
        UP,
        None,
        -0.1,
        False,
    ),
    "push box": (
        "#######\n#O____#\n#_PX__#\n#_____#\n#######",
        RIGHT,
        "#######\n#O____#\n#__PX_#\n#_____#\n#######",
        -0.1,
        True,
    ),
    "push box into wall": (
        "#######\n#O____#\n#__PX##\n#_____#\n#######",
        RIGHT,
        None,
        -0.1,
        False,
    ),
    "push box into box": (
        "#######\n#O_O__#\n#_PXX_#\n#_____#\n#######",
        RIGHT,
        None,
        -0.1,
        False,
    ),
    "box onto target": (
        "#######\n#____O#\n#_PXO_#\n#___X_#\n#######",
        RIGHT,
        "#######\n#____O#\n#__P√_#\n#___X_#\n#######",
        0.9,
        True,
    ),
    "box off target": (
        "#######\n#____O#\n#_P√__#\n#___X_#\n#######",
        RIGHT,
        "#######\n#____O#\n#__SX_#\n#___X_#\n#######",
        -1.1,
        True,
    ),
    "box from target to target": (
        "#######\n#_P√O_#\n#___X_#\n#_____#\n#######",
        RIGHT,
        "#######\n#__S√_#\n#___X_#\n#_____#\n#######",
        -0.1,
        True,
    ),
    "solve": (
        "#######\n#_____#\n#_PXO_#\n#_____#\n#######",
        RIGHT,
        "#######\n#_____#\n#__P√_#\n#_____#\n#######",
        10.9,
        True,
    ),
    "walk off the grid": (
        "_______\n_____PX\n______O\n_______\n_______",
        UP,
        "_____P_\n______X\n______O\n_______\n_______",
        -0.1,
        True,
    ),
    "push box off the grid": (
        "_______\n_____PX\n_____XO\n____O__\n_______",
        RIGHT,
        None,
        -0.1,
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_rules(name):
    level, action, expected, reward, effective = RULES[name]
    env = _env()
    state, _ = env.reset_from_text(level, jax.random.key(0))
    state, ts = env.step(state, jnp.int32(action))
    assert env.render_text(state) == (expected if expected is not None else level)
    np.testing.assert_allclose(ts.reward, reward, atol=1e-6)
    assert bool(ts.extras["action_is_effective"]) == effective
    ref_text, ref_reward, ref_solved = reference_step(level, action)
    assert env.render_text(state) == ref_text and np.isclose(ts.reward, ref_reward)
    solved = name == "solve"
    assert bool(ts.extras["success"]) == bool(state.success) == solved == ref_solved
    assert ts.step_type == (StepType.LAST if solved else StepType.MID)
    assert float(ts.discount) == (0.0 if solved else 1.0)


def test_random_play_matches_reference():
    env, states = _generated()
    step = _jit_step(env)
    rng = np.random.default_rng(0)
    for k in range(4):
        state = jax.tree.map(lambda x: x[k], states)
        text = env.render_text(state)
        for action in rng.integers(0, 4, size=25):
            state, ts = step(state, jnp.int32(action))
            text, reward, solved = reference_step(text, int(action))
            assert env.render_text(state) == text
            assert np.isclose(ts.reward, reward) and bool(ts.extras["success"]) == solved


def test_step_limit_truncates():
    env = _env(max_steps=3)
    level = "#######\n#O____#\n#P__X_#\n#_____#\n#######"
    state, ts = env.reset_from_text(level, jax.random.key(0))
    assert ts.step_type == StepType.FIRST
    kinds = []
    for _ in range(3):
        state, ts = env.step(state, jnp.int32(RIGHT))
        kinds.append(int(ts.step_type))
    assert kinds == [StepType.MID, StepType.MID, StepType.LAST]
    assert float(ts.discount) == 1.0 and not bool(ts.extras["success"])
    assert int(state.step_count) == 3 and int(ts.observation.step_count) == 3


def test_jit_step_equals_eager():
    env, states = _generated()
    state = jax.tree.map(lambda x: x[3], states)
    for action in [UP, LEFT, DOWN, RIGHT, RIGHT]:
        eager = env.step(state, jnp.int32(action))
        jitted = _jit_step(env)(state, jnp.int32(action))
        _assert_trees_equal(eager, jitted)
        state = eager[0]


# --- text ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sokoban", "sokoban_new_vocab"])
def test_text_round_trip(name):
    env = envs_jax.make(name)
    _, states = _generated()  # same room size: a state renders in either vocabulary
    for k in range(4):
        state = jax.tree.map(lambda x: x[k], states)
        text = env.render_text(state)
        assert set(text) <= set(env.symbol_strings) | {"\n"}
        again, ts = env.reset_from_text(text, jax.random.key(0))
        assert env.render_text(again) == text
        np.testing.assert_array_equal(ts.observation.grid, env.render_symbols(state))
        for field in ("walls", "targets", "boxes", "player"):
            np.testing.assert_array_equal(getattr(again, field), getattr(state, field))


def test_new_vocab_maps_symbols_in_the_original_order():
    env = envs_jax.make("sokoban_new_vocab")
    assert env.symbol_strings == ("W", ".", "G", "C", "B", "A", "@")
    level = "WWWWWW\nW.A.BW\nW..GCW\nW....W\nW....W\nWWWWWW"
    state, _ = env.reset_from_text(level, jax.random.key(0))
    default = envs_jax.make("sokoban")
    same, _ = default.reset_from_text(
        "######\n#_P_X#\n#__O√#\n#____#\n#____#\n######", jax.random.key(0)
    )
    np.testing.assert_array_equal(env.render_symbols(state), default.render_symbols(same))
    assert env.symbol_legend[0] == ("W", "wall")
    assert env.symbol_legend[-1] == ("@", "player on target")
    assert NEW_VOCAB_SYMBOLS == env.symbol_strings


def test_instructions_and_registry():
    env = envs_jax.make("sokoban")
    assert env.action_names == ("Up", "Down", "Left", "Right")
    for phrase in ["push all boxes", "cannot pull a box", "<answer>Right || Right || Up</answer>"]:
        assert phrase in env.instructions
    assert ("√", "box on target") in env.symbol_legend
    large = envs_jax.make("sokoban_large")
    assert large.dim_room == (8, 8) and large.num_boxes == 2
    assert large.generator_config.search_depth == 10
    assert env.generator_config.search_depth == 300 and env.max_steps == 100


# --- jumanji wrappers --------------------------------------------------------------------------
def test_vmap_wrapper():
    _, state = _generated()
    env = VmapWrapper(envs_jax.make("sokoban"))
    state, ts = jax.jit(env.step)(state, jnp.array([0, 1, 2, 3], jnp.int32))
    assert ts.reward.shape == (4,) and ts.observation.grid.shape == (4, 6, 6)
    assert (np.asarray(state.step_count) == 1).all()


def test_auto_reset_wrapper():
    env = VmapAutoResetWrapper(envs_jax.make("sokoban", max_steps=2))
    _, state = _generated()  # the wrapper's reset is vmap(reset): reuse compiled levels
    first = np.asarray(state.walls)
    step = jax.jit(env.step)
    actions = jnp.zeros(4, jnp.int32)
    state, ts = step(state, actions)
    assert (np.asarray(state.step_count) == 1).all()
    state, ts = step(state, actions)  # truncation: every episode ends and restarts
    assert (np.asarray(ts.step_type) == StepType.LAST).all()
    assert (np.asarray(state.step_count) == 0).all()
    assert not np.array_equal(np.asarray(state.walls), first)  # new levels


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim_room=(4, 6)), r"dim_room\[0\]=4 .*\[5, 32\]"),
        (dict(dim_room=(6,)), "dim_room must be a"),
        (dict(num_boxes=5), r"num_boxes=5 does not fit .* at most dim_room\[1\] - 2 = 4"),
        (dict(num_boxes=0), r"num_boxes=0 .*\[1, 4\]"),
        (dict(num_boxes=1.5), "num_boxes must be an int"),
        (dict(max_steps=0), "max_steps=0"),
        (dict(search_depth=2), "search_depth=2"),
        (dict(symbols=("#", "_", "O")), "symbols must be 7 distinct"),
        (dict(symbols=("#", "#", "O", "√", "X", "P", "S")), "symbols must be 7 distinct"),
        (dict(search_depth=10, playout_length=9), r"playout_length=9 .*\[1, 8\]"),
        (dict(max_gen_attempts=0), "max_gen_attempts=0"),
    ],
)
def test_bad_constructor_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sokoban(**kwargs)


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("#######\n#O___#\n#_PX__#\n#_____#\n#######", "not rectangular: row 1"),
        ("#######\n#O__Z_#\n#_PX__#\n#_____#\n#######", "unknown symbol 'Z' at row 1, column 4"),
        ("#######\n#O__P_#\n#_PX__#\n#_____#\n#######", "exactly one player; found 2"),
        ("#######\n#O____#\n#__X__#\n#_____#\n#######", "exactly one player; found 0"),
        ("#######\n#OO___#\n#_PX__#\n#_____#\n#######", "1 boxes and 2 targets"),
        ("#######\n#_____#\n#_P___#\n#_____#\n#######", "at least one; found 0 boxes"),
        ("######\n#O___#\n#_PX_#\n######", "level is 4x6; this env's dim_room is 5x7"),
    ],
)
def test_malformed_text(text, match):
    with pytest.raises(ValueError, match=match):
        _env().reset_from_text(text, jax.random.key(0))
