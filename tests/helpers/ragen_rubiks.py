"""A reference of RAGEN's RubiksCube2x2Env (ragen/env/rubikscube/env.py at 20daedc) in plain
Python, written for the tests: 24 stickers, faces in the order U L F R B D (four stickers each
in reading order), colour c of face c when solved; its twelve turns, reward, end and text.

Each clockwise turn is data here: the turned face's stickers cycle, and four pairs of stickers
on the neighbouring faces pass along the ring (DEST <- SOURCE), as the original's _move_X
methods assign them; a prime is three clockwise turns, as there."""

from __future__ import annotations

import numpy as np

ACTIONS = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")
FACE_INDEX = {"U": 0, "L": 1, "F": 2, "R": 3, "B": 4, "D": 5}
# (destination, source) sticker pairs on the ring around each face, for a clockwise turn.
RING = {
    "U": ((8, 12), (9, 13), (12, 16), (13, 17), (16, 4), (17, 5), (4, 8), (5, 9)),
    "D": ((10, 6), (11, 7), (6, 18), (7, 19), (18, 14), (19, 15), (14, 10), (15, 11)),
    "L": ((0, 19), (2, 17), (19, 20), (17, 22), (20, 8), (22, 10), (8, 0), (10, 2)),
    "R": ((1, 9), (3, 11), (9, 21), (11, 23), (21, 18), (23, 16), (18, 1), (16, 3)),
    "F": ((2, 7), (3, 5), (7, 21), (5, 20), (21, 12), (20, 14), (12, 2), (14, 3)),
    "B": ((0, 13), (1, 15), (13, 22), (15, 23), (22, 6), (23, 4), (6, 0), (4, 1)),
}
COLOURS = "WOGRBY"
LABELS = ("Up (U):    ", "Left (L):  ", "Front (F): ", "Right (R): ", "Back (B):  ", "Down (D):  ")
SOLVED = np.repeat(np.arange(6), 4)


def clockwise(face: str) -> np.ndarray:
    """[24] source of each sticker after a clockwise turn: new = old[source]."""
    source = np.arange(24)
    base = 4 * FACE_INDEX[face]
    # The face itself: top-left <- bottom-left <- bottom-right <- top-right <- top-left.
    for dst, src in ((0, 2), (2, 3), (3, 1), (1, 0)):
        source[base + dst] = base + src
    for dst, src in RING[face]:
        source[dst] = src
    return source


def permutation(action: int) -> np.ndarray:
    """[24] source table of ACTIONS[action] (a prime: three clockwise turns)."""
    name = ACTIONS[action]
    turn = clockwise(name[0])
    out = np.arange(24)
    for _ in range(3 if name.endswith("'") else 1):
        out = out[turn]
    return out


PERMUTATIONS = np.stack([permutation(a) for a in range(len(ACTIONS))])


def is_solved(stickers: np.ndarray) -> bool:
    return all(len(set(stickers[4 * f: 4 * f + 4])) == 1 for f in range(6))


class ReferenceCube:
    def __init__(self, stickers, step: int = 0, max_steps: int = 20) -> None:
        self.stickers = np.array(stickers, dtype=np.int64)
        self.step_count = step
        self.max_steps = max_steps
        self.done, self.message = False, ""

    def step(self, action: int):
        """action: index into ACTIONS. Returns (reward, done, info) as the original's step."""
        self.stickers = self.stickers[PERMUTATIONS[action]]
        self.step_count += 1
        solved = is_solved(self.stickers)
        truncated = self.step_count >= self.max_steps
        self.done = solved or truncated
        self.message = "Cube Solved!" if solved else "Max steps reached." if truncated else ""
        return (1.0 if solved else 0.0), self.done, {"success": solved,
                                                      "action_is_effective": True}

    def render(self) -> str:
        def face(f: int) -> str:
            c = [COLOURS[v] for v in self.stickers[4 * f: 4 * f + 4]]
            return f"[{c[0]}, {c[1]}]\n [{c[2]}, {c[3]}]"

        lines = ["=== Rubik's Cube 2x2 State ===", f"Step: {self.step_count}/{self.max_steps}", ""]
        lines += [LABELS[f] + face(f) for f in range(6)]
        if self.done:
            lines += ["", f"=== Game Over: {self.message} ==="]
        else:
            lines += ["", "Available Actions:", ", ".join(ACTIONS), "\nWhat is your next move?"]
        return "\n".join(lines)
