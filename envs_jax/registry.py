"""Name -> environment registry: `make("sokoban", dim_room=(7, 7))`, `settings("bandit")`."""

from __future__ import annotations

from typing import Any, Callable

from envs_jax.base import TextEnv
from envs_jax.catalog import EnvSettings

_REGISTRY: dict[str, tuple[Callable[..., TextEnv], dict[str, Any], EnvSettings]] = {}


def register(
    name: str,
    factory: Callable[..., TextEnv],
    *,
    settings: EnvSettings | None = None,
    **defaults: Any,
) -> None:
    """Registers `factory(**defaults)` under `name`; later `make(name, **overrides)`.

    settings: the name's agent-side defaults (EnvSettings); None takes the factory's
    `settings` attribute (a TextEnv class's own), else EnvSettings().
    """
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    if settings is None:
        settings = getattr(factory, "settings", None) or EnvSettings()
    if not isinstance(settings, EnvSettings):
        raise ValueError(f"settings of {name!r} must be an EnvSettings; got {settings!r}")
    _REGISTRY[name] = (factory, defaults, settings)


def names() -> tuple[str, ...]:
    """The registered environment names, sorted."""
    return tuple(sorted(_REGISTRY))


def _entry(name: str) -> tuple[Callable[..., TextEnv], dict[str, Any], EnvSettings]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(names())}")
    return _REGISTRY[name]


def settings(name: str) -> EnvSettings:
    """The agent-side defaults of a registered env (nothing is built)."""
    return _entry(name)[2]


def make(name: str, **overrides: Any) -> TextEnv:
    """Builds a registered environment with its defaults, updated by `overrides`; its
    `settings` are the name's.

    Raises ValueError for an unknown name (listing the known ones); the env's own constructor
    rejects bad keyword arguments and bad values.
    """
    factory, defaults, env_settings = _entry(name)
    env = factory(**{**defaults, **overrides})
    env.settings = env_settings
    return env
