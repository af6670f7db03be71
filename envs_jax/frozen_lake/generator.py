"""Random FrozenLake maps as the original draws them, generated inside JAX.

The original (RAGEN's `generate_random_map`) draws every tile frozen with probability p, puts
start and goal on two distinct uniformly random cells, and redraws the whole map until a path
joins them. Here the redraw is a bounded `lax.while_loop`; if every try fails (only plausible for
small p) an L-shaped corridor from start to goal is thawed so a path is still guaranteed.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from envs_jax.frozen_lake.types import FROZEN, GOAL, HOLE, State


def reachable(passable: chex.Array, start: chex.Array) -> chex.Array:
    """Cells reachable from `start` by 4-neighbour moves over passable cells.

    passable: [S, S] bool; start: [2] int32 (row, col). Returns [S, S] bool.
    A fixed S*S rounds of dilation: no shortest path is longer than the number of cells.
    """
    seed = jnp.zeros_like(passable).at[start[0], start[1]].set(True)

    def grow(_: int, reach: chex.Array) -> chex.Array:
        pad = jnp.pad(reach, 1)
        near = reach | pad[:-2, 1:-1] | pad[2:, 1:-1] | pad[1:-1, :-2] | pad[1:-1, 2:]
        return near & passable

    return jax.lax.fori_loop(0, passable.size, grow, seed)


def has_path(tiles: chex.Array, start: chex.Array) -> chex.Array:
    """Whether the goal of `tiles` ([S, S] int32) is reachable from `start` ([2] int32). [] bool."""
    return jnp.any(reachable(tiles != HOLE, start) & (tiles == GOAL))


class RandomMapGenerator:
    """`generator(key) -> State`: a random size x size map with a start-to-goal path."""

    def __init__(self, size: int, p: float, max_tries: int) -> None:
        self.size = size
        self.p = p
        self.max_tries = max_tries

    def draw(self, key: chex.PRNGKey) -> tuple[chex.Array, chex.Array]:
        """One unchecked draw: tiles [S, S] int32 and start [2] int32."""
        n = self.size * self.size
        # One uniform draw serves tiles, start and goal: each random call adds a PRNG hash to
        # the compiled program, and compile time dominates small batches.
        u = jax.random.uniform(key, (n + 2,))
        start = jnp.minimum((u[n] * n).astype(jnp.int32), n - 1)
        # Uniform over the other n - 1 cells, as the original's redraw-until-distinct.
        goal = jnp.minimum((u[n + 1] * (n - 1)).astype(jnp.int32), n - 2)
        goal = goal + (goal >= start)
        tiles = jnp.where(u[:n] >= self.p, HOLE, FROZEN).astype(jnp.int32)
        tiles = tiles.at[start].set(FROZEN).at[goal].set(GOAL).reshape(self.size, self.size)
        return tiles, jnp.stack(jnp.divmod(start, self.size)).astype(jnp.int32)

    def __call__(self, key: chex.PRNGKey) -> State:
        map_key, state_key = jax.random.split(key)

        def attempt(carry: tuple) -> tuple:
            i = carry[0]
            tiles, start = self.draw(jax.random.fold_in(map_key, i))
            return i + 1, tiles, start, has_path(tiles, start)

        empty = jnp.zeros((self.size, self.size), jnp.int32)
        first = (jnp.int32(0), empty, jnp.zeros(2, jnp.int32), jnp.bool_(False))
        _, tiles, start, found = jax.lax.while_loop(
            lambda c: ~c[3] & (c[0] < self.max_tries), attempt, first
        )
        tiles = jnp.where(found, tiles, thaw_corridor(tiles, start))
        return State(
            tiles=tiles,
            start=start,
            player=start,
            step_count=jnp.int32(0),
            key=state_key,
        )


def thaw_corridor(tiles: chex.Array, start: chex.Array) -> chex.Array:
    """Turns the holes on an L-shaped path start -> goal into ice: [S, S] int32 -> [S, S] int32.

    The path runs along the start's column to the goal's row, then along that row to the goal.
    """
    size = tiles.shape[0]
    goal = jnp.stack(jnp.divmod(jnp.argmax(tiles.reshape(-1) == GOAL), size))
    rows = jnp.arange(size)[:, None]
    cols = jnp.arange(size)[None, :]

    def between(x: chex.Array, a: chex.Array, b: chex.Array) -> chex.Array:
        return (x >= jnp.minimum(a, b)) & (x <= jnp.maximum(a, b))

    down = (cols == start[1]) & between(rows, start[0], goal[0])
    across = (rows == goal[0]) & between(cols, start[1], goal[1])
    return jnp.where((down | across) & (tiles == HOLE), FROZEN, tiles)
