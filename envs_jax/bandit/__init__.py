"""Bandit, registered as `bandit` (Phoenix low / Dragon high), `bandit_rev` (names swapped) and
`bandit_test` (Trader low / Librarian high)."""

from envs_jax.bandit.env import Bandit
from envs_jax.bandit.types import HIGH, LOW, Observation, State
from envs_jax.catalog import BUILTIN
from envs_jax.registry import register

register("bandit", Bandit, settings=BUILTIN["bandit"], low_name="Phoenix", high_name="Dragon")
register("bandit_rev", Bandit, settings=BUILTIN["bandit_rev"], low_name="Dragon",
         high_name="Phoenix")
register("bandit_test", Bandit, settings=BUILTIN["bandit_test"], low_name="Trader",
         high_name="Librarian")

__all__ = ["HIGH", "LOW", "Bandit", "Observation", "State"]
