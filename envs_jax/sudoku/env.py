"""Sudoku (RAGEN's SimpleSudoku / MediumSudoku), multi-turn: place digits one move at a time."""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.types import StepType, TimeStep

from envs_jax.base import FreeTextEnv, TextSlot
from envs_jax.sudoku import generator
from envs_jax.sudoku.parse import Move, parse_move

# The original's env_instruction (config/envs.yaml, SimpleSudoku / MediumSudoku).
INSTRUCTIONS = (
    "You are solving a Sudoku puzzle. Fill in the grid so that every row, column, and {box}x{box} "
    "box contains the numbers 1-{n} without repetition.\n"
    "Initial cells are shown in [brackets] and cannot be modified. Empty cells are shown as dots "
    "(.).\n"
    "Place numbers one at a time using the format: <answer>place 5 at row 2 col 3</answer> or "
    "<answer>2,3,5</answer>\n"
    "The environment will provide feedback on valid/invalid moves and show conflicts if any "
    "occur."
)
CORRECT, VALID, INVALID, COMPLETION = 1.0, 0.5, -0.1, 10.0  # the original's SudokuEnvConfig
BLANK_SHARE = {"easy": 0.4, "medium": 0.5}  # the original's cells_to_remove
RULE = "=" * 50

# Grid slot: characters.
GRID_SYMBOLS = ("", "[", "]", " ", ".", "|", "-", "\n", *"123456789")
_G_EMPTY, _G_OPEN, _G_CLOSE, _G_SPACE, _G_DOT = 0, 1, 2, 3, 4
_G_DIGIT = 7  # digit d is _G_DIGIT + d (d = 1..9)
# Feedback slot: a message head, digits, and the pieces of "(r,c)".
(F_NONE, F_PARSE, F_RANGE, F_INITIAL, F_CONFLICT, F_CORRECT, F_WRONG, F_AT, F_COMMA,
 F_CLOSE) = range(10)
_F_DIGIT = 9  # digit d is _F_DIGIT + d (d = 1..9)
# Move outcomes (state.last).
NO_MOVE, UNPARSED, OUT_OF_RANGE, INITIAL_CELL, CONFLICT, PLACED_CORRECT, PLACED_WRONG = range(7)
COUNT_SYMBOLS = (*"0123456789", "")


class State(NamedTuple):
    grid: chex.Array  # [n, n] int32 current digits, 0 = empty
    initial: chex.Array  # [n, n] int32 the puzzle
    solution: chex.Array  # [n, n] int32
    step_count: chex.Array  # [] int32 moves made (valid or not)
    last: chex.Array  # [] int32 outcome of the last move (NO_MOVE, ...)
    last_move: chex.Array  # [3] int32 (row, col, num) of the last move, 1-based


