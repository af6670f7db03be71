"""Optimal Sokoban solver: plain-Python breadth-first search over (player, boxes) states.

Used by the tests and the environment benchmark to measure level difficulty. Moves follow the
environment's rules (push one box if the cell beyond it is free, else walk if the cell ahead is
free; anything off the grid is a wall), and every action counts as one move.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from envs_jax.sokoban import constants as c
from envs_jax.sokoban.levels import layers_from_symbols, parse_symbols


def solve(
    level: str | np.ndarray,
    symbols: tuple[str, ...] = c.SYMBOLS,
    max_states: int = 2_000_000,
) -> int | None:
    """Length of the shortest solution of a level, or None if it cannot be solved.

    Args:
      level: the level as text in `symbols` (what `Sokoban.render_text` returns), or its symbol
        ids int [H, W] (what `Sokoban.render_symbols` returns).
      symbols: the vocabulary of a text level (`constants.SYMBOLS` or `NEW_VOCAB_SYMBOLS`).
      max_states: search budget; exceeding it raises RuntimeError rather than guessing.

    Returns:
      The minimal number of actions (Up/Down/Left/Right) that puts every box on a target; 0 for a
      level that is already solved; None if no sequence of actions does.
    """
    ids = parse_symbols(level, symbols) if isinstance(level, str) else np.asarray(level)
    layers = layers_from_symbols(ids)
    height, width = ids.shape
    # Flat cell indices on a grid padded by one wall cell, so no move needs a bounds check.
    pw = width + 2
    free = np.zeros((height + 2, pw), bool)
    free[1:-1, 1:-1] = ~layers.walls
    free_cells = set(np.flatnonzero(free).tolist())
    targets = frozenset(((r + 1) * pw + col + 1) for r, col in np.argwhere(layers.targets))
    boxes = tuple(sorted(((r + 1) * pw + col + 1) for r, col in np.argwhere(layers.boxes)))
    player = (layers.player[0] + 1) * pw + layers.player[1] + 1
    deltas = [dr * pw + dc for dr, dc in c.MOVES]

    start = (player, boxes)
    if set(boxes) <= targets:
        return 0
    seen = {start}
    frontier = deque([(start, 0)])
    while frontier:
        (player, boxes), depth = frontier.popleft()
        box_set = set(boxes)
        for delta in deltas:
            ahead = player + delta
            if ahead not in free_cells:
                continue
            if ahead in box_set:
                beyond = ahead + delta
                if beyond not in free_cells or beyond in box_set:
                    continue
                new_boxes = tuple(sorted((box_set - {ahead}) | {beyond}))
            else:
                new_boxes = boxes
            state = (ahead, new_boxes)
            if state in seen:
                continue
            if new_boxes is not boxes and set(new_boxes) <= targets:
                return depth + 1
            seen.add(state)
            if len(seen) > max_states:
                raise RuntimeError(f"solver gave up after {max_states} states; raise max_states")
            frontier.append((state, depth + 1))
    return None
