"""Plain-Python peers of the free-text games for bench/envs.py: the original's rules
(ragen/env/countdown/env.py, ragen/env/sudoku/{env,utils}.py) transcribed, and the random
answers both sides step on."""

from __future__ import annotations

import re
import time
from typing import Any

import jax
import numpy as np

from envs_jax.countdown import Countdown
from envs_jax.sudoku import Sudoku

ANSWERS = 512  # distinct answers per state batch, cycled


# --- Countdown: compute_reward -----------------------------------------------------------------
def countdown_reward(answer: str, nums: list[int], target: int) -> float:
    try:
        if sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(nums):
            return 0.0
    except ValueError:
        return 0.0
    try:
        result = eval(answer, {"__builtins__": None}, {})  # noqa: S307 - the original's check
        return 1.0 if abs(result - target) < 1e-5 else 0.1
    except Exception:  # noqa: BLE001 - the original catches everything
        return 0.1


def _countdown_answer(rng: np.random.Generator, nums: list[int]) -> str:
    parts = [str(n) for n in rng.permutation(nums)]
    text = parts[0]
    for p in parts[1:]:
        text = f"({text} {rng.choice(list('+-*/'))} {p})" if rng.random() < 0.3 else \
            f"{text} {rng.choice(list('+-*/'))} {p}"
    return text


# --- Sudoku: parse_action, step, render (with_feedback) ------------------------------------------
_PATTERNS = [
    r"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
    r"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
    r"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"(\d+)\s+at\s+(\d+),\s*(\d+)",
    r"\((\d+),\s*(\d+),\s*(\d+)\)",
    r"(\d+),\s*(\d+),\s*(\d+)",
]


class PySudoku:
    """The original's SudokuEnv step on given grids (no generator: states come from ours)."""

    def __init__(self, initial: np.ndarray, solution: np.ndarray, render: bool) -> None:
        self.initial, self.solution = initial.copy(), solution
        self.grid, self.n, self.box = initial.copy(), initial.shape[0], int(initial.shape[0] ** 0.5)
        self.render, self.steps, self.feedback = render, 0, ""

    def parse(self, action: str):
        action = action.strip().lower()
        for pattern in _PATTERNS:
            match = re.search(pattern, action)
            if match:
                a, b, c = map(int, match.groups())
                num, row, col = (a, b, c) if "place" in action or "at" in action else (c, a, b)
                row, col = row - 1, col - 1
                if 0 <= row < self.n and 0 <= col < self.n and 1 <= num <= self.n:
                    return row, col, num
                return None
        return None

    def valid(self, row: int, col: int, num: int) -> bool:
        b = self.box
        br, bc = row // b * b, col // b * b
        g = self.grid
        return not (num in g[row, :] or num in g[:, col] or num in g[br:br + b, bc:bc + b])

    def step(self, action: str) -> float:
        self.steps += 1
        move = self.parse(action)
        if move is None or self.initial[move[0], move[1]] != 0 or not self.valid(*move):
            reward = -0.1
            self.feedback = "❌ invalid"
        else:
            row, col, num = move
            self.grid[row, col] = num
            reward = 1.0 if num == self.solution[row, col] else 0.5
            self.feedback = f"✓ Correct! Placed {num} at ({row + 1},{col + 1})"
            if np.all(self.grid != 0) and not self.conflicts():
                reward += 10.0
        if self.render:
            self.text()
        return reward

    def conflicts(self) -> set:
        """The original's find_conflicts (every render calls it)."""
        n, b, g = self.n, self.box, self.grid
        found = set()
        for i in range(n):
            for num in range(1, n + 1):
                for pos in np.where(g[i, :] == num)[0] if (g[i, :] == num).sum() > 1 else []:
                    found.add((i, pos))
                for pos in np.where(g[:, i] == num)[0] if (g[:, i] == num).sum() > 1 else []:
                    found.add((pos, i))
        for br in range(b):
            for bc in range(b):
                box = g[br * b:br * b + b, bc * b:bc * b + b]
                for num in range(1, n + 1):
                    pos = np.argwhere(box == num)
                    if len(pos) > 1:
                        found |= {(br * b + p[0], bc * b + p[1]) for p in pos}
        return found

    def text(self) -> str:
        conflicts = self.conflicts()
        n, b = self.n, self.box
        lines = []
        for i, row in enumerate(self.grid):
            if i and i % b == 0:
                lines.append("-" * (n * 3 + b - 1))
            s = ""
            for j, v in enumerate(row):
                if j and j % b == 0:
                    s += "| "
                s += (" . " if v == 0 else f"[{v}]" if self.initial[i, j] else
                      f"*{v}*" if (i, j) in conflicts else f" {v} ")
            lines.append(s.rstrip())
        out = ["=" * 50, "SUDOKU PUZZLE", "=" * 50, "\n".join(lines), "", "Legend: ...", "",
               self.feedback]
        empty = list(zip(*np.where(self.grid == 0)))
        if empty and len(empty) <= 10:
            out.append("💡 VALID NUMBERS FOR EMPTY CELLS:")
            for r, c in empty[:10]:
                valid = [d for d in range(1, n + 1) if self.valid(r, c, d)]
                if valid:
                    out.append(f"  - ({r + 1},{c + 1}): {valid}")
        filled = int(np.count_nonzero(self.grid))
        out.append(f"Progress: {filled}/{n * n} cells filled")
        out.append(f"Steps: {self.steps}/81")
        return "\n".join(out)


