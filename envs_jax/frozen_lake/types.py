"""FrozenLake state, observation and the tile/symbol/action constants they use."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax.numpy as jnp

# Tile codes of the map (the ground under the player, independent of where the player is).
FROZEN, HOLE, GOAL = 0, 1, 2

# Symbol ids, in the original's GRID_LOOKUP order: player, frozen, hole, goal, player in hole,
# player on goal. The start cell has no symbol of its own: the original renders it as frozen.
PLAYER, FROZEN_SYM, HOLE_SYM, GOAL_SYM, PLAYER_IN_HOLE, PLAYER_ON_GOAL = range(6)
SYMBOL_STRINGS = ("P", "_", "O", "G", "X", "√")

# Action ids as gymnasium FrozenLake-v1 (and the original's order): Left, Down, Right, Up.
ACTION_NAMES = ("Left", "Down", "Right", "Up")
# (row, col) displacement of each action id.
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))


@chex.dataclass(frozen=True)
class State:
    """One FrozenLake episode.

    tiles:      [S, S] int32, FROZEN / HOLE / GOAL (the start cell is FROZEN).
    start:      [2] int32, (row, col) where the episode began.
    player:     [2] int32, (row, col) of the player.
    step_count: [] int32, steps taken so far.
    key:        PRNG key for the slippery transitions (and for auto-reset wrappers).
    """

    tiles: chex.Array
    start: chex.Array
    player: chex.Array
    step_count: chex.Array
    key: chex.PRNGKey


class Observation(NamedTuple):
    """What the agent sees: the symbol grid ([S, S] int32 ids into SYMBOL_STRINGS), step count."""

    grid: chex.Array
    step_count: chex.Array


def symbol_grid(tiles: chex.Array, player: chex.Array) -> chex.Array:
    """Symbol ids of a map with the player on it.

    tiles: [S, S] int32 tile codes; player: [2] int32 (row, col). Returns [S, S] int32.
    """
    ground = jnp.asarray((FROZEN_SYM, HOLE_SYM, GOAL_SYM), jnp.int32)[tiles]
    with_player = jnp.asarray((PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL), jnp.int32)
    under = tiles[player[0], player[1]]
    return ground.at[player[0], player[1]].set(with_player[under])
