"""Pure-JAX text games (Bandit, Sokoban, FrozenLake) on jumanji's Environment API."""

# First: jumanji's import must not touch a notebook's matplotlib backend.
from envs_jax import _jupyter  # noqa: F401
from envs_jax.base import TextEnv
from envs_jax.registry import make, names, register

# Importing a game's package registers it (after the registry import above).
import envs_jax.bandit  # noqa: F401
import envs_jax.frozen_lake  # noqa: F401
import envs_jax.sokoban  # noqa: F401

__all__ = ["TextEnv", "make", "names", "register"]
