"""A plain numpy/Python port of RAGEN's text renderers of Sokoban and FrozenLake (grid, coord,
grid_coord), the reference of tests/test_coords.py.

Written from RAGEN 20daedc's ragen/env/sokoban/env.py (`_render_text`), sokoban/utils.py and
frozen_lake/env.py, frozen_lake/utils.py (`collect_entity_coordinates`,
`format_coordinate_render`). Sokoban reads gym-sokoban's arrays: room_fixed (0 wall, 1 empty,
2 target) and room_state (0 wall, 1 empty, 2 target, 3 box on target, 4 box, 5 player);
FrozenLake reads the map `desc` (bytes S F H G; the start stays S under the player) and the
player's (row, col). The converters build those arrays from this project's states using only
the states' fields, not the code under test.
"""

from __future__ import annotations

import numpy as np

SOKOBAN_LOOKUP = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
FROZEN_LAKE_MAP = {b"P": 0, b"F": 1, b"H": 2, b"G": 3}
FROZEN_LAKE_LOOKUP = {0: "P", 1: "_", 2: "O", 3: "G", 4: "X", 5: "√"}


def _cells(array: np.ndarray) -> list[tuple[int, int]]:
    return [(int(r), int(c)) for r, c in np.argwhere(array)]


def _lines(board_shape: tuple[int, int], labelled: list[tuple[str, list]]) -> str:
    rows, cols = board_shape
    lines = [f"Board size: {rows} rows x {cols} cols (zero-indexed)."]
    for label, coords in labelled:
        if coords:
            lines.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in coords))
    return "\n".join(lines)


def _formatted(fmt: str, grid: str, coord: str) -> str:
    if fmt == "grid":
        return grid
    if fmt == "coord":
        return coord
    if fmt == "grid_coord":
        return "Coordinates: \n" + coord + "\n" + "Grid Map: \n" + grid
    raise ValueError(fmt)


# --- Sokoban ------------------------------------------------------------------------------
def sokoban_arrays(walls, targets, boxes, player) -> tuple[np.ndarray, np.ndarray]:
    """(room_fixed, room_state) of a level given as bool [H, W] layers and (row, col)."""
    walls, targets, boxes = (np.asarray(x, bool) for x in (walls, targets, boxes))
    room_fixed = np.where(walls, 0, np.where(targets, 2, 1))
    room_state = room_fixed.copy()
    room_state[boxes] = np.where(targets[boxes], 3, 4)
    room_state[int(player[0]), int(player[1])] = 5
    return room_fixed, room_state


def sokoban_coordinates(room_state: np.ndarray, room_fixed: np.ndarray) -> dict[str, list]:
    """collect_entity_coordinates (walls are not collected)."""
    coords = {"targets": _cells(room_fixed == 2), "boxes_on_target": _cells(room_state == 3),
              "boxes": _cells(room_state == 4)}
    players = _cells(room_state == 5)
    coords["player"] = [p for p in players if room_fixed[p] != 2]
    coords["player_on_target"] = [p for p in players if room_fixed[p] == 2]
    return coords


def sokoban_lines(room_state: np.ndarray, room_fixed: np.ndarray) -> str:
    """format_coordinate_render: the header and the entity lines."""
    coords = sokoban_coordinates(room_state, room_fixed)
    order = [("walls", "Walls"), ("targets", "Targets"), ("boxes", "Boxes"),
             ("boxes_on_target", "Boxes on target"), ("player", "Player"),
             ("player_on_target", "Player on target")]
    return _lines(room_fixed.shape, [(label, coords.get(key, [])) for key, label in order])


def sokoban_text(room_state: np.ndarray, room_fixed: np.ndarray, fmt: str) -> str:
    """SokobanEnv._render_text(fmt)."""
    room = np.where((room_state == 5) & (room_fixed == 2), 6, room_state)
    grid = "\n".join("".join(SOKOBAN_LOOKUP.get(int(c), "?") for c in row) for row in room)
    return _formatted(fmt, grid, sokoban_lines(room_state, room_fixed))


# --- FrozenLake ---------------------------------------------------------------------------
def frozen_lake_desc(tiles, start) -> np.ndarray:
    """desc (bytes, gymnasium's dtype "c") of tiles int [S, S] (0 frozen, 1 hole, 2 goal) with
    the start cell `start` (row, col)."""
    desc = np.array([[b"FHG"[int(t):int(t) + 1] for t in row] for row in np.asarray(tiles)],
                    dtype="c")
    desc[int(start[0]), int(start[1])] = b"S"
    return desc


def frozen_lake_lines(desc: np.ndarray, player: tuple[int, int]) -> str:
    """collect_entity_coordinates + format_coordinate_render."""
    coords = {"start": _cells(desc == b"S"), "goal": _cells(desc == b"G"),
              "holes": _cells(desc == b"H")}
    tile = desc[player]
    key = "player_on_goal" if tile == b"G" else "player_in_hole" if tile == b"H" else "player"
    coords[key] = [tuple(int(x) for x in player)]
    order = [("start", "Start"), ("goal", "Goal"), ("player", "Player"),
             ("player_on_goal", "Player on goal"), ("player_in_hole", "Player in hole"),
             ("holes", "Holes")]
    return _lines(desc.shape, [(label, coords.get(key, [])) for key, label in order])


def frozen_lake_text(desc: np.ndarray, player, fmt: str) -> str:
    """FrozenLakeEnv._render_text(fmt)."""
    player = (int(player[0]), int(player[1]))
    room = np.where(desc == b"S", b"F", desc)
    room[player] = b"P"
    room = np.vectorize(lambda x: FROZEN_LAKE_MAP[x])(room)
    room[player] = 4 if desc[player] == b"H" else 5 if desc[player] == b"G" else 0
    grid = "\n".join("".join(FROZEN_LAKE_LOOKUP.get(int(c), "?") for c in row) for row in room)
    return _formatted(fmt, grid, frozen_lake_lines(desc, player))


def without_header(lines: str) -> str:
    """The coordinate lines after "Board size: ...\\n"."""
    head, _, rest = lines.partition("\n")
    assert head.startswith("Board size: "), head
    return rest
