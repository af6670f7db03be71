"""The checks every configuration value goes through (the dataclasses of starpo_jax.config, the
run config's schema, the SFT section), so that every refusal reads the same: one line, the key,
the bad value and what is valid.

    check_int("rollout.groups", 0)  # ValueError: rollout.groups = 0 is invalid; valid: an int >= 1
    require_valid("seed", -1, False, "an int >= 0")  # config.seed = -1 is invalid; valid: ...

`name` is the key as the user writes it ("rollout.groups"); require_valid names a key of the
run config as `config.<name>`, as run/schema.py reports them. Nothing here imports anything of
the package (the lowest rank: everything may use it), nor JAX.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn


def fail(name: str, value: Any, valid: str) -> NoReturn:
    """Raises ValueError("<name> = <value!r> is invalid; valid: <valid>")."""
    raise ValueError(f"{name} = {value!r} is invalid; valid: {valid}")


def require(name: str, value: Any, ok: bool, valid: str) -> None:
    """fail(name, value, valid) unless `ok`."""
    if not ok:
        fail(name, value, valid)


def require_valid(name: str, value: Any, ok: bool, valid: str) -> None:
    """Raises ValueError naming config.`name`, its value and what is `valid`, unless `ok`."""
    require(f"config.{name}", value, ok, valid)


def is_int(value: Any, low: int) -> bool:
    """An int (not a bool) >= low."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def check_int(name: str, value: Any, low: int = 1) -> None:
    require(name, value, is_int(value, low), f"an int >= {low}")


def check_number(name: str, value: Any, low: float, high: float, *, low_open: bool = False,
                 high_open: bool = False) -> None:
    """A finite number in [low, high] ( `(` / `)` for an open end)."""
    ok = is_number(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    require(name, value, ok, f"a number in {'(' if low_open else '['}{low}, {high}"
                             f"{')' if high_open else ']'}")


def check_bool(name: str, value: Any) -> None:
    require(name, value, isinstance(value, bool), "True or False")


def check_choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    require(name, value, value in options, f"one of {options}")
