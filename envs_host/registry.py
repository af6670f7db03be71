"""Name -> host environment registry, beside envs_jax's: `register("name", factory)`.

A namespace names a family of envs by prefix: after `register_namespace("textarena",
TextArenaEnv, "env_id")`, the name "textarena:Wordle-v0" means `TextArenaEnv(env_id="Wordle-v0")`
everywhere a registered name is accepted (it is registered the first time it is looked up).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from envs_host.base import HostEnv

_REGISTRY: dict[str, tuple[Callable[..., HostEnv], dict[str, Any]]] = {}
_NAMESPACES: dict[str, tuple[Callable[..., HostEnv], str, dict[str, Any]]] = {}


def register(name: str, factory: Callable[..., HostEnv], **defaults: Any) -> None:
    """Registers `factory(**defaults)` under `name`; later `make(name, **overrides)`. The
    factory must be importable by name (a class or module-level function) for process pools."""
    if name in _REGISTRY:
        raise ValueError(f"host environment {name!r} is already registered")
    if ":" in name and name.partition(":")[0] in _NAMESPACES:
        raise ValueError(f"host environment {name!r} is in namespace "
                         f"{name.partition(':')[0]!r}; register it under another name")
    _REGISTRY[name] = (factory, defaults)


def register_namespace(prefix: str, factory: Callable[..., HostEnv], key: str,
                       **defaults: Any) -> None:
    """Makes every name "<prefix>:<rest>" mean `factory(**defaults, **{key: rest})`."""
    if not prefix or ":" in prefix or prefix in _NAMESPACES:
        raise ValueError(f"namespace {prefix!r} is invalid or already registered; valid: a new "
                         "non-empty prefix without ':'")
    _NAMESPACES[prefix] = (factory, key, defaults)


def known(name: Any) -> bool:
    """Whether `name` is a host environment: registered, or "<prefix>:<rest>" of a namespace
    (then it is registered now)."""
    if not isinstance(name, str):
        return False
    if name in _REGISTRY:
        return True
    prefix, colon, rest = name.partition(":")
    if not (colon and rest and prefix in _NAMESPACES):
        return False
    fn, key, defaults = _NAMESPACES[prefix]
    _REGISTRY[name] = (fn, {**defaults, key: rest})
    return True


def names() -> tuple[str, ...]:
    """The registered host environment names, sorted (namespaced ones once looked up)."""
    return tuple(sorted(_REGISTRY))


def namespaces() -> tuple[str, ...]:
    """The namespaced name forms, e.g. ("openenv:<url>", "textarena:<env_id>")."""
    return tuple(sorted(f"{prefix}:<{key}>" for prefix, (_, key, _) in _NAMESPACES.items()))


def factory(name: str, **overrides: Any) -> Callable[[], HostEnv]:
    """A no-argument constructor of `name` (what a pool calls to build or replace an instance).
    Raises ValueError for an unknown name, listing the known ones."""
    if not known(name):
        raise ValueError(f"unknown host environment {name!r}; registered: "
                         f"{', '.join(names() + namespaces())}")
    fn, defaults = _REGISTRY[name]
    return functools.partial(fn, **{**defaults, **overrides})


def make(name: str, **overrides: Any) -> HostEnv:
    """One instance of a registered host environment, its defaults updated by `overrides`."""
    return factory(name, **overrides)()
