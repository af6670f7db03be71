"""The contract every text game in envs_jax follows, on top of jumanji's Environment.

Two kinds: grid games (`TextEnv`: a symbol grid and a list of action words, the common case)
and free-text games (`FreeTextEnv`, below: an observation of fixed text and symbol slots, and
answers the env parses itself).

JAX side: `reset`, `step` and `render_symbols` are pure and jit/vmap-able.
Host side: `render_text`, `reset_from_text`, and what the prompt says about the game
(`instructions`, `symbol_legend`, `action_names` when `lists_actions`); `settings` holds the
agent-side defaults the original keeps in each env's config (turns, action budgets, the
announced reply length).

The link between the two is the symbol table: `render_symbols(state)` returns an int32 [R, C]
array of ids into `symbol_strings`, and the text of a state is, by definition,

    "\n".join("".join(symbol_strings[i] for i in row) for row in render_symbols(state))

so the text layer can turn the ids into tokens inside jit with tables built once on the host.

A grid game may instead show fixed text and slots (`observation_parts`, as a free-text game
does) while keeping its action words: Sokoban and FrozenLake in RAGEN's coordinate formats
(envs_jax.coords). `render_symbols` then returns {slot name: [width] int32}.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from functools import cached_property
from typing import Any, Generic, TypeVar

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.env import Environment
from jumanji.types import TimeStep

from envs_jax.catalog import EnvSettings  # noqa: F401 (defined without JAX)

State = TypeVar("State")
Observation = TypeVar("Observation")


class TextEnv(Environment[State, specs.DiscreteArray, Observation], Generic[State, Observation]):
    """A jumanji Environment that also speaks text (see module docstring)."""

    #: The action words in the original's order; `step` takes an int32 index into this tuple.
    action_names: tuple[str, ...]
    #: Symbol id -> the text it renders as.
    symbol_strings: tuple[str, ...]
    #: The original's env_instruction: the prompt's first text (may be empty).
    instructions: str
    #: (symbol, meaning) pairs the prompt explains after the instructions; () for none.
    symbol_legend: tuple[tuple[str, str], ...] = ()
    #: Whether the prompt lists `action_names` and the action budget (the original does when the
    #: env's config has an action lookup; the bandit's has none, its state names the arms).
    lists_actions: bool = True
    #: Agent-side defaults (see EnvSettings); the registry may set others per registered name.
    settings: EnvSettings = EnvSettings()
    #: Steps after which an episode is truncated.
    max_steps: int
    #: None: the symbol grid is the observation. Otherwise the observation's text as fixed
    #: strings and `TextSlot`s (no two slots adjacent), as for a FreeTextEnv, and
    #: `render_symbols` returns {slot name: [width] int32}; the actions stay `action_names`.
    observation_parts: tuple[str | TextSlot, ...] | None = None

    @abc.abstractmethod
    def render_symbols(self, state: State) -> chex.Array:
        """Symbol ids of the state's text: int32 [R, C], or {slot name: [width] int32} when
        `observation_parts` is set (pure JAX, jit/vmap-able)."""

    @property
    def slots(self) -> tuple[TextSlot, ...]:
        """The observation's slots (none for a symbol grid)."""
        return tuple(p for p in self.observation_parts or () if isinstance(p, TextSlot))

    def render_text(self, state: State) -> str:
        """The state as the original renders it (host side, one unbatched state)."""
        if self.observation_parts is not None:
            return slot_text(self.observation_parts, jax.device_get(self.render_symbols(state)))
        ids = np.asarray(jax.device_get(self.render_symbols(state)))
        if ids.ndim != 2:
            raise ValueError("render_text takes one unbatched state; got symbols of shape "
                             f"{ids.shape}")
        return "\n".join("".join(self.symbol_strings[i] for i in row) for row in ids)

    def dead_end(self, state: State) -> chex.Array:
        """bool []: the episode can no longer succeed, whatever the agent does (the failure
        classifier's dead end, starpo_jax.algo.failures). Pure JAX. The default, False, is right for
        games without unrecoverable states; a game that has them overrides it."""
        return jnp.bool_(False)

    def fingerprint(self, state: State) -> chex.Array:
        """uint32 []: a hash of what the agent observes of the state (the failure classifier's
        loop detection: a row whose state hashes as an earlier one's returned to it). Pure JAX.
        The default hashes `render_symbols`, so hidden state (step counts, RNG keys) is
        ignored."""
        return symbols_hash(self.render_symbols(state))

    def symbol_grids(self) -> np.ndarray | None:
        """Every grid `render_symbols` can return, int32 [K, R, C], for envs with few of them
        (the text layer then encodes a state by looking it up among their host encodings, and
        a grid missing here would render as the first); None (the default) when any grid of
        the symbols may occur."""
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


