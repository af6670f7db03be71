"""Countdown (RAGEN's, after TinyZero): reach the target with the given numbers, one answer."""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import chex
import jax.numpy as jnp
import numpy as np
from jumanji import specs
from jumanji.types import StepType, TimeStep

from envs_jax.base import FreeTextEnv, TextSlot
from envs_jax.countdown import expression as ex
from envs_jax.countdown.generator import MAX_NUMBER, MAX_TARGET, MIN_NUMBER, MIN_TARGET, generate

# The original's env_instruction (config/envs.yaml, Countdown).
INSTRUCTIONS = (
    "You are solving the Countdown puzzle. You should use the num list to create an equation "
    "that equals the target. Example answer format: <think> To find an equation using [3, 5, 2] "
    "to get 4. Let's check 2 + 5 = 7, 7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. "
    "</think><answer>2 + 5 - 3</answer>"
)
SCORE, FORMAT_SCORE = 1.0, 0.1  # the original's CountdownEnvConfig
DIGITS = tuple("0123456789")
EMPTY, SEP = 10, 11  # slot symbol ids after the digits
NUMBER_WIDTH = 3  # digits per number (targets reach 100)


class State(NamedTuple):
    nums: chex.Array  # [M] int32, 0 past count
    count: chex.Array  # [] int32
    target: chex.Array  # [] int32
    answered: chex.Array  # [] bool
    step_count: chex.Array  # [] int32


