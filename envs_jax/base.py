"""The contract every text game in envs_jax follows, on top of jumanji's Environment.

JAX side: `reset`, `step` and `render_symbols` are pure and jit/vmap-able.
Host side: `render_text`, `reset_from_text`, `instructions`, `action_names`.

The link between the two is the symbol table: `render_symbols(state)` returns an int32 [R, C]
array of ids into `symbol_strings`, and the text of a state is, by definition,

    "\n".join("".join(symbol_strings[i] for i in row) for row in render_symbols(state))

so the text layer can turn the ids into tokens inside jit with tables built once on the host.
"""

from __future__ import annotations

import abc
from functools import cached_property
from typing import Any, Generic, TypeVar

import chex
import jax
import numpy as np
from jumanji import specs
from jumanji.env import Environment
from jumanji.types import TimeStep

State = TypeVar("State")
Observation = TypeVar("Observation")


class TextEnv(Environment[State, specs.DiscreteArray, Observation], Generic[State, Observation]):
    """A jumanji Environment that also speaks text (see module docstring)."""

    #: The action words in the original's order; `step` takes an int32 index into this tuple.
    action_names: tuple[str, ...]
    #: Symbol id -> the text it renders as.
    symbol_strings: tuple[str, ...]
    #: Rules, symbol legend and action names, for the prompt.
    instructions: str
    #: Steps after which an episode is truncated.
    max_steps: int

    @abc.abstractmethod
    def render_symbols(self, state: State) -> chex.Array:
        """Symbol ids of the state's text: int32 [R, C] (pure JAX, jit/vmap-able)."""

    def render_text(self, state: State) -> str:
        """The state as the original renders it (host side, one unbatched state)."""
        ids = np.asarray(jax.device_get(self.render_symbols(state)))
        if ids.ndim != 2:
            raise ValueError(f"render_text takes one unbatched state; got symbols of shape {ids.shape}")
        return "\n".join("".join(self.symbol_strings[i] for i in row) for row in ids)

    def symbol_grids(self) -> np.ndarray | None:
        """Every grid `render_symbols` can return, int32 [K, R, C], for envs with few of them
        (the text layer then sizes prompts by the longest instead of by the longest symbol in
        every cell); None (the default) when any grid of the symbols may occur."""
        return None

    def reset_from_text(self, text: str, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """Builds a state from a grid in `render_text`'s format (custom levels, tests)."""
        raise NotImplementedError(f"{type(self).__name__} has no text levels")

    @cached_property
    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(len(self.action_names), dtype=np.int32, name="action")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._describe()})"

    def _describe(self) -> str:
        return ""


def symbol_text(symbol_strings: tuple[str, ...], ids: Any) -> str:
    """Text of an int [R, C] id array, per the module's rule (shared by envs and tests)."""
    return "\n".join("".join(symbol_strings[int(i)] for i in row) for row in np.asarray(ids))
