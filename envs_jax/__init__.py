"""Pure-JAX text games (Bandit, Sokoban, FrozenLake) on jumanji's Environment API."""

from envs_jax.base import TextEnv
from envs_jax.registry import make, names, register

__all__ = ["TextEnv", "make", "names", "register"]
