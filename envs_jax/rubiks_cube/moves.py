"""The 2x2 cube's twelve face turns on jumanji's cube, and the original's scramble.

jumanji's cube is int [6, 2, 2]: faces UP, FRONT, RIGHT, BACK, LEFT, DOWN (ids 0..5), each read
in reading order looking straight at it (UP with BACK at the top, DOWN with FRONT at the top,
the side faces with UP at the top), sticker values the id of the face they started on. The
original (RAGEN's RubiksCube2x2Env) keeps 24 stickers, faces in the order U L F R B D, each
face's four in the same reading order, so its sticker 4 * f + 2 * r + c is jumanji's
(ORIGINAL_FACES[f], r, c); its face turns U D L R F are exactly jumanji's quarter turns.

Its B and B' are not: RAGEN's _move_B moves the down face's back row onto the right face
mirrored, and B' likewise onto the left face. Each is jumanji's rigid turn followed by two
swaps of stickers within a face (RAGEN_SWAPS; tests/test_rubiks_cube.py checks all twelve
turns against a port of the original). The swaps keep every face's colours, so whether the
cube is solved is unchanged, but a scramble can reach colourings no real cube has. moves="ragen"
(the default) plays the original's turns, moves="jumanji" jumanji's rigid ones.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji.environments.logic.rubiks_cube.constants import CubeMovementAmount, Face
from jumanji.environments.logic.rubiks_cube.generator import Generator
from jumanji.environments.logic.rubiks_cube.utils import flatten_action, rotate_cube

ACTION_NAMES = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")
_FACE_OF = {"U": Face.UP, "D": Face.DOWN, "L": Face.LEFT, "R": Face.RIGHT, "F": Face.FRONT,
            "B": Face.BACK}
#: jumanji's action (face, depth, amount) of each word: a letter turns clockwise, a prime back.
_AMOUNT = {False: list(CubeMovementAmount).index(CubeMovementAmount.CLOCKWISE),
           True: list(CubeMovementAmount).index(CubeMovementAmount.ANTI_CLOCKWISE)}
ACTION_VALUES = np.array([[_FACE_OF[n[0]].value, 0, _AMOUNT[n.endswith("'")]]
                          for n in ACTION_NAMES], np.int32)
#: The original's faces, in its order U L F R B D, as jumanji's face ids.
ORIGINAL_FACES = (Face.UP.value, Face.LEFT.value, Face.FRONT.value, Face.RIGHT.value,
                  Face.BACK.value, Face.DOWN.value)
MOVES = ("ragen", "jumanji")
_R, _L, _D = Face.RIGHT.value, Face.LEFT.value, Face.DOWN.value
#: The original's B / B' = jumanji's B / B' then these (face, row, col) pairs swapped.
RAGEN_SWAPS = {
    "B": (((_R, 0, 1), (_R, 1, 1)), ((_D, 1, 0), (_D, 1, 1))),
    "B'": (((_L, 0, 0), (_L, 1, 0)), ((_D, 1, 0), (_D, 1, 1))),
}


def fixups(moves: str) -> np.ndarray:
    """[12, 24] int32: after jumanji's turn of word i, flat sticker j takes sticker
    fixups[i, j] (the identity but for the original's B and B' under moves="ragen")."""
    if moves not in MOVES:
        raise ValueError(f"moves must be one of {MOVES}; got {moves!r}")
    table = np.tile(np.arange(24, dtype=np.int32), (len(ACTION_NAMES), 1))
    if moves == "ragen":
        for name, pairs in RAGEN_SWAPS.items():
            row = table[ACTION_NAMES.index(name)]
            for a, b in pairs:
                i, j = np.ravel_multi_index(a, (6, 2, 2)), np.ravel_multi_index(b, (6, 2, 2))
                row[i], row[j] = row[j], row[i]
    return table


def turn(cube: chex.Array, action: chex.Array, fix: chex.Array) -> chex.Array:
    """cube [6, 2, 2] after word `action` ([] int32 into ACTION_NAMES); fix: `fixups(...)`."""
    value = jnp.asarray(ACTION_VALUES)[action]
    moved = rotate_cube(cube, flatten_action(value, cube_size=2))
    return moved.reshape(-1)[jnp.asarray(fix)[action]].reshape(cube.shape)


def permutations(moves: str) -> np.ndarray:
    """[12, 24] int32 host table: word i sends a flat cube c to c[permutations[i]]."""
    fix = fixups(moves)
    with jax.ensure_compile_time_eval():
        labels = jnp.arange(24, dtype=jnp.int8).reshape(6, 2, 2)
    every = jax.jit(jax.vmap(lambda a: turn(labels, a, fix).reshape(-1)))
    with jax.ensure_compile_time_eval():  # concrete even when first asked for inside a trace
        return np.asarray(every(jnp.arange(len(ACTION_NAMES), dtype=jnp.int32)), np.int32)


class QuarterTurnScramble(Generator):
    """The original's scramble: `depth` turns, each uniform over the twelve quarter turns
    (jumanji's ScramblingGenerator draws from all eighteen moves, half turns included)."""

    def __init__(self, depth: int, moves: str) -> None:
        super().__init__(cube_size=2)
        self.depth = depth
        self.fix = fixups(moves)

    def generate_cube(self, key: chex.PRNGKey) -> chex.Array:
        actions = jax.random.randint(key, (self.depth,), 0, len(ACTION_NAMES), jnp.int32)
        solved = jnp.repeat(jnp.arange(6, dtype=jnp.int8), 4).reshape(6, 2, 2)
        cube, _ = jax.lax.scan(lambda c, a: (turn(c, a, self.fix), None), solved, actions)
        return cube
