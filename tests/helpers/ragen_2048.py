"""A reference of RAGEN's Game2048Env (ragen/env/game_2048/env.py at 20daedc) in plain Python,
written for the tests: its slide-and-merge, rewards, termination, success and text. The tile
spawn is injected (`step(action, spawn)`), so the reference can follow a compiled episode: the
tests read the compiled env's new tile and check it is one the original could have drawn."""

from __future__ import annotations

import math

import numpy as np

NAMES = {0: "Up", 1: "Right", 2: "Down", 3: "Left"}


def slide_line(line: list[int]) -> tuple[list[int], int]:
    """One line slid toward its start: equal neighbours merge once, leftmost pairs first.
    Returns (new line, merged value sum)."""
    tiles = [v for v in line if v]
    out, gained, i = [], 0, 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            out.append(2 * tiles[i])
            gained += 2 * tiles[i]
            i += 2
        else:
            out.append(tiles[i])
            i += 1
    return out + [0] * (len(line) - len(out)), gained


def slide(grid: np.ndarray, action: int) -> tuple[np.ndarray, int, bool]:
    """(new grid, merged sum, moved) for action 0 Up, 1 Right, 2 Down, 3 Left."""
    # Turn the board so the move is "toward column 0" on each row, slide, turn back.
    turns = {3: 0, 0: 1, 1: 2, 2: 3}[action]  # np.rot90 counter-clockwise quarter turns
    rotated = np.rot90(grid, turns)
    rows, gained = [], 0
    for row in rotated:
        new, g = slide_line([int(v) for v in row])
        rows.append(new)
        gained += g
    out = np.rot90(np.array(rows, dtype=np.int64), -turns)
    return out, gained, not np.array_equal(out, grid)


class Reference2048:
    def __init__(self, grid, score: int = 0, *, use_log_reward: bool = True,
                 invalid_act_score: float = -0.1) -> None:
        self.grid = np.array(grid, dtype=np.int64)
        self.score = int(score)
        self.use_log_reward = use_log_reward
        self.invalid_act_score = invalid_act_score

    def valid_actions(self) -> list[int]:
        return [a for a in NAMES if slide(self.grid, a)[2]]

    def step(self, action: int, spawn: tuple[int, int, int] | None):
        """spawn: (row, col, value) of the new tile after a move that moved.
        Returns (reward, done, info) as the original's step."""
        new, gained, moved = slide(self.grid, action)
        info = {"action_is_effective": moved, "success": False}
        done = False
        if moved:
            row, col, value = spawn
            assert new[row, col] == 0 and value in (2, 4), (new, spawn)
            new[row, col] = value
            self.grid = new
            self.score += gained
            raw = float(gained)
            done = not self.valid_actions()
            info["success"] = done and int(self.grid.max()) >= 2048
        else:
            raw = self.invalid_act_score
        if self.use_log_reward:
            reward = math.log2(raw + 1.0) * 0.1 if raw > 0 else 0.0
        else:
            reward = raw
        return reward, done, info

    def render(self) -> str:
        lines = ["Current 2048 Grid:"]
        lines += [f"Row {i + 1}: [" + ", ".join(str(int(v)) for v in row) + "]"
                  for i, row in enumerate(self.grid)]
        valid = self.valid_actions()
        menu = ", ".join(f"{a}({NAMES[a]})" for a in valid) or "None"
        lines += ["", f"Valid Actions: {menu}.", "Goal: Merge same numbers to reach 2048.",
                  f"Current Score: {self.score}", "What is your next move?"]
        return "\n".join(lines)
