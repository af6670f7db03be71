"""Name -> host environment registry, beside envs_jax's: `register("name", factory)`."""

from __future__ import annotations

import functools
from typing import Any, Callable

from envs_host.base import HostEnv

_REGISTRY: dict[str, tuple[Callable[..., HostEnv], dict[str, Any]]] = {}


def register(name: str, factory: Callable[..., HostEnv], **defaults: Any) -> None:
    """Registers `factory(**defaults)` under `name`; later `make(name, **overrides)`. The
    factory must be importable by name (a class or module-level function) for process pools."""
    if name in _REGISTRY:
        raise ValueError(f"host environment {name!r} is already registered")
    _REGISTRY[name] = (factory, defaults)


def names() -> tuple[str, ...]:
    """The registered host environment names, sorted."""
    return tuple(sorted(_REGISTRY))


def factory(name: str, **overrides: Any) -> Callable[[], HostEnv]:
    """A no-argument constructor of `name` (what a pool calls to build or replace an instance).
    Raises ValueError for an unknown name, listing the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown host environment {name!r}; registered: {', '.join(names())}")
    fn, defaults = _REGISTRY[name]
    return functools.partial(fn, **{**defaults, **overrides})


def make(name: str, **overrides: Any) -> HostEnv:
    """One instance of a registered host environment, its defaults updated by `overrides`."""
    return factory(name, **overrides)()
