"""Pure-JAX text games (Bandit, Sokoban, FrozenLake, Countdown, Sudoku, 2048, the 2x2 Rubik's
cube, Maze) on jumanji's Environment API.

`import envs_jax` is light (no JAX, no jumanji): the registry and the games load on the first
use of `TextEnv`, `make`, `names`, `register` or `settings`, so that a run config can be checked
first (envs_jax.catalog holds the built-in names and their settings).
"""

import importlib

# First: jumanji's import must not touch a notebook's matplotlib backend.
from envs_jax import _jupyter  # noqa: F401
from envs_jax.catalog import EnvSettings

_LAZY = ("TextEnv", "make", "names", "register", "settings")
_GAMES = ("bandit", "countdown", "frozen_lake", "sokoban", "sudoku", "game_2048", "rubiks_cube",
          "maze")


def __getattr__(name: str):  # PEP 562: the heavy part on first use
    if name not in (*_LAZY, *_GAMES, "base", "registry"):
        raise AttributeError(f"module 'envs_jax' has no attribute {name!r}")
    registry = importlib.import_module("envs_jax.registry")  # sets envs_jax.registry, .base
    for game in _GAMES:  # importing a game's package registers it
        importlib.import_module(f"envs_jax.{game}")
    globals().update(TextEnv=importlib.import_module("envs_jax.base").TextEnv,
                     make=registry.make, names=registry.names, register=registry.register,
                     settings=registry.settings)
    return globals()[name]


__all__ = ["EnvSettings", *_LAZY]
