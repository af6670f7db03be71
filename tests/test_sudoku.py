"""Sudoku: puzzles have exactly one solution (a plain-Python solver counts them), moves follow
the original's rules (a plain-Python transcription of its step), answers parse as its regexes."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.sudoku.parse import parse_move

WIDTH = 64


def count_solutions(grid: list[list[int]], box: int, limit: int = 2) -> int:
    """Backtracking over the most constrained empty cell; stops at `limit` solutions."""
    n = box * box
    best, best_options = None, None
    for r in range(n):
        for c in range(n):
            if grid[r][c]:
                continue
            used = set(grid[r]) | {grid[i][c] for i in range(n)} | {
                grid[i][j] for i in range(r // box * box, r // box * box + box)
                for j in range(c // box * box, c // box * box + box)}
            options = [d for d in range(1, n + 1) if d not in used]
            if best is None or len(options) < len(best_options):
                best, best_options = (r, c), options
    if best is None:
        return 1
    total = 0
    r, c = best
    for d in best_options:
        grid[r][c] = d
        total += count_solutions(grid, box, limit - total)
        grid[r][c] = 0
        if total >= limit:
            break
    return total


def valid_complete(grid: np.ndarray, box: int) -> bool:
    n = box * box
    groups = [grid[r] for r in range(n)] + [grid[:, c] for c in range(n)] + [
        grid[r:r + box, c:c + box].reshape(-1) for r in range(0, n, box) for c in range(0, n, box)]
    return all(sorted(g.tolist()) == list(range(1, n + 1)) for g in groups)


@pytest.mark.parametrize("name, count", [("sudoku_4x4", 200), ("sudoku_4x4_medium", 200),
                                         ("sudoku", 12), ("sudoku_medium", 12)])
def test_puzzles_have_one_solution(name, count):
    env = envs_jax.make(name)
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(5), count))
    states = jax.device_get(states)
    blanks = []
    for puzzle, solution in zip(states.initial, states.solution):
        assert valid_complete(solution, env.box)
        assert np.all((puzzle == 0) | (puzzle == solution))
        assert count_solutions(puzzle.tolist(), env.box) == 1
        blanks.append(int((puzzle == 0).sum()))
    assert max(blanks) == env.blanks and np.mean(np.array(blanks) == env.blanks) > 0.9
    assert len({p.tobytes() for p in states.initial}) == count  # all different


# --- the original's parse_action and step, transcribed (ragen/env/sudoku/env.py) ---------------
_PATTERNS = [
    r"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
    r"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
    r"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"\((\d+),\s*(\d+),\s*(\d+)\)",
    r"(\d+),\s*(\d+),\s*(\d+)",
]


def original_parse(action: str):
    action = action.strip().lower()
    for pattern in _PATTERNS:
        match = re.search(pattern, action)
        if match:
            a, b, c = map(int, match.groups())
            return (b, c, a) if "place" in action or "at" in action else (a, b, c)
    return None


def original_step(grid, initial, solution, move, box):
    """-> (reward, placed, solved, new grid) as the original's step (max_steps aside)."""
    n = box * box
    if move is None:
        return -0.1, False, False, grid
    row, col, num = move[0] - 1, move[1] - 1, move[2]
    if not (0 <= row < n and 0 <= col < n and 1 <= num <= n):
        return -0.1, False, False, grid
    if initial[row, col] != 0:
        return -0.1, False, False, grid
    br, bc = row // box * box, col // box * box
    if num in grid[row, :] or num in grid[:, col] or num in grid[br:br + box, bc:bc + box]:
        return -0.1, False, False, grid
    grid = grid.copy()
    grid[row, col] = num
    reward = 1.0 if num == solution[row, col] else 0.5
    solved = bool(np.all(grid != 0)) and valid_complete(grid, box)
    return reward + (10.0 if solved else 0.0), True, solved, grid


def _random_answer(rng: np.random.Generator, n: int) -> str:
    r, c, d = (int(x) for x in rng.integers(0, n + 2, 3))
    forms = [f"place {d} at row {r} col {c}", f"place {d} at ({r},{c})", f"place {d} at {r}, {c}",
             f"{d} at {r},{c}", f"({r}, {c}, {d})", f"{r},{c},{d}",
             f"PLACE  {d}\tAT ROW {r} COL {c}",
             f"I think {r},{c},{d}", f"row {r} col {c} = {d}", "at 3", f"{r} {c} {d}",
             f"place {d} at row {r}", f"the cat: {r},  {c},{d}!", f"0{r},{c},{d}0"]
    return forms[int(rng.integers(len(forms)))]


def _encode(text: str):
    b = text.encode()[:WIDTH]
    return np.array(list(b) + [-1] * (WIDTH - len(b)), np.int32), np.int32(len(b))


