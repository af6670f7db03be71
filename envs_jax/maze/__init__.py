"""A 5x5 maze (registered as `maze`) on jumanji's Maze: not in the original."""

from envs_jax.catalog import BUILTIN
from envs_jax.maze.env import Maze
from envs_jax.registry import register

register("maze", Maze, settings=BUILTIN["maze"], size=5)

__all__ = ["Maze"]
