"""2048 (registered as `game_2048`: 4x4, the original's rules) on jumanji's Game2048."""

from envs_jax.catalog import BUILTIN
from envs_jax.game_2048.env import Game2048
from envs_jax.registry import register

register("game_2048", Game2048, settings=BUILTIN["game_2048"], size=4)

__all__ = ["Game2048"]