def test_moves_follow_the_originals_rules():
    env = envs_jax.make("sudoku_4x4", max_steps=1000)
    rng = np.random.default_rng(0)
    reset = jax.jit(env.reset)
    step = jax.jit(lambda s, item, length: env.step(s, env.parse_action(item, length)))
    outcomes = set()
    for game in range(8):
        state, _ = reset(jax.random.PRNGKey(game))
        grid = np.asarray(state.grid)
        initial, solution = np.asarray(state.initial), np.asarray(state.solution)
        for _ in range(40):
            empty = np.argwhere(grid == 0)
            wrong = [(r, c, d) for r, c in empty for d in range(1, env.n + 1)
                     if d != solution[r, c] and original_step(
                         grid, initial, solution, (r + 1, c + 1, d), env.box)[1]]
            if rng.random() < 0.3 and len(empty):  # right moves now and then: games finish
                r, c = empty[rng.integers(len(empty))]
                text = f"place {solution[r, c]} at row {r + 1} col {c + 1}"
            elif rng.random() < 0.15 and wrong:  # a digit that fits but is not the solution's
                r, c, d = wrong[rng.integers(len(wrong))]
                text = f"{r + 1},{c + 1},{d}"
            else:
                text = _random_answer(rng, env.n)
            want, placed, solved, grid = original_step(
                grid, initial, solution, original_parse(text), env.box)
            state, ts = step(state, *_encode(text))
            assert float(ts.reward) == pytest.approx(want), text
            assert bool(ts.extras["action_is_effective"]) == placed
            assert bool(ts.extras["success"]) == solved == bool(ts.last())
            assert np.array_equal(np.asarray(state.grid), grid)
            outcomes.add(int(state.last))
            if solved:
                break
    assert outcomes == set(range(1, 7))  # every kind of move was seen


def test_answers_parse_as_the_originals_regexes():
    rng = np.random.default_rng(1)
    texts = [_random_answer(rng, 9) for _ in range(2000)]
    items, lengths = zip(*(_encode(t) for t in texts))
    moves = jax.device_get(jax.jit(jax.vmap(parse_move))(np.stack(items), np.array(lengths)))
    for i, text in enumerate(texts):
        want = original_parse(text)
        assert bool(moves.parsed[i]) == (want is not None), text
        if want is not None:
            assert (int(moves.row[i]), int(moves.col[i]), int(moves.num[i])) == want, text


def _original_grid_text(grid: np.ndarray, initial: np.ndarray, box: int) -> str:
    """The original's format_grid_with_conflicts (no conflicts can arise)."""
    n = box * box
    lines = []
    for i in range(n):
        if i and i % box == 0:
            lines.append("-" * (n * 3 + box - 1))
        row = ""
        for j in range(n):
            if j and j % box == 0:
                row += "| "
            v = grid[i, j]
            row += " . " if v == 0 else f"[{v}]" if initial[i, j] else f" {v} "
        lines.append(row.rstrip())
    return "\n".join(lines)


@pytest.mark.parametrize("name", ["sudoku_4x4", "sudoku"])
def test_observation_text(name):
    env = envs_jax.make(name)
    state, _ = jax.jit(env.reset)(jax.random.PRNGKey(2))
    solution = np.asarray(state.solution)
    r, c = np.argwhere(np.asarray(state.initial) == 0)[0]
    state, _ = jax.jit(env.step)(state, parse_move(*_encode(
        f"place {solution[r, c]} at row {r + 1} col {c + 1}")))
    s = jax.device_get(state)
    filled, given = int((s.grid > 0).sum()), int((s.initial > 0).sum())
    want = "\n".join([
        "=" * 50, "SUDOKU PUZZLE", "=" * 50, _original_grid_text(s.grid, s.initial, env.box), "",
        "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty", "",
        f"✓ Correct! Placed {solution[r, c]} at ({r + 1},{c + 1})", "",
        f"Progress: {filled}/{env.n ** 2} cells filled ({given} initial, {filled - given} placed)",
        f"Steps: 1/{env.max_steps}"])
    assert env.render_text(s) == want
    fresh = jax.device_get(jax.jit(env.reset)(jax.random.PRNGKey(2))[0])
    assert "empty\n\nProgress: " in env.render_text(fresh)  # no feedback before the first move


def test_feedback_names_the_move():
    env = envs_jax.make("sudoku_4x4")
    state, _ = jax.jit(env.reset)(jax.random.PRNGKey(0))
    r, c = (int(x) for x in np.argwhere(np.asarray(state.initial) != 0)[0])
    state, ts = jax.jit(env.step)(state, parse_move(*_encode(f"{r + 1},{c + 1},1")))
    assert float(ts.reward) == pytest.approx(-0.1)
    assert f"❌ Cannot modify initial cell at ({r + 1},{c + 1})" in env.render_text(state)
    state, _ = jax.jit(env.step)(state, parse_move(*_encode("hello")))
    assert "\n\n❌ Invalid action format\n\nProgress" in env.render_text(state)
    assert int(jnp.asarray(state.step_count)) == 2