def _digits(value: chex.Array) -> chex.Array:
    """[] int (0..999) -> [NUMBER_WIDTH] slot ids: decimal digits, leading positions EMPTY."""
    powers = 10 ** jnp.arange(NUMBER_WIDTH - 1, -1, -1)
    shown = (value >= powers) | (powers == 1)
    return jnp.where(shown, (value // powers) % 10, EMPTY).astype(jnp.int32)


def _spell(value: int) -> list[int]:
    text = str(value)
    return [EMPTY] * (NUMBER_WIDTH - len(text)) + [int(c) for c in text]


class Countdown(FreeTextEnv[State, State]):
    """Observation "Target: {t}, nums: {nums}" (nums as a Python list); one turn, one answer:
    an arithmetic expression (envs_jax.countdown.expression) scored as the original does:
    1.0 if it uses exactly the given numbers and equals the target within 1e-5, 0.1 if it uses
    exactly the given numbers but misses (or does not evaluate), 0 otherwise. Every step ends
    the episode; extras: success = reward 1, action_is_effective = reward > 0.

    min_numbers / max_numbers: numbers per instance (the original: 3 to 4). plus_minus_only:
    keep only instances solvable with + and - (the original's dataset filter; see generator).
    action_bytes: answer bytes read (a longer answer scores 0).
    """

    max_steps = 1
    instructions = INSTRUCTIONS

    def __init__(
        self,
        min_numbers: int = 3,
        max_numbers: int = 4,
        plus_minus_only: bool = True,
        action_bytes: int = 128,
    ) -> None:
        if not (isinstance(min_numbers, int) and isinstance(max_numbers, int)
                and 2 <= min_numbers <= max_numbers <= 6):
            raise ValueError(
                f"need 2 <= min_numbers <= max_numbers <= 6; got {min_numbers}, {max_numbers}"
            )
        if not isinstance(action_bytes, int) or action_bytes < 16:
            raise ValueError(f"action_bytes must be an int >= 16; got {action_bytes!r}")
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.plus_minus_only = bool(plus_minus_only)
        self.action_bytes = action_bytes
        width = max_numbers * (NUMBER_WIDTH + 1) - 1
        self.observation_parts = (
            "Target: ",
            TextSlot("target", (*DIGITS, "", ", "), NUMBER_WIDTH, self._sample_target),
            ", nums: [",
            TextSlot("nums", (*DIGITS, "", ", "), width, self._sample_nums),
            "]",
        )
        super().__init__()

    def _describe(self) -> str:
        return (f"numbers={self.min_numbers}..{self.max_numbers}, "
                f"plus_minus_only={self.plus_minus_only}")

    def _sample_target(self, rng: np.random.Generator) -> np.ndarray:
        return np.array(_spell(int(rng.integers(1, MAX_TARGET + 1))), np.int32)

    def _sample_nums(self, rng: np.random.Generator) -> np.ndarray:
        count = int(rng.integers(self.min_numbers, self.max_numbers + 1))
        nums = rng.integers(MIN_NUMBER, MAX_NUMBER + 1, count)
        return np.asarray(self._layout([int(n) for n in nums]), np.int32)

    def _layout(self, nums: list[int]) -> list[int]:
        ids: list[int] = []
        for k in range(self.max_numbers):
            ids += _spell(nums[k]) if k < len(nums) else [EMPTY] * NUMBER_WIDTH
            if k < self.max_numbers - 1:
                ids.append(SEP if k < len(nums) - 1 else EMPTY)
        return ids

    def reset(self, key: chex.PRNGKey) -> tuple[State, TimeStep[State]]:
        nums, count, target = generate(
            key, min_numbers=self.min_numbers, max_numbers=self.max_numbers,
            plus_minus_only=self.plus_minus_only,
        )
        state = State(nums=nums, count=count, target=target, answered=jnp.bool_(False),
                      step_count=jnp.int32(0))
        return state, TimeStep(
            step_type=StepType.FIRST, reward=jnp.float32(0.0), discount=jnp.float32(1.0),
            observation=state,
            extras={"success": jnp.bool_(False), "action_is_effective": jnp.bool_(False)},
        )

    def step(self, state: State, action: ex.Expression) -> tuple[State, TimeStep[State]]:
        """Scores one parsed answer (`parse_action`) and ends the episode."""
        numbers_ok = ex.uses_exactly(action, state.nums, state.count)
        correct = numbers_ok & ex.equals(action, state.target)
        reward = jnp.where(correct, SCORE, jnp.where(numbers_ok, FORMAT_SCORE, 0.0))
        state = state._replace(answered=jnp.bool_(True), step_count=state.step_count + 1)
        return state, TimeStep(
            step_type=StepType.LAST, reward=reward.astype(jnp.float32),
            discount=jnp.float32(0.0), observation=state,
            extras={"success": correct, "action_is_effective": reward > 0},
        )

    def parse_action(self, item: chex.Array, length: chex.Array) -> ex.Expression:
        return ex.parse_expression(item, length)

    def render_symbols(self, state: State) -> dict[str, chex.Array]:
        """The puzzle (the episode ends at the answer, so no later text is ever shown)."""
        k = jnp.arange(self.max_numbers)
        digits = jnp.where((k < state.count)[:, None], _digits(state.nums[:, None]).reshape(
            self.max_numbers, NUMBER_WIDTH), EMPTY)
        seps = jnp.where(k[:-1] < state.count - 1, SEP, EMPTY)[:, None]
        nums = jnp.concatenate(
            [jnp.concatenate([digits[:-1], seps], axis=1).reshape(-1), digits[-1]]
        )
        return {"target": _digits(state.target), "nums": nums.astype(jnp.int32)}

    @cached_property
    def observation_spec(self) -> specs.Spec[State]:
        return specs.Spec(
            State, "ObservationSpec",
            nums=specs.BoundedArray((self.max_numbers,), jnp.int32, 0, MAX_NUMBER, "nums"),
            count=specs.BoundedArray((), jnp.int32, self.min_numbers, self.max_numbers, "count"),
            target=specs.BoundedArray((), jnp.int32, MIN_TARGET, MAX_TARGET, "target"),
            answered=specs.Array((), bool, "answered"),
            step_count=specs.Array((), jnp.int32, "step_count"),
        )

    @cached_property
    def action_spec(self) -> specs.Spec[ex.Expression]:  # type: ignore[override]
        return specs.Spec(
            ex.Expression, "ActionSpec",
            literals=specs.Array((ex.MAX_LITERALS,), jnp.int32, "literals"),
            num_literals=specs.Array((), jnp.int32, "num_literals"),
            evaluable=specs.Array((), bool, "evaluable"),
            numerator=specs.Array((), jnp.int32, "numerator"),
            denominator=specs.Array((), jnp.int32, "denominator"),
            approx=specs.Array((), jnp.float32, "approx"),
            exact=specs.Array((), bool, "exact"),
            cut=specs.Array((), bool, "cut"),
        )