def _sudoku_answer(rng: np.random.Generator, n: int, solution: np.ndarray) -> str:
    r, c = (int(x) for x in rng.integers(0, n, 2))
    d = int(solution[r, c]) if rng.random() < 0.5 else int(rng.integers(1, n + 1))
    forms = (f"place {d} at row {r + 1} col {c + 1}", f"{r + 1},{c + 1},{d}", "no idea")
    return forms[int(rng.integers(3)) if rng.random() < 0.9 else 2]


# --- shared -----------------------------------------------------------------------------------
def answers(env: Any, states: Any, count: int, seed: int = 0) -> list[list[str]]:
    """count answers per state (states: a host batch), as the bench steps them."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(len(np.asarray(states.step_count))):
        if isinstance(env, Countdown):
            nums = [int(x) for x in states.nums[b][: int(states.count[b])]]
            out.append([_countdown_answer(rng, nums) for _ in range(count)])
        else:
            out.append([_sudoku_answer(rng, env.n, states.solution[b]) for _ in range(count)])
    return out


def encoded_answers(env: Any, states: Any, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [steps, B, W] int32 -1 padded, lengths [steps, B] int32) of random answers."""
    texts = answers(env, states, min(steps, ANSWERS))
    batch, width = len(texts), env.action_bytes
    items = np.full((steps, batch, width), -1, np.int32)
    lengths = np.zeros((steps, batch), np.int32)
    for b, row in enumerate(texts):
        for t in range(steps):
            raw = row[t % len(row)].encode()
            items[t, b, : min(len(raw), width)] = np.frombuffer(raw[:width], np.uint8)
            lengths[t, b] = len(raw)
    return items, lengths


def python_steps_per_s(env: Any, steps: int) -> dict[str, float]:
    """{peer label: steps/s} of the transcribed rules on `steps` answers (64 states cycled)."""
    states = jax.device_get(jax.jit(jax.vmap(env.reset))(jax.random.split(
        jax.random.PRNGKey(0), 64))[0])
    texts = answers(env, states, max(1, steps // 64))
    if isinstance(env, Countdown):
        start = time.perf_counter()
        done = 0
        for b, row in enumerate(texts):
            nums = [int(x) for x in states.nums[b][: int(states.count[b])]]
            for text in row:
                countdown_reward(text, nums, int(states.target[b]))
                done += 1
        return {"compute_reward": done / (time.perf_counter() - start)}
    assert isinstance(env, Sudoku)
    rates = {}
    for label, render in (("parse+step", False), ("parse+step+render", True)):
        start, done = time.perf_counter(), 0
        for b, row in enumerate(texts[: 64 if not render else 8]):
            game = PySudoku(states.initial[b], states.solution[b], render)
            for text in row:
                game.step(text)
                done += 1
        rates[label] = done / (time.perf_counter() - start)
    return rates
