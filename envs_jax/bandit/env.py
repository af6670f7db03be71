"""The two-armed bandit of RAGEN: judge the arms by their names alone, one pull per episode."""

from __future__ import annotations

import math
from functools import cached_property

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.types import StepType, TimeStep

from envs_jax.base import TextEnv, symbol_text
from envs_jax.catalog import ONE_SHOT
from envs_jax.bandit import types as t
from envs_jax.bandit.types import Observation, State


class Bandit(TextEnv[State, Observation]):
    """Two arms, one pull: a low-risk arm that always pays `low_reward` and a high-risk arm that
    pays `high_reward` with probability `high_prob`, else `high_miss_reward`.

    - Actions are static: `action_names = (low_name, high_name)`, ids LOW=0 and HIGH=1 (any id
      other than HIGH pulls the low arm). Which arm is *presented* first is drawn 50/50 at each
      reset, kept in `state.order`, and shows only in the text (`render_symbols`).
    - Text before the pull: the original's game text (`types.GAME_TEXT`), arms in the presented
      order; the prompt adds no instructions and lists no actions, as the original's (its
      config has neither), so only the state tells which arm is which. After the pull it is
      the original's feedback, `FEEDBACK.format(arm=..., reward=...)`, e.g. "Dragon: 1.0
      points". One row of symbols either way (the game text's newlines are inside symbols).
    - Every step terminates the episode. extras: `success` = the high-risk arm was pulled.
    """

    #: The original's text after a pull; `render_text` of a pulled state equals it.
    FEEDBACK = "{arm}: {reward} points"
    max_steps = 1
    instructions = ""  # the original's env_instruction for Bandit is empty
    lists_actions = False
    settings = ONE_SHOT  # the original's bandit run: one turn, one action

    def __init__(
        self,
        low_name: str = "Phoenix",
        high_name: str = "Dragon",
        low_reward: float = 0.1,
        high_reward: float = 1.0,
        high_prob: float = 0.25,
        high_miss_reward: float = 0.0,
    ) -> None:
        """Names: non-empty single-line strings without surrounding spaces, different even
        ignoring case (answers are matched case-insensitively). Rewards: finite numbers.
        high_prob in [0, 1]. Defaults are the original's code (its paper used low_reward 0.15)."""
        for label, name in (("low_name", low_name), ("high_name", high_name)):
            if not isinstance(name, str) or not name or name != name.strip() or "\n" in name:
                raise ValueError(
                    f"{label} must be a non-empty one-line string without surrounding spaces; "
                    f"got {name!r}"
                )
        if low_name.lower() == high_name.lower():
            raise ValueError(f"arm names must differ (ignoring case); got {low_name!r} twice")
        rewards = {"low_reward": low_reward, "high_reward": high_reward}
        for label, value in {**rewards, "high_miss_reward": high_miss_reward}.items():
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{label} must be a finite number; got {value!r}")
        if not _is_number(high_prob) or not 0 <= high_prob <= 1:
            raise ValueError(f"high_prob must be a probability in [0, 1]; got {high_prob!r}")
        self.low_name, self.high_name = low_name, high_name
        self.low_reward, self.high_reward = float(low_reward), float(high_reward)
        self.high_miss_reward = float(high_miss_reward)
        self.high_prob = float(high_prob)
        self.action_names = (low_name, high_name)
        self.payouts = (self.low_reward, self.high_reward, self.high_miss_reward)
        self.symbol_strings = t.symbol_strings(low_name, high_name, self.payouts)
        super().__init__()

    def _describe(self) -> str:
        return (
            f"low={self.low_name}:{self.low_reward}, high={self.high_name}:"
            f"{self.high_reward}@{self.high_prob} else {self.high_miss_reward}"
        )

    def reset(self, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """A new game: the presentation order is drawn 50/50. key: PRNG key."""
        order_key, state_key = jax.random.split(key)
        order = jax.random.bernoulli(order_key).astype(jnp.int32)
        return self._restart(order, state_key)

    def step(self, state: State, action: chex.Array) -> tuple[State, TimeStep[Observation]]:
        """Pulls an arm and ends the episode. action: [] int32, LOW (0) or HIGH (1)."""
        draw_key, next_key = jax.random.split(state.key)
        high = jnp.asarray(action, jnp.int32) == t.HIGH
        win = jax.random.uniform(draw_key) < self.high_prob
        payout = jnp.where(high, jnp.where(win, t.PAID_HIGH_WIN, t.PAID_HIGH_MISS), t.PAID_LOW)
        state = state.replace(
            pulled=jnp.where(high, t.HIGH, t.LOW).astype(jnp.int32),
            payout=payout.astype(jnp.int32),
            step_count=state.step_count + 1,
            key=next_key,
        )
        timestep = TimeStep(
            step_type=StepType.LAST,
            reward=jnp.asarray(self.payouts, jnp.float32)[payout],
            discount=jnp.float32(0.0),
            observation=Observation(symbols=self.render_symbols(state)),
            extras={"success": high, "action_is_effective": jnp.bool_(True)},
        )
        return state, timestep

    def render_symbols(self, state: State) -> chex.Array:
        """[1, ROW_WIDTH] int32 ids into `symbol_strings`: the game text before the pull, the
        feedback after."""
        first = jnp.where(state.order == 0, t.LOW, t.HIGH)
        a, b = t.SPACED_NAME + first, t.SPACED_NAME + 1 - first
        menu = jnp.stack(
            [t.GAME, a, t.AND, b, t.RULES, a, t.AND, b, t.OUTPUT_LIKE, a, t.OR_ANSWER, b,
             t.END_ANSWER]
        )
        pulled = jnp.maximum(state.pulled, 0)
        feedback = jnp.stack(
            [t.NAME + pulled, t.COLON, t.PAYOUT + state.payout, t.POINTS]
            + [jnp.int32(t.BLANK)] * (t.ROW_WIDTH - 4)
        )
        return jnp.where(state.pulled == t.NOT_PULLED, menu, feedback).astype(jnp.int32)[None, :]

    def reset_from_text(self, text: str, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        """A state from a `render_text` string: a menu (fixes the order) or a feedback line
        (fixes arm and payout; the order, no longer visible, is drawn from key)."""
        if text not in self._states_by_text:
            known = "\n".join(f"  {s}" for s in self._states_by_text)
            raise ValueError(f"not a text this bandit renders: {text!r}; it renders:\n{known}")
        order, pulled, payout = self._states_by_text[text]
        order_key, state_key = jax.random.split(key)
        if order is None:
            order = int(jax.random.bernoulli(order_key))
        state, timestep = self._restart(jnp.int32(order), state_key)
        if pulled == t.NOT_PULLED:
            return state, timestep
        state = state.replace(
            pulled=jnp.int32(pulled), payout=jnp.int32(payout), step_count=jnp.int32(1)
        )
        return state, timestep.replace(observation=Observation(symbols=self.render_symbols(state)))

    @cached_property
    def _states_by_case(self) -> dict[tuple[int | None, int, int], State]:
        """(order or None if not shown, pulled, payout) -> a state: every rendering, once."""
        cases = [(order, t.NOT_PULLED, t.PAID_LOW) for order in (0, 1)]
        cases += [(None, t.LOW, t.PAID_LOW)]
        cases += [(None, t.HIGH, paid) for paid in (t.PAID_HIGH_WIN, t.PAID_HIGH_MISS)]
        return {
            (order, pulled, payout): State(
                order=jnp.int32(order or 0),
                pulled=jnp.int32(pulled),
                payout=jnp.int32(payout),
                step_count=jnp.int32(0),
                key=jax.random.PRNGKey(0),
            )
            for order, pulled, payout in cases
        }

    @cached_property
    def _states_by_text(self) -> dict[str, tuple[int | None, int, int]]:
        """Every text this env renders -> (order or None if not shown, pulled, payout)."""
        return {
            symbol_text(self.symbol_strings, self.render_symbols(state)): case
            for case, state in self._states_by_case.items()
        }

    def symbol_grids(self) -> np.ndarray:
        """The five grids a bandit renders: two menus (arm order), three pull results."""
        return np.stack(
            [np.asarray(self.render_symbols(s)) for s in self._states_by_case.values()]
        ).astype(np.int32)

    def _restart(self, order: chex.Array, key: chex.PRNGKey) -> tuple[State, TimeStep[Observation]]:
        state = State(
            order=order,
            pulled=jnp.int32(t.NOT_PULLED),
            payout=jnp.int32(t.PAID_LOW),
            step_count=jnp.int32(0),
            key=key,
        )
        timestep = TimeStep(
            step_type=StepType.FIRST,
            reward=jnp.float32(0.0),
            discount=jnp.float32(1.0),
            observation=Observation(symbols=self.render_symbols(state)),
            extras={"success": jnp.bool_(False), "action_is_effective": jnp.bool_(False)},
        )
        return state, timestep

    @cached_property
    def observation_spec(self) -> specs.Spec[Observation]:
        return specs.Spec(
            Observation,
            "ObservationSpec",
            symbols=specs.BoundedArray(
                (1, t.ROW_WIDTH), jnp.int32, 0, len(self.symbol_strings) - 1, "symbols"
            ),
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
