"""Host-side level text: parse and validate a grid of symbols into the level's layers.

Shared by `Sokoban.reset_from_text` and the BFS `solver`, so both read text the same way.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from envs_jax.sokoban import constants as c


class Layers(NamedTuple):
    """A level as boolean layers (all [H, W] bool) and the player's (row, col)."""

    walls: np.ndarray
    targets: np.ndarray
    boxes: np.ndarray
    player: tuple[int, int]


def parse_symbols(text: str, symbols: tuple[str, ...] = c.SYMBOLS) -> np.ndarray:
    """Symbol ids of a grid text (rows separated by newlines): int32 [H, W].

    Raises ValueError naming the bad row or symbol for empty, ragged or unknown input.
    """
    rows = text.strip("\n").split("\n")
    if not rows or not rows[0]:
        raise ValueError("level text is empty; expected rows of symbols separated by newlines")
    if any(len(s) != 1 for s in symbols):
        raise ValueError(f"symbols must be single characters to parse text; got {symbols}")
    lookup = {s: i for i, s in enumerate(symbols)}
    width = len(rows[0])
    ids = np.zeros((len(rows), width), np.int32)
    for r, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(
                f"level text is not rectangular: row {r} {row!r} has {len(row)} symbols, "
                f"row 0 has {width}"
            )
        for col, ch in enumerate(row):
            if ch not in lookup:
                raise ValueError(
                    f"unknown symbol {ch!r} at row {r}, column {col}; valid symbols: "
                    f"{' '.join(symbols)}"
                )
            ids[r, col] = lookup[ch]
    return ids


def layers_from_symbols(ids: np.ndarray) -> Layers:
    """Splits symbol ids int [H, W] into layers, checking it is a playable level.

    Raises ValueError unless there is exactly one player and #boxes == #targets >= 1.
    """
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.size == 0 or ids.min() < 0 or ids.max() > c.PLAYER_ON_TARGET:
        raise ValueError(
            f"symbol ids must be a non-empty 2-D array of values 0..{c.PLAYER_ON_TARGET}; "
            f"got shape {ids.shape}"
        )
    players = np.argwhere((ids == c.PLAYER) | (ids == c.PLAYER_ON_TARGET))
    if len(players) != 1:
        raise ValueError(f"a level needs exactly one player; found {len(players)}")
    boxes = (ids == c.BOX) | (ids == c.BOX_ON_TARGET)
    targets = (ids == c.TARGET) | (ids == c.BOX_ON_TARGET) | (ids == c.PLAYER_ON_TARGET)
    if boxes.sum() != targets.sum() or boxes.sum() < 1:
        raise ValueError(
            f"a level needs as many boxes as targets, at least one; found {int(boxes.sum())} "
            f"boxes and {int(targets.sum())} targets"
        )
    return Layers(
        walls=ids == c.WALL,
        targets=targets,
        boxes=boxes,
        player=(int(players[0][0]), int(players[0][1])),
    )
