"""FrozenLake (registered as `frozen_lake`: 4x4, p=0.8, a random map each reset, slippery)."""

from envs_jax.frozen_lake.env import FrozenLake
from envs_jax.frozen_lake.types import Observation, State
from envs_jax.catalog import BUILTIN
from envs_jax.registry import register

register("frozen_lake", FrozenLake, settings=BUILTIN["frozen_lake"], size=4, p=0.8, slippery=True)

__all__ = ["FrozenLake", "Observation", "State"]
