"""Name -> environment registry: `make("sokoban", dim_room=(7, 7))`."""

from __future__ import annotations

from typing import Any, Callable

from envs_jax.base import TextEnv

_REGISTRY: dict[str, tuple[Callable[..., TextEnv], dict[str, Any]]] = {}


def register(name: str, factory: Callable[..., TextEnv], **defaults: Any) -> None:
    """Registers `factory(**defaults)` under `name`; later `make(name, **overrides)`."""
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = (factory, defaults)


def names() -> tuple[str, ...]:
    """The registered environment names, sorted."""
    return tuple(sorted(_REGISTRY))


def make(name: str, **overrides: Any) -> TextEnv:
    """Builds a registered environment with its defaults, updated by `overrides`.

    Raises ValueError for an unknown name (listing the known ones); the env's own constructor
    rejects bad keyword arguments and bad values.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(names())}")
    factory, defaults = _REGISTRY[name]
    return factory(**{**defaults, **overrides})
