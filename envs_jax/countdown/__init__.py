"""Countdown, registered as `countdown` (3-4 numbers, the original's) and `countdown_5` (five
numbers: out of distribution)."""

from envs_jax.countdown.env import Countdown, State
from envs_jax.countdown.expression import Expression, parse_expression
from envs_jax.catalog import BUILTIN
from envs_jax.registry import register

register("countdown", Countdown, settings=BUILTIN["countdown"], min_numbers=3, max_numbers=4)
register("countdown_5", Countdown, settings=BUILTIN["countdown_5"], min_numbers=5, max_numbers=5)

__all__ = ["Countdown", "Expression", "State", "parse_expression"]