def symbols_hash(symbols: Any) -> chex.Array:
    """uint32 [] hash of a pytree of int arrays (one state's `render_symbols`; pure JAX).

    sum_i (x_i + 1) * w_i mod 2**32 over the flattened ids, with fixed random odd weights w_i:
    two states that differ in any ids collide with probability about 2**-32.
    """
    flat = jnp.concatenate([jnp.ravel(leaf).astype(jnp.uint32)
                            for leaf in jax.tree.leaves(symbols)])
    weights = np.random.default_rng(0x5EED).integers(0, 2**32, flat.shape[0], np.uint32) | 1
    return jnp.sum((flat + 1) * jnp.asarray(weights, jnp.uint32), dtype=jnp.uint32)


@dataclasses.dataclass(frozen=True)
class TextSlot:
    """A dynamic part of a free-text observation: `width` symbols from `symbols` (at most 19
    strings, "" allowed: it renders as nothing). sample(rng) -> [width] int ids: a filling as the
    env renders it, from which the text layer finds where the slot's tokens begin and end and
    against which it checks its rendering (so samples should cover what the env shows).
    max_bytes: the most UTF-8 bytes any filling's text takes, when the env knows a bound
    tighter than width x the longest symbol's (the default): the text layer reserves that many
    tokens for the slot (a slot of long, rarely used symbols, such as line labels)."""

    name: str
    symbols: tuple[str, ...]
    width: int
    sample: Callable[[np.random.Generator], np.ndarray]
    max_bytes: int | None = None


class FreeTextEnv(TextEnv[State, Observation]):
    """A text game whose observation is fixed text and symbol slots and whose answers are free
    text the env parses itself (Countdown's expressions, Sudoku's placements).

    What an env author implements, besides jumanji's `reset` / `step` and `action_spec`:
    - `observation_parts`: the observation's text as fixed strings and `TextSlot`s (no two
      slots adjacent), and `render_symbols(state) -> {slot name: [width] int32}` (pure JAX);
      the observation's text is, by definition, the parts joined with each slot's symbols.
    - `action_bytes` and `parse_action(item [action_bytes] int32, length [] int32) -> action`
      (pure JAX): one answer item's UTF-8 bytes (-1 padded; `length` may exceed action_bytes,
      the item was then cut) to the action pytree `step` takes. The answer is split into items
      on the action separator as for grid games (starpo_jax.text.parse); every item is an
      action, as the original passes each one to its env's `step`.
    `action_names` is empty and `symbol_strings` lists the slots' symbols (tokenizer corpora).
    """

    action_names: tuple[str, ...] = ()
    observation_parts: tuple[str | TextSlot, ...]
    action_bytes: int

    @abc.abstractmethod
    def render_symbols(self, state: State) -> dict[str, chex.Array]:
        """{slot name: [width] int32 ids into that slot's symbols} (pure JAX, jit/vmap-able)."""

    @abc.abstractmethod
    def parse_action(self, item: chex.Array, length: chex.Array) -> Any:
        """item [action_bytes] int32 bytes (-1 past the end), length [] int32 -> an action."""

    @property
    def symbol_strings(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys(s for slot in self.slots for s in slot.symbols if s))


def slot_text(parts: tuple[str | TextSlot, ...], ids: dict[str, Any]) -> str:
    """Text of a free-text observation from its slot ids (shared by envs and tests)."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        row = np.asarray(ids[part.name])
        if row.shape != (part.width,):
            raise ValueError(f"slot {part.name!r} has ids of shape {row.shape}; expected "
                             f"({part.width},)")
        out.append("".join(part.symbols[int(i)] for i in row))
    return "".join(out)
