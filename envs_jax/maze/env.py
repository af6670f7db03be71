"""A maze (jumanji's Maze) as a grid text game: a game the original lacks, in one short file on
the jumanji adapter (envs_jax.jumanji_text)."""

from __future__ import annotations

import jax.numpy as jnp
from jumanji.environments import Maze as JumanjiMaze
from jumanji.environments.routing.maze.generator import RandomGenerator

from envs_jax.catalog import BUILTIN
from envs_jax.jumanji_text import JumanjiTextEnv

SYMBOLS = ("#", "_", "P", "G")  # wall, empty, player, goal
INSTRUCTIONS = (
    "You are solving a maze. Walk from your position to the goal; walls block the way. "
    "Example answer format: <answer>Up || Right || Right</answer>"
)


def symbols(state):
    """int32 [rows, cols]: walls, then the goal, then the player (ids into SYMBOLS)."""
    grid = jnp.where(state.walls, 0, 1)
    grid = grid.at[state.target_position.row, state.target_position.col].set(3)
    return grid.at[state.agent_position.row, state.agent_position.col].set(2)


class Maze(JumanjiTextEnv):
    """Reach the goal of a random `size` x `size` maze (jumanji's recursive division: every open
    cell is reachable). Actions Up / Right / Down / Left (jumanji's order; into a wall: no
    move). Reward 1 on reaching the goal (success), which ends the episode, as does
    `max_steps` steps."""

    settings = BUILTIN["maze"]

    def __init__(self, size: int = 5, max_steps: int = 100) -> None:
        """size >= 3 (odd sizes give the classic corridors); max_steps >= 1."""
        for label, value, least in (("size", size, 3), ("max_steps", max_steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label} must be an int >= {least}; got {value!r}")
        self.size = size
        super().__init__(
            JumanjiMaze(RandomGenerator(size, size), time_limit=max_steps),
            action_names=("Up", "Right", "Down", "Left"),
            render=symbols,
            symbol_strings=SYMBOLS,
            symbol_legend=tuple(zip(SYMBOLS, ("wall", "empty", "player", "goal"))),
            success=lambda s, a, s2, ts: ts.reward > 0,
            instructions=INSTRUCTIONS,
        )

    def _describe(self) -> str:
        return f"size={self.size}, max_steps={self.max_steps}"
