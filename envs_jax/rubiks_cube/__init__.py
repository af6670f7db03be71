"""The 2x2 Rubik's cube (registered as `rubiks_cube_2x2`: 5 scrambling turns, 20 steps, the
original's moves) on jumanji's RubiksCube."""

from envs_jax.catalog import BUILTIN
from envs_jax.registry import register
from envs_jax.rubiks_cube.env import RubiksCube2x2

register("rubiks_cube_2x2", RubiksCube2x2, settings=BUILTIN["rubiks_cube_2x2"],
         scramble_depth=5, max_steps=20)

__all__ = ["RubiksCube2x2"]
