"""Simple Sokoban deadlocks: boxes that can never reach a target, whatever the player does.

Two patterns, both certain (a level showing one is unsolvable) and cheap in JAX:
- corner: a box off target with a wall (or the room's edge) on a vertical side and on a
  horizontal side: it can be pushed in neither axis;
- dead wall: a box against a wall that runs along its whole free stretch of cells (the run of
  non-wall cells of its row or column), with no target in that stretch: the box can only
  slide along the stretch and never leave the wall.
Boxes blocking each other (freeze deadlocks) are not detected: the check errs towards "alive".
"""

from __future__ import annotations

import chex
import jax.numpy as jnp


def _shifted(walls: chex.Array, d_row: int, d_col: int) -> chex.Array:
    """walls[r + d_row, c + d_col] at each cell, True off the grid: bool [H, W]."""
    padded = jnp.pad(walls, 1, constant_values=True)
    h, w = walls.shape
    return padded[1 + d_row:1 + d_row + h, 1 + d_col:1 + d_col + w]


def _dead_rows(walls: chex.Array, targets: chex.Array, backed: chex.Array) -> chex.Array:
    """Cells of row stretches (non-wall runs) that are backed by a wall all along and hold no
    target: bool [H, W]. walls, targets, backed: bool [H, W]."""
    stretch = jnp.cumsum(walls, axis=1)  # cells of one stretch share the count of walls before
    same = (stretch[:, :, None] == stretch[:, None, :]) & ~walls[:, None, :]  # [H, W, W]
    all_backed = jnp.all(~same | backed[:, None, :], axis=2)
    has_target = jnp.any(same & targets[:, None, :], axis=2)
    return ~walls & all_backed & ~has_target


def dead_cells(walls: chex.Array, targets: chex.Array) -> chex.Array:
    """Cells where a box off target can never reach one: bool [H, W] (walls, targets [H, W])."""
    up, down = _shifted(walls, -1, 0), _shifted(walls, 1, 0)
    left, right = _shifted(walls, 0, -1), _shifted(walls, 0, 1)
    corner = (up | down) & (left | right)
    lines = _dead_rows(walls, targets, up) | _dead_rows(walls, targets, down)
    lines |= (_dead_rows(walls.T, targets.T, left.T) | _dead_rows(walls.T, targets.T, right.T)).T
    return ~walls & ~targets & (corner | lines)


def has_deadlock(walls: chex.Array, targets: chex.Array, boxes: chex.Array) -> chex.Array:
    """bool []: some box (bool [H, W] like walls and targets) stands on a dead cell."""
    return jnp.any(boxes & dead_cells(walls, targets))
