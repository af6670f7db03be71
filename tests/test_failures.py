"""Failure modes (starpo_jax.algo.failures): the classifier's precedence against a plain-Python
reference, the loop history, Sokoban deadlocks against a rule-by-rule reference and a brute-force
search, hand-made Sokoban / FrozenLake trajectories stepped by the rollout's own env loop, and the
fractions of a tiny-model evaluation."""

from __future__ import annotations

import os
from collections import deque

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from envs_jax.base import symbols_hash  # noqa: E402
from envs_jax.frozen_lake.env import FrozenLake  # noqa: E402
from envs_jax.sokoban.deadlock import dead_cells  # noqa: E402
from envs_jax.sokoban.env import Sokoban  # noqa: E402
from starpo_jax.algo.failures import (DEAD_END, FAILURE_KINDS, FORMAT, INVALID, LOOP,  # noqa: E402
                                      OUT_OF_BUDGET, SUCCESS, LoopHistory, classify,
                                      failure_fractions)
from starpo_jax.rollout.jax_env import _env_steps  # noqa: E402


def reference_failure(success, dead_end, looped, format_ok, turn_taken, effective) -> list[str]:
    """Plain-Python classification of each row (the precedence of the issue's list)."""
    kinds = []
    for b in range(len(success)):
        bad_format = any(t and not ok for t, ok in zip(turn_taken[b], format_ok[b]))
        if success[b]:
            kinds.append("success")
        elif dead_end[b]:
            kinds.append("dead_end")
        elif looped[b]:
            kinds.append("loop")
        elif bad_format:
            kinds.append("format")
        elif effective[b] == 0:
            kinds.append("invalid")
        else:
            kinds.append("out_of_budget")
    return kinds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classify_matches_a_plain_python_reference(seed):
    rng = np.random.default_rng(seed)
    b, t = 64, 3
    flags = [rng.random(b) < p for p in (0.2, 0.2, 0.2)]
    taken = np.cumsum(rng.random((b, t)) < 0.7, axis=1) == np.arange(1, t + 1)
    format_ok = taken & (rng.random((b, t)) < 0.8)
    effective = rng.integers(0, 3, b).astype(np.int32)
    got = np.asarray(classify(*map(jnp.asarray, (*flags, format_ok, taken, effective))))
    ref = reference_failure(*flags, format_ok, taken, effective)
    assert [FAILURE_KINDS[i] for i in got] == ref
    fractions = jax.device_get(failure_fractions(jnp.asarray(got)))
    assert set(fractions) == set(FAILURE_KINDS)
    for kind in FAILURE_KINDS:
        assert fractions[kind] == pytest.approx(ref.count(kind) / b)
    assert sum(fractions.values()) == pytest.approx(1.0)


def test_loop_history_counts_returns_not_blocked_moves():
    # Rows: A B A (loop); A A A (blocked twice: no loop); A B C (none); A B C B, the return
    # recorded past the history's width (width 3 keeps A B C; B is still found).
    paths = [[1, 2, 1], [1, 1, 1], [1, 2, 3], [1, 2, 3, 2]]
    history = LoopHistory.start(jnp.asarray([p[0] for p in paths], jnp.uint32), max_actions=2)
    for step in range(1, 4):
        fps = jnp.asarray([p[step] if step < len(p) else 0 for p in paths], jnp.uint32)
        stepped = jnp.asarray([step < len(p) for p in paths])
        history = history.record(fps, stepped)
    assert np.asarray(history.looped).tolist() == [True, False, False, True]
    assert np.asarray(history.count).tolist() == [3, 3, 3, 3]


def test_symbols_hash_tells_states_apart():
    grid = jnp.zeros((6, 6), jnp.int32)
    hashes = {int(symbols_hash(grid.at[r, c].set(v))) for r in range(6) for c in range(6)
              for v in (1, 2)}
    assert len(hashes) == 72  # each one-cell change hashes differently
    assert int(symbols_hash(grid)) == int(symbols_hash(jnp.zeros((6, 6), jnp.int32)))
    slots = {"a": jnp.arange(3), "b": jnp.arange(4)}
    assert symbols_hash(slots).dtype == jnp.uint32
    assert int(symbols_hash(slots)) != int(symbols_hash({**slots, "b": jnp.arange(4)[::-1]}))