class Sudoku(FreeTextEnv[State, State]):
    """The original's rules: a move places a digit; -0.1 for an unparsable or out-of-range move,
    for an initial cell and for a placement that conflicts with its row, column or box; else
    the digit is placed (over an earlier placement too): +1 if it is the solution's, +0.5 if
    not; +10 more when the grid is complete. Invalid moves never end the episode (as the
    original); a placement ends it when the grid is solved or after `max_steps` moves.
    extras: success = solved, action_is_effective = a digit was placed.

    Observation: the original's "with_feedback" text (header, grid with [N] initial cells,
    legend, the last move's feedback, progress, steps). Its conflict section never shows (only
    valid placements change the grid). Feedback is shortened to what fits the text layer's
    tables (at most 19 symbols of at most 32 bytes per slot): "❌ Cannot modify initial cell at
    (r,c)" and "✓ Correct! Placed N at (r,c)" are the original's; a parse error reads "❌ Invalid
    action format" (the original adds the answer and the expected format), an out-of-range move
    "❌ Out of range (1-n)" (the original names the number), a conflict "❌ Invalid placement: N
    at (r,c)" (the original lists the row/column/box and the cell's valid numbers), a valid but
    wrong placement "⚠ Valid, not optimal: N at (r,c)"; the list of valid numbers for the last
    empty cells is not shown, nor the "Puzzle solved!" line (the episode ends there).
    """

    def __init__(self, box: int = 3, difficulty: str = "easy", max_steps: int = 81,
                 action_bytes: int = 64) -> None:
        if box not in (2, 3):
            raise ValueError(f"box must be 2 (4x4 grid) or 3 (9x9); got {box!r}")
        if difficulty not in BLANK_SHARE:
            raise ValueError(f"difficulty must be one of {sorted(BLANK_SHARE)}; got {difficulty!r}")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1; got {max_steps!r}")
        self.box, self.n, self.difficulty = box, box * box, difficulty
        self.max_steps, self.action_bytes = max_steps, action_bytes
        self.blanks = int(self.n * self.n * BLANK_SHARE[difficulty])
        self.instructions = INSTRUCTIONS.format(box=box, n=self.n)
        self._layout = self._grid_layout()
        n = self.n
        feedback = (  # every symbol at most 32 bytes: the slot's BPE work is width x longest
            "",
            "\n\n❌ Invalid action format",
            f"\n\n❌ Out of range (1-{n})",
            "\n\n❌ Cannot modify initial cell",
            "\n\n❌ Invalid placement: ",
            "\n\n✓ Correct! Placed ",
            "\n\n⚠ Valid, not optimal: ",
            " at (", ",", ")", *"123456789",
        )
        def count(name: str, width: int) -> TextSlot:
            return TextSlot(name, COUNT_SYMBOLS, width, lambda rng: _sample_count(rng, width))

        self.observation_parts = (
            f"{RULE}\nSUDOKU PUZZLE\n{RULE}\n",
            TextSlot("grid", GRID_SYMBOLS, len(self._layout), self._sample_grid),
            "\n\nLegend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty",
            TextSlot("feedback", feedback, 7, self._sample_feedback),
            "\n\nProgress: ", count("filled", 2), f"/{n * n} cells filled (",
            count("given", 2), " initial, ", count("placed", 2), " placed)\nSteps: ",
            count("steps", 3), f"/{max_steps}",
        )
        super().__init__()

    def _describe(self) -> str:
        return f"{self.n}x{self.n}, {self.difficulty}, max_steps={self.max_steps}"

    # --- text layout --------------------------------------------------------------------------
    def _grid_layout(self) -> np.ndarray:
        """[L, 3]: per character of the grid text (kind, a, b): kind 0 = the fixed symbol a;
        kind 1 = the open/close char of cell a (b = 0 open, 2 close, 1 digit); kind 2 = the
        close char of a row's last cell (stripped when it is a space, as the original's
        rstrip)."""
        n, box = self.n, self.box
        rows: list[list[tuple[int, int, int]]] = []
        for r in range(n):
            if r and r % box == 0:
                rows.append([(0, _G_EMPTY + 6, 0)] * (n * 3 + box - 1))  # "-" is id 6
            row: list[tuple[int, int, int]] = []
            for c in range(n):
                if c and c % box == 0:
                    row += [(0, 5, 0), (0, _G_SPACE, 0)]  # "| "
                cell = r * n + c
                row += [(1, cell, 0), (1, cell, 1), (2 if c == n - 1 else 1, cell, 2)]
            rows.append(row)
        flat: list[tuple[int, int, int]] = []
        for i, row in enumerate(rows):
            flat += row + ([(0, 7, 0)] if i < len(rows) - 1 else [])  # "\n" is id 7
        return np.array(flat, np.int32)

    def _grid_ids(self, grid, initial):
        kind, a, b = (jnp.asarray(self._layout[:, k]) for k in range(3))
        digit = grid.reshape(-1)[a]
        given = initial.reshape(-1)[a] != 0
        empty = digit == 0
        open_close = jnp.where(given, jnp.where(b == 0, _G_OPEN, _G_CLOSE), _G_SPACE)
        middle = jnp.where(empty, _G_DOT, _G_DIGIT + digit)
        cell = jnp.where(b == 1, middle, open_close)
        last = jnp.where(given, _G_CLOSE, _G_EMPTY)
        return jnp.where(kind == 0, a, jnp.where(kind == 2, last, cell)).astype(jnp.int32)

    def _count_ids(self, value, width):
        powers = 10 ** jnp.arange(width - 1, -1, -1)
        value = jnp.clip(value, 0, 10**width - 1)
        shown = (value >= powers) | (powers == 1)
        return jnp.where(shown, (value // powers) % 10, 10).astype(jnp.int32)

    def render_symbols(self, state: State) -> dict[str, chex.Array]:
        row, col, num = state.last_move[0], state.last_move[1], state.last_move[2]
        head = jnp.array([F_NONE, F_PARSE, F_RANGE, F_INITIAL, F_CONFLICT, F_CORRECT,
                          F_WRONG])[state.last]
        digit = lambda d: _F_DIGIT + jnp.clip(d, 1, 9)  # noqa: E731
        cell = [F_AT, digit(row), F_COMMA, digit(col), F_CLOSE]
        with_num = jnp.stack([head, digit(num), *cell])
        without = jnp.stack([head, *cell, F_NONE])
        plain = jnp.array([0] * 7).at[0].set(head)
        feedback = jnp.where(state.last == INITIAL_CELL, without,
                             jnp.where(state.last >= CONFLICT, with_num, plain))
        filled = jnp.sum(state.grid > 0)
        given = jnp.sum(state.initial > 0)
        return {
            "grid": self._grid_ids(state.grid, state.initial),
            "feedback": feedback.astype(jnp.int32),
            "filled": self._count_ids(filled, 2),
            "given": self._count_ids(given, 2),
            "placed": self._count_ids(filled - given, 2),
            "steps": self._count_ids(state.step_count, 3),
        }

    # --- samplers (realistic fillings for the codec's checks) --------------------------------
    def _sample_state(self, rng: np.random.Generator) -> State:
        n = self.n  # any digits: the text's tokens do not depend on the grid being valid
        solution = rng.integers(1, n + 1, (n, n))
        initial = np.where(rng.random((n, n)) < 0.5, solution, 0)
        grid = np.where((initial == 0) & (rng.random((n, n)) < 0.5),
                        rng.integers(1, n + 1, (n, n)), initial)
        last = int(rng.integers(0, 7))
        move = rng.integers(1, n + 1, 3)
        return State(grid=grid, initial=initial, solution=solution,
                     step_count=np.int32(rng.integers(0, 200)), last=np.int32(last),
                     last_move=move.astype(np.int32))

    def _sample_grid(self, rng):
        return np.asarray(self._render_host(self._sample_state(rng))["grid"])

    def _sample_feedback(self, rng):
        return np.asarray(self._render_host(self._sample_state(rng))["feedback"])

    @cached_property
    def _render_host(self):
        return jax.jit(self.render_symbols)

    # --- dynamics -----------------------------------------------------------------------------
    def reset(self, key: chex.PRNGKey) -> tuple[State, TimeStep[State]]:
        puzzle, solution = generator.generate(key, self.box, self.blanks)
        state = State(grid=puzzle, initial=puzzle, solution=solution, step_count=jnp.int32(0),
                      last=jnp.int32(NO_MOVE), last_move=jnp.zeros((3,), jnp.int32))
        return state, TimeStep(
            step_type=StepType.FIRST, reward=jnp.float32(0.0), discount=jnp.float32(1.0),
            observation=state,
            extras={"success": jnp.bool_(False), "action_is_effective": jnp.bool_(False)},
        )

    def step(self, state: State, action: Move) -> tuple[State, TimeStep[State]]:
        n = self.n
        r, c, d = action.row - 1, action.col - 1, action.num
        in_range = (r >= 0) & (r < n) & (c >= 0) & (c < n) & (d >= 1) & (d <= n)
        rc, cc = jnp.clip(r, 0, n - 1), jnp.clip(c, 0, n - 1)
        given = state.initial[rc, cc] != 0
        fits = generator.candidates(state.grid, self.box)[rc, cc, jnp.clip(d - 1, 0, n - 1)]
        outcome = jnp.select(
            [~action.parsed, ~in_range, given, ~fits, d == state.solution[rc, cc]],
            [UNPARSED, OUT_OF_RANGE, INITIAL_CELL, CONFLICT, PLACED_CORRECT], PLACED_WRONG)
        placed = outcome >= PLACED_CORRECT
        grid = jnp.where(placed, state.grid.at[rc, cc].set(d), state.grid)
        solved = placed & jnp.all(grid == state.solution)
        reward = jnp.where(placed, jnp.where(outcome == PLACED_CORRECT, CORRECT, VALID), INVALID)
        reward = reward + jnp.where(solved, COMPLETION, 0.0)
        steps = state.step_count + 1
        done = placed & (solved | (steps >= self.max_steps))
        state = state._replace(grid=grid, step_count=steps, last=outcome.astype(jnp.int32),
                               last_move=jnp.stack([action.row, action.col, d]).astype(jnp.int32))
        return state, TimeStep(
            step_type=jnp.where(done, StepType.LAST, StepType.MID),
            reward=reward.astype(jnp.float32), discount=jnp.where(done, 0.0, 1.0),
            observation=state, extras={"success": solved, "action_is_effective": placed},
        )

    def parse_action(self, item: chex.Array, length: chex.Array) -> Move:
        return parse_move(item, length)

    @cached_property
    def observation_spec(self) -> specs.Spec[State]:
        n = self.n
        grid = lambda name: specs.BoundedArray((n, n), jnp.int32, 0, n, name)  # noqa: E731
        return specs.Spec(
            State, "ObservationSpec", grid=grid("grid"), initial=grid("initial"),
            solution=grid("solution"), step_count=specs.Array((), jnp.int32, "step_count"),
            last=specs.BoundedArray((), jnp.int32, 0, PLACED_WRONG, "last"),
            last_move=specs.Array((3,), jnp.int32, "last_move"))

    @cached_property
    def action_spec(self) -> specs.Spec[Move]:  # type: ignore[override]
        return specs.Spec(
            Move, "ActionSpec", parsed=specs.Array((), bool, "parsed"),
            row=specs.Array((), jnp.int32, "row"), col=specs.Array((), jnp.int32, "col"),
            num=specs.Array((), jnp.int32, "num"))


def _sample_count(rng: np.random.Generator, width: int) -> np.ndarray:
    """[width] ids into COUNT_SYMBOLS: a random count of 1..width digits, right-aligned."""
    text = str(int(rng.integers(0, 10 ** int(rng.integers(1, width + 1)))))
    return np.array([10] * (width - len(text)) + [int(c) for c in text], np.int32)
