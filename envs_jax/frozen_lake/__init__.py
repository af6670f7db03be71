"""FrozenLake (registered as `frozen_lake`: 4x4, p=0.8, a random map each reset, slippery with
gymnasium's default success_rate 1/3; `coord_frozen_lake`: RAGEN's CoordFrozenLake)."""

from envs_jax.frozen_lake.env import COORD_INSTRUCTIONS, FrozenLake
from envs_jax.frozen_lake.types import Observation, State
from envs_jax.catalog import BUILTIN
from envs_jax.registry import register

register("frozen_lake", FrozenLake, settings=BUILTIN["frozen_lake"], size=4, p=0.8, slippery=True)
# RAGEN's CoordFrozenLake: its FrozenLakeEnvConfig defaults (size 4, p 0.9, slippery) with
# success_rate 0.8 and the grid and coordinate lines (envs_jax.coords).
register("coord_frozen_lake", FrozenLake, settings=BUILTIN["coord_frozen_lake"], size=4, p=0.9,
         slippery=True, success_rate=0.8, observation_format="grid_coord",
         instructions=COORD_INSTRUCTIONS)

__all__ = ["FrozenLake", "Observation", "State"]