def _reference_dead_cells(walls: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Rule by rule, cell by cell: corners and wall-backed target-free stretches."""
    h, w = walls.shape
    wall = lambda r, c: not (0 <= r < h and 0 <= c < w) or walls[r, c]  # noqa: E731
    dead = np.zeros_like(walls)
    for r in range(h):
        for c in range(w):
            if walls[r, c] or targets[r, c]:
                continue
            corner = (wall(r - 1, c) or wall(r + 1, c)) and (wall(r, c - 1) or wall(r, c + 1))
            for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                along = (dc, dr)  # the stretch runs perpendicular to the backing wall
                cells = [(r, c)]
                for sign in (1, -1):
                    rr, cc = r + sign * along[0], c + sign * along[1]
                    while not wall(rr, cc):
                        cells.append((rr, cc))
                        rr, cc = rr + sign * along[0], cc + sign * along[1]
                if all(wall(rr + dr, cc + dc) for rr, cc in cells) and \
                        not any(targets[rr, cc] for rr, cc in cells):
                    corner = True
            dead[r, c] = corner
    return dead


def _can_reach_target(walls, targets, box, player) -> bool:
    """Brute force, one box: can the player push it onto a target from these positions?"""
    h, w = walls.shape
    free = lambda r, c: 0 <= r < h and 0 <= c < w and not walls[r, c]  # noqa: E731
    seen, todo = {(box, player)}, deque([(box, player)])
    while todo:
        box, player = todo.popleft()
        if targets[box]:
            return True
        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            ahead = (player[0] + dr, player[1] + dc)
            if not free(*ahead):
                continue
            state = (box, ahead)
            if ahead == box:
                beyond = (box[0] + dr, box[1] + dc)
                if not free(*beyond):
                    continue
                state = (beyond, ahead)
            if state not in seen:
                seen.add(state)
                todo.append(state)
    return False


@pytest.mark.parametrize("seed", range(6))
def test_dead_cells_match_the_rules_and_are_truly_dead(seed):
    rng = np.random.default_rng(seed)
    walls = np.ones((7, 7), bool)
    walls[1:-1, 1:-1] = rng.random((5, 5)) < 0.2
    targets = ~walls & (rng.random((7, 7)) < 0.1)
    got = np.asarray(dead_cells(jnp.asarray(walls), jnp.asarray(targets)))
    np.testing.assert_array_equal(got, _reference_dead_cells(walls, targets))
    cells = [(r, c) for r in range(7) for c in range(7) if not walls[r, c]]
    for box in cells:
        if got[box]:  # sound: from a dead cell no player position reaches a target
            assert not any(_can_reach_target(walls, targets, box, p) for p in cells if p != box)


SOKOBAN_LEVELS = {  # name: (level, actions, class)
    "corner": ("######\n#__O_#\n#_X__#\n#_P__#\n#____#\n######", "Up Right Up Left", DEAD_END),
    "wall_with_target": ("######\n#__O_#\n#_X__#\n#_P__#\n#____#\n######", "Up", OUT_OF_BUDGET),
    "dead_wall": ("######\n#____#\n#__X_#\n#__P_#\n#__O_#\n######", "Left Up Right", DEAD_END),
    "loop": ("######\n#__O_#\n#_X__#\n#_P__#\n#____#\n######", "Left Right Left", LOOP),
    "blocked": ("######\n#__O_#\n#_X__#\n#____#\n#_P__#\n######", "Down Down", INVALID),
    "solved": ("######\n#_O__#\n#_X__#\n#_P__#\n#____#\n######", "Up", SUCCESS),
}


def _run(env, levels: list[str], actions: list[str], max_actions: int = 10):
    """Steps hand-made trajectories through the rollout's env loop (one turn each); returns
    their class ids and their final states' dead_end flags."""
    keys = jax.random.split(jax.random.PRNGKey(0), len(levels))
    states = [env.reset_from_text(text, k)[0] for text, k in zip(levels, keys)]
    states = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    width = max(len(a.split()) for a in actions)
    ids = [[env.action_names.index(a) for a in seq.split()] for seq in actions]
    count = jnp.asarray([len(i) for i in ids], jnp.int32)
    padded = jnp.asarray([i + [0] * (width - len(i)) for i in ids], jnp.int32)
    history = LoopHistory.start(jax.vmap(env.fingerprint)(states), max_actions)
    states, _, _, won, _, effective, history = _env_steps(
        env, states, padded, count, jnp.zeros_like(count), max_actions, history)
    dead = jax.vmap(env.dead_end)(states) & ~won
    ok = jnp.ones((len(levels), 1), bool)
    return np.asarray(classify(won, dead, history.looped, ok, ok, effective)), dead


def test_sokoban_trajectories_are_classified():
    env = Sokoban()
    names = list(SOKOBAN_LEVELS)
    kinds, _ = _run(env, *zip(*[SOKOBAN_LEVELS[n][:2] for n in names]))
    assert dict(zip(names, [FAILURE_KINDS[k] for k in kinds])) == \
        {n: FAILURE_KINDS[SOKOBAN_LEVELS[n][2]] for n in names}
    assert not env.dead_end(env.reset_from_text(SOKOBAN_LEVELS["corner"][0],
                                                jax.random.PRNGKey(0))[0])


def test_frozen_lake_hole_is_a_dead_end_and_a_return_a_loop():
    env = FrozenLake(slippery=False)
    lake = "P_O_\n____\n____\n___G"
    kinds, dead = _run(env, [lake] * 3, ["Right Right", "Right Left Down", "Down Down"])
    assert [FAILURE_KINDS[k] for k in kinds] == ["dead_end", "loop", "out_of_budget"]
    assert np.asarray(dead).tolist() == [True, False, False]


def test_a_format_broken_turn_is_a_format_failure_unless_something_decided_more():
    taken = jnp.asarray([[True, True]] * 3)
    format_ok = jnp.asarray([[True, False]] * 3)
    no = jnp.zeros(3, bool)
    kinds = classify(no, jnp.asarray([False, True, False]), no, format_ok, taken,
                     jnp.asarray([2, 2, 0], jnp.int32))
    assert np.asarray(kinds).tolist() == [FORMAT, DEAD_END, FORMAT]
    # A turn not taken holds format_ok False but is no format failure.
    kinds = classify(no[:1], no[:1], no[:1], jnp.asarray([[True, False]]),
                     jnp.asarray([[True, False]]), jnp.asarray([1], jnp.int32))
    assert np.asarray(kinds).tolist() == [OUT_OF_BUDGET]


def test_tiny_model_evaluation_logs_fractions_that_sum_to_one():
    from helpers.tiny import tiny_experiment
    from test_evaluation import _with_eval

    from starpo_jax import api

    exp = _with_eval(tiny_experiment(), envs="frozen_lake", modes="greedy", episodes=4)
    result = api.build_evaluator(exp).evaluate(exp.state.actor)
    names = [f"val/frozen_lake/greedy/failure/{kind}" for kind in FAILURE_KINDS]
    assert set(names) <= set(result.metrics)
    assert sum(result.metrics[n] for n in names) == pytest.approx(1.0)
    out = jax.device_get(result.rollouts["frozen_lake", "greedy"])
    ref = reference_failure(out.success, out.dead_end, out.looped, out.format_ok,
                            out.turn_taken, out.effective_actions)
    for kind, name in zip(FAILURE_KINDS, names):
        assert result.metrics[name] == pytest.approx(ref.count(kind) / len(ref))
    assert envs_jax.make("bandit").dead_end(envs_jax.make("bandit").reset(
        jax.random.PRNGKey(0))[0]) == jnp.bool_(False)  # the default hook


def test_a_training_step_logs_the_fractions():
    from helpers.tiny import tiny_experiment
    from test_evaluation import _with_eval

    metrics = _with_eval(tiny_experiment()).step()
    fractions = [metrics[f"train/failure/{kind}"] for kind in FAILURE_KINDS]
    assert sum(fractions) == pytest.approx(1.0)
    assert metrics["train/failure/success"] == pytest.approx(metrics["train/success"])
