"""Pure-JAX text games (Bandit, Sokoban, FrozenLake, Countdown, Sudoku) on jumanji's
Environment API."""

# First: jumanji's import must not touch a notebook's matplotlib backend.
from envs_jax import _jupyter  # noqa: F401
from envs_jax.base import EnvSettings, TextEnv
from envs_jax.registry import make, names, register, settings

# Importing a game's package registers it (after the registry import above).
import envs_jax.bandit  # noqa: F401
import envs_jax.countdown  # noqa: F401
import envs_jax.frozen_lake  # noqa: F401
import envs_jax.sokoban  # noqa: F401
import envs_jax.sudoku  # noqa: F401

__all__ = ["EnvSettings", "TextEnv", "make", "names", "register", "settings"]
