"""Sudoku puzzles with a unique solution, drawn in JAX.

1. A solved grid: the standard pattern grid (box b, size n = b*b) shuffled by moves that keep
   it valid: relabel the digits, permute the rows inside each band and the bands, the columns
   inside each stack and the stacks, and transpose with probability 1/2.
2. Blanks: the cells are visited in a random order; a cell is blanked only if the puzzle stays
   solvable by naked singles alone (repeatedly filling every empty cell that has exactly one
   candidate), which implies a unique solution, until `blanks` cells are blank. The original
   blanks 40% (easy) or 50% (medium) of the cells at random without checking uniqueness; here
   a puzzle may end with fewer blanks when no further cell can go (rare at these rates).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _permutation_in_groups(key: jax.Array, box: int) -> jax.Array:
    """[n] a permutation of 0..n-1 that permutes the groups of `box` and inside each."""
    outer_key, *inner_keys = jax.random.split(key, box + 1)
    groups = jax.random.permutation(outer_key, box)
    inner = jnp.stack([jax.random.permutation(k, box) for k in inner_keys])
    return (groups[:, None] * box + inner).reshape(-1)


def solved_grid(key: jax.Array, box: int) -> jax.Array:
    """[n, n] int32 (digits 1..n): a random valid complete grid."""
    n = box * box
    r, c = jnp.meshgrid(jnp.arange(n), jnp.arange(n), indexing="ij")
    pattern = (box * (r % box) + r // box + c) % n  # 0-based digits
    digit_key, row_key, col_key, flip_key = jax.random.split(key, 4)
    relabel = jax.random.permutation(digit_key, n)
    grid = relabel[pattern]
    grid = grid[_permutation_in_groups(row_key, box)][:, _permutation_in_groups(col_key, box)]
    grid = jnp.where(jax.random.bernoulli(flip_key), grid.T, grid)
    return (grid + 1).astype(jnp.int32)


def candidates(grid: jax.Array, box: int) -> jax.Array:
    """[n, n, n] bool: digit d+1 fits cell (r, c) (no equal digit in its row, column, box)."""
    n = box * box
    onehot = jax.nn.one_hot(grid - 1, n, dtype=jnp.int32)  # zeros for empty cells
    rows = onehot.sum(axis=1)  # [n, n digits]
    cols = onehot.sum(axis=0)
    boxes = onehot.reshape(box, box, box, box, n).sum(axis=(1, 3))  # [box, box, n]
    used = rows[:, None, :] + cols[None, :, :] + jnp.repeat(
        jnp.repeat(boxes, box, axis=0), box, axis=1)
    return used == 0


def solvable_by_singles(grid: jax.Array, box: int, check: jax.Array = True) -> jax.Array:
    """[] bool: naked singles alone fill `grid` (0 = empty) completely. check=False skips the
    work (the answer is then meaningless): under vmap both sides of a cond would run."""

    def body(carry):
        grid, _ = carry
        cand = candidates(grid, box)
        single = (grid == 0) & (cand.sum(-1) == 1)
        filled = jnp.where(single, jnp.argmax(cand, -1) + 1, grid)
        return filled, jnp.any(single)

    grid, _ = jax.lax.while_loop(lambda c: c[1], body, (grid, jnp.asarray(check, bool)))
    return jnp.all(grid > 0)


def generate(key: jax.Array, box: int, blanks: int) -> tuple[jax.Array, jax.Array]:
    """(puzzle [n, n] int32 with 0 for blanks, solution [n, n] int32)."""
    n = box * box
    grid_key, order_key = jax.random.split(key)
    solution = solved_grid(grid_key, box)
    order = jax.random.permutation(order_key, n * n)

    def visit(puzzle, cell):
        r, c = cell // n, cell % n
        trial = puzzle.at[r, c].set(0)
        room = jnp.sum(puzzle == 0) < blanks
        keep = room & solvable_by_singles(trial, box, room)
        return jnp.where(keep, trial, puzzle), None

    puzzle, _ = jax.lax.scan(visit, solution, order)
    return puzzle, solution
