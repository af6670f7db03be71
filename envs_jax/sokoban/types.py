"""Sokoban's state and observation."""

from __future__ import annotations

from typing import NamedTuple

import chex


@chex.dataclass(frozen=True)
class State:
    """One Sokoban episode.

    key: PRNGKey, the source of the next reset's randomness (jumanji's auto-reset uses it).
    walls, targets, boxes: bool [H, W]; walls and targets never change within an episode.
    player: int32 [2], the player's (row, col).
    step_count: int32 [], actions taken so far.
    success: bool [], every box is on a target.
    """

    key: chex.PRNGKey
    walls: chex.Array
    targets: chex.Array
    boxes: chex.Array
    player: chex.Array
    step_count: chex.Array
    success: chex.Array


class Observation(NamedTuple):
    """grid: int32 [H, W] symbol ids (see constants); step_count: int32 []."""

    grid: chex.Array
    step_count: chex.Array
