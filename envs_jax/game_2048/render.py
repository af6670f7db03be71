"""2048's observation as the original renders it (RAGEN's Game2048Env.render), as fixed text and
symbol slots: one slot per board row (the tile numbers), the valid-action menu and the score.

    Current 2048 Grid:
    Row 1: [0, 2, 0, 0]
    ...
    Row 4: [0, 0, 2, 4]

    Valid Actions: 0(Up), 1(Right), 3(Left).
    Goal: Merge same numbers to reach 2048.
    Current Score: 4
    What is your next move?
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np

from envs_jax.base import TextSlot

ACTION_NAMES = ("Up", "Right", "Down", "Left")  # the original's action_lookup order (jumanji's)
DIGITS = tuple("0123456789")
EMPTY = 10  # the empty symbol, after the digits
ROW_SYMBOLS = (*DIGITS, "", ", ")
COMMA = 11
SCORE_SYMBOLS = (*DIGITS, "")
# The menu: "i(Name)" per action id, ", " between, "None" when no move is valid.
MENU_SYMBOLS = (*(f"{i}({name})" for i, name in enumerate(ACTION_NAMES)), ", ", "None", "")
MENU_COMMA, MENU_NONE, MENU_EMPTY = 4, 5, 6


def tile_digits(board_size: int) -> int:
    """Digits of the largest tile a board can hold: 2 ** (cells + 1) (the tiles' sum, at most
    4 per spawn over `cells` of them, bounds the largest)."""
    return len(str(2 ** (board_size * board_size + 1)))


def score_digits(board_size: int) -> int:
    """Digits of a score bound: every tile of value 2**k was merged k - 1 times over."""
    top = board_size * board_size + 1
    return len(str(board_size * board_size * top * 2**top))


def _number(value: chex.Array, width: int) -> chex.Array:
    """[] int -> [width] ids into SCORE_SYMBOLS / ROW_SYMBOLS: decimal, leading positions empty."""
    powers = jnp.asarray([10**k for k in range(width - 1, -1, -1)], jnp.int32)
    shown = (value >= powers) | (powers == 1)
    return jnp.where(shown, (value // powers) % 10, EMPTY).astype(jnp.int32)


def row_ids(exponents: chex.Array, width: int) -> chex.Array:
    """One board row of jumanji exponents (0 = empty, k = tile 2**k) [n] -> its slot ids
    [n * width + n - 1]: each number in `width` digit positions, ", " between."""
    values = jnp.where(exponents > 0, jnp.left_shift(1, exponents), 0)
    numbers = jnp.stack([_number(v, width) for v in values])  # [n, width]
    commas = jnp.full((values.shape[0], 1), COMMA, jnp.int32)
    return jnp.concatenate([numbers, commas], axis=1).reshape(-1)[:-1]


def menu_ids(mask: chex.Array) -> chex.Array:
    """Valid-action mask [4] bool -> the menu slot's ids [7]: "0(Up), 3(Left)" or "None"."""
    later = jnp.flip(jnp.cumsum(jnp.flip(mask))) - mask  # valid actions after each one
    items = jnp.where(mask, jnp.arange(4), MENU_EMPTY)
    commas = jnp.where(mask[:3] & (later[:3] > 0), MENU_COMMA, MENU_EMPTY)
    ids = jnp.stack([items[0], commas[0], items[1], commas[1], items[2], commas[2], items[3]])
    return ids.at[0].set(jnp.where(jnp.any(mask), ids[0], MENU_NONE)).astype(jnp.int32)


def observation_parts(board_size: int) -> tuple[str | TextSlot, ...]:
    """The observation as text and slots ("row1".."rowN", "menu", "score")."""
    width, score_width = tile_digits(board_size), score_digits(board_size)
    row_width = board_size * width + board_size - 1
    def sample_row(rng: np.random.Generator) -> np.ndarray:
        return row_ids_np(rng.integers(0, board_size * board_size + 2, board_size), width)

    parts: list[str | TextSlot] = ["Current 2048 Grid:\n"]
    for r in range(board_size):
        parts += [f"Row {r + 1}: [", TextSlot(f"row{r + 1}", ROW_SYMBOLS, row_width, sample_row),
                  "]\n"]
    parts[-1] = "]\n\nValid Actions: "
    parts += [
        TextSlot("menu", MENU_SYMBOLS, 7, lambda rng: menu_ids_np(rng.random(4) < 0.6)),
        ".\nGoal: Merge same numbers to reach 2048.\nCurrent Score: ",
        TextSlot("score", SCORE_SYMBOLS, score_width,
                 lambda rng: number_np(int(10 ** rng.uniform(0, score_width)) - 1, score_width)),
        "\nWhat is your next move?",
    ]
    return tuple(parts)


# Host twins of the JAX functions, for the slots' samples (no tracing at codec build time).
def number_np(value: int, width: int) -> np.ndarray:
    text = str(value)
    return np.array([EMPTY] * (width - len(text)) + [int(c) for c in text], np.int32)


def row_ids_np(exponents: np.ndarray, width: int) -> np.ndarray:
    out: list[int] = []
    for e in exponents:
        out += [*number_np(2**int(e) if e else 0, width), COMMA]
    return np.array(out[:-1], np.int32)


def menu_ids_np(mask: np.ndarray) -> np.ndarray:
    valid = [i for i in range(4) if mask[i]]
    ids = [MENU_EMPTY] * 7
    for k, i in enumerate(valid):
        ids[2 * i] = i
        if k + 1 < len(valid):
            ids[2 * i + 1] = MENU_COMMA
    if not valid:
        ids[0] = MENU_NONE
    return np.array(ids, np.int32)
