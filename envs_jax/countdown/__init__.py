"""Countdown, registered as `countdown` (3-4 numbers, the original's) and `countdown_5` (five
numbers: out of distribution)."""

from envs_jax.countdown.env import Countdown, State
from envs_jax.countdown.expression import Expression, parse_expression
from envs_jax.base import EnvSettings
from envs_jax.registry import register

# The original's Countdown (config/_4_countdown.yaml, envs.yaml): one turn, one action.
_ONE_SHOT = EnvSettings(max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
register("countdown", Countdown, settings=_ONE_SHOT, min_numbers=3, max_numbers=4)
register("countdown_5", Countdown, settings=_ONE_SHOT, min_numbers=5, max_numbers=5)

__all__ = ["Countdown", "Expression", "State", "parse_expression"]
