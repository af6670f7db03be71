"""Any jumanji `Environment` as a text game: the adapter behind `game_2048`, `rubiks_cube_2x2`
and `maze`.

    env = JumanjiTextEnv(
        Maze(generator=RandomGenerator(5, 5), time_limit=100),
        action_names=("Up", "Right", "Down", "Left"),          # word i is jumanji action i
        render=lambda s: symbol_ids(s),                       # state -> int32 [R, C] (pure JAX)
        symbol_strings=("#", "_", "P", "G"),
        success=lambda s, a, s2, ts: ts.reward > 0,            # (state, action, next, timestep)
        instructions="...",
    )

`reset` and `step` are the wrapped env's own; the adapter maps the action word's index to the
env's action (`action_values[i]`, default i: a multi-dimensional action space such as the
Rubik's cube's (face, depth, amount) lists one row per word), and computes the reward, the
success flag and the effective-action flag from the transition with JAX functions of
(state, action index, next state, jumanji timestep). The parser is the project's generic one
for action words (starpo_jax.text.parse): replies name actions, and a game whose actions are
not a small set of words (Minesweeper's (row, col) cells, 100 of them on 10x10) does not fit it
without becoming a free-text game that parses its own answers (envs_jax.base.FreeTextEnv).

Observations come in the two shapes the text layer encodes exactly (starpo_jax.text.codec):
- a grid (`symbol_strings` given): `render(state) -> int32 [R, C]` ids into them, rows joined
  by newlines, as every grid game (envs_jax.base.TextEnv);
- fixed text and slots (`observation_parts` given: strings and `TextSlot`s, as a
  FreeTextEnv's): `render(state) -> {slot name: int32 [width]}`. For texts whose symbols
  would not fit one alphabet of at most 18 short strings (2048's numbers, menu and score).
Either way the reply is parsed into the action words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.env import Environment
from jumanji.types import TimeStep

from envs_jax.base import TextEnv, TextSlot

#: (state, action index [] int32, next state, the wrapped env's timestep) -> a JAX scalar.
Transition = Callable[[Any, chex.Array, Any, TimeStep], chex.Array]


class JumanjiTextEnv(TextEnv):
    """A jumanji Environment played with action words and rendered as text (module docstring).

    The state is the wrapped env's own; the timestep's observation, step type and discount are
    its own too, the reward is `reward(...)` (default: the wrapped env's) as float32, and
    extras hold `success` and `action_is_effective` (what the rollout reads).
    """

    def __init__(
        self,
        env: Environment,
        *,
        action_names: Sequence[str],
        render: Callable[[Any], Any],
        success: Transition,
        instructions: str,
        symbol_strings: Sequence[str] | None = None,
        observation_parts: Sequence[str | TextSlot] | None = None,
        action_values: Any = None,
        reward: Transition | None = None,
        effective: Transition | None = None,
        dead_end: Callable[[Any], chex.Array] | None = None,
        symbol_legend: Sequence[tuple[str, str]] = (),
        lists_actions: bool = True,
        max_steps: int | None = None,
    ) -> None:
        """env: the jumanji Environment; action_names: the words, in the order of
        `action_values` (an array with one row per word, passed to env.step; None: word i is
        action i); render: state -> symbol ids (pure JAX); exactly one of `symbol_strings`
        (a grid) or `observation_parts` (text and slots). success / reward / effective:
        Transition functions (effective defaults to "the rendered symbols changed"); dead_end:
        state -> bool [] (TextEnv.dead_end; default never). max_steps: the wrapped env's step
        limit, for the record (the env truncates, not the adapter; default: its `time_limit`,
        else 10**6)."""
        if not isinstance(env, Environment):
            raise ValueError(f"env must be a jumanji Environment; got {env!r}")
        names = tuple(action_names)
        if len(names) < 2 or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"action_names must be 2 or more non-empty strings; got {names!r}")
        if (symbol_strings is None) == (observation_parts is None):
            raise ValueError("give exactly one of symbol_strings (a grid observation) or "
                             "observation_parts (text and slots)")
        if symbol_strings is not None:
            self.symbol_strings = tuple(symbol_strings)
            if not self.symbol_strings:
                raise ValueError("symbol_strings must not be empty")
        else:
            observation_parts = tuple(observation_parts)
            if not any(isinstance(p, TextSlot) for p in observation_parts):
                raise ValueError("observation_parts need at least one TextSlot")
            # A slot observation's symbols: every slot's (tokenizer corpora), as a FreeTextEnv's.
            self.symbol_strings = tuple(dict.fromkeys(
                s for p in observation_parts if isinstance(p, TextSlot) for s in p.symbols if s))
        self.observation_parts = observation_parts
        values = np.arange(len(names), dtype=np.int32) if action_values is None else \
            np.asarray(action_values)
        if values.shape[:1] != (len(names),):
            raise ValueError(f"action_values has shape {values.shape}; expected one row per "
                             f"action word ({len(names)},...)")
        limit = getattr(env, "time_limit", None) if max_steps is None else max_steps
        limit = 10**6 if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_steps must be an int >= 1; got {limit!r}")
        self.env = env
        self.action_names = names
        self.action_values = values
        self.instructions = instructions
        self.symbol_legend = tuple(symbol_legend)
        self.lists_actions = lists_actions
        self.max_steps = limit
        self._render = render
        self._success = success
        self._reward = reward
        self._effective = effective
        self._dead_end = dead_end
        super().__init__()

    # The text side -----------------------------------------------------------------------

    def render_symbols(self, state: Any) -> Any:
        """int32 [R, C] ids into symbol_strings, or {slot name: int32 [width]} (pure JAX)."""
        return jax.tree.map(lambda x: jnp.asarray(x, jnp.int32), self._render(state))

    def dead_end(self, state: Any) -> chex.Array:
        return jnp.bool_(False) if self._dead_end is None else self._dead_end(state)

    # The JAX side -------------------------------------------------------------------------

    def reset(self, key: chex.PRNGKey) -> tuple[Any, TimeStep]:
        """The wrapped env's reset (reward 0, extras success and action_is_effective False)."""
        state, timestep = self.env.reset(key)
        return state, self._timestep(timestep, jnp.float32(0.0), jnp.bool_(False),
                                     jnp.bool_(False))

    def step(self, state: Any, action: chex.Array) -> tuple[Any, TimeStep]:
        """action: [] int32 index into action_names."""
        action = jnp.asarray(action, jnp.int32)
        value = jnp.asarray(self.action_values)[action]
        next_state, timestep = self.env.step(state, value)
        reward = timestep.reward if self._reward is None else \
            self._reward(state, action, next_state, timestep)
        if self._effective is None:
            before, after = self.render_symbols(state), self.render_symbols(next_state)
            effective = jnp.any(jnp.stack([jnp.any(a != b) for a, b in
                                           zip(jax.tree.leaves(before), jax.tree.leaves(after))]))
        else:
            effective = self._effective(state, action, next_state, timestep)
        success = self._success(state, action, next_state, timestep)
        return next_state, self._timestep(timestep, reward, success, effective)

    @staticmethod
    def _timestep(timestep: TimeStep, reward, success, effective) -> TimeStep:
        return TimeStep(
            step_type=timestep.step_type,
            reward=jnp.asarray(reward, jnp.float32),
            discount=jnp.asarray(timestep.discount, jnp.float32),
            observation=timestep.observation,
            extras={"success": jnp.asarray(success, bool),
                    "action_is_effective": jnp.asarray(effective, bool)},
        )

    @cached_property
    def observation_spec(self) -> specs.Spec:
        return self.env.observation_spec

    @cached_property
    def action_spec(self) -> specs.DiscreteArray:
        return specs.DiscreteArray(len(self.action_names), dtype=np.int32, name="action")

    def _describe(self) -> str:
        return f"{type(self.env).__name__}, max_steps={self.max_steps}"
