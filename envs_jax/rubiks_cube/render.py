"""The cube's observation as the original renders it (RAGEN's RubiksCube2x2Env.render), as text
and slots: the step counter, one slot per face (its four colours), and how the text ends
(the action menu while playing, the game-over line once solved or out of steps).

    === Rubik's Cube 2x2 State ===
    Step: 0/20

    Up (U):    [W, G]
     [W, B]
    ...
    Down (D):  [Y, Y]
     [O, R]

    Available Actions:
    U, U', D, D', L, L', R, R', F, F', B, B'

    What is your next move?
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
from jumanji.environments.logic.rubiks_cube.utils import is_solved

from envs_jax.base import TextSlot
from envs_jax.rubiks_cube.moves import ORIGINAL_FACES

# Sticker value (jumanji's face of origin: U F R B L D) -> the original's colour of that face
# (U white, L orange, F green, R red, B blue, D yellow; jumanji's default colours too).
COLOURS = ("W", "G", "R", "B", "O", "Y")
FACE_SYMBOLS = (*COLOURS, ", ", "]\n [")
_COMMA, _BREAK = 6, 7
FACE_LABELS = ("Up (U):    ", "Left (L):  ", "Front (F): ", "Right (R): ", "Back (B):  ",
               "Down (D):  ")
ENDINGS = (
    "Available Actions:\nU, U', D, D', L, L', R, R', F, F', B, B'\n\nWhat is your next move?",
    "=== Game Over: Cube Solved! ===",
    "=== Game Over: Max steps reached. ===",
)
PLAYING, SOLVED, OUT_OF_STEPS = range(3)
DIGITS = (*"0123456789", "")
STEP_WIDTH = 3  # step counts up to 999


def face_ids(face: chex.Array) -> chex.Array:
    """[2, 2] sticker values -> the face slot's ids [7]: "c, c]\\n [c, c"."""
    c = jnp.asarray(face, jnp.int32).reshape(-1)
    return jnp.stack([c[0], jnp.int32(_COMMA), c[1], jnp.int32(_BREAK), c[2],
                      jnp.int32(_COMMA), c[3]])


def step_ids(step: chex.Array) -> chex.Array:
    """[] int -> [STEP_WIDTH] ids into DIGITS, leading positions empty."""
    powers = jnp.asarray([10**k for k in range(STEP_WIDTH - 1, -1, -1)], jnp.int32)
    step = jnp.clip(step, 0, 10**STEP_WIDTH - 1)
    return jnp.where((step >= powers) | (powers == 1), (step // powers) % 10, 10).astype(jnp.int32)


def ending(cube: chex.Array, step_count: chex.Array, max_steps: int) -> chex.Array:
    """[] int32: which ENDINGS line the text ends with. The original renders the menu at reset
    (even for a scramble that happens to be solved) and after a step that did not end the
    episode (solved, or max_steps steps taken)."""
    solved = is_solved(cube)
    done = (step_count > 0) & (solved | (step_count >= max_steps))
    return jnp.where(done, jnp.where(solved, SOLVED, OUT_OF_STEPS), PLAYING).astype(jnp.int32)


def render(cube: chex.Array, step_count: chex.Array, max_steps: int) -> dict[str, chex.Array]:
    return {
        "step": step_ids(step_count),
        **{f"face{k}": face_ids(cube[f]) for k, f in enumerate(ORIGINAL_FACES)},
        "ending": ending(cube, step_count, max_steps)[None],
    }


def observation_parts(max_steps: int) -> tuple[str | TextSlot, ...]:
    def sample_face(rng: np.random.Generator) -> np.ndarray:
        c = rng.integers(0, 6, 4)
        return np.array([c[0], _COMMA, c[1], _BREAK, c[2], _COMMA, c[3]], np.int32)

    def sample_step(rng: np.random.Generator) -> np.ndarray:
        text = str(int(rng.integers(0, max_steps + 1)))
        return np.array([10] * (STEP_WIDTH - len(text)) + [int(d) for d in text], np.int32)

    parts: list[str | TextSlot] = [
        "=== Rubik's Cube 2x2 State ===\nStep: ",
        TextSlot("step", DIGITS, STEP_WIDTH, sample_step),
        f"/{max_steps}\n\n",
    ]
    for k, label in enumerate(FACE_LABELS):
        parts += [("" if k == 0 else "]\n") + label + "[",
                  TextSlot(f"face{k}", FACE_SYMBOLS, 7, sample_face)]
    parts += ["]\n\n", TextSlot("ending", ENDINGS, 1, lambda rng: rng.integers(0, 3, 1))]
    return tuple(parts)
