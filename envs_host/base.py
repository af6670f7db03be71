"""The protocol of a Python text environment (the original's `BaseLanguageBasedEnv`).

    class MyEnv(HostEnv):
        instructions = "Guess the number between 1 and 10."
        def reset(self, seed: int) -> str: ...             # the first observation's text
        def step(self, action: str) -> tuple[str, float, bool, dict]:
            ...                                            # (observation, reward, done, info)

`info["success"]` is required on every step (True once the task is solved); optional
`info["action_is_valid"]` / `info["action_is_effective"]` feed the metrics (an action counts
as effective unless the env says otherwise). `reset(seed)` must give the same observation for
the same seed: the N rows of a group reset with one seed and share their first prompt.
Each row of a rollout owns one instance (`reset` is called again on it every step).

Class attributes a subclass may set:
- `instructions`: the rules, shown once in the first user message;
- `action_names`: a fixed list of action words (parsed like a JAX env's: case-insensitive,
  unknown words make the turn badly formatted), or None for free-text actions (every
  non-empty item of the answer, split on the separator, is passed to `step` as it is);
- `observation_tokens`: tokens reserved in the buffer for one observation (longer ones are
  truncated, and counted in the metrics);
- `settings`: the agent-side settings the env is meant for, an `EnvSettings` as a JAX env's
  (envs_jax.catalog: max_turns, max_actions_per_turn, max_actions_per_traj, announced_tokens),
  e.g. `EnvSettings(max_turns=1)`; a run config's rollout key left unset takes it
  (starpo_jax.run.schema), as it takes a JAX env's.
"""

from __future__ import annotations

import abc
import math
import numbers
from typing import Any

from envs_jax.catalog import EnvSettings


class HostEnvError(ValueError):
    """An environment broke the protocol (a bug in the env: the run stops, naming it)."""


class HostEnv(abc.ABC):
    """A text environment stepped on the host (see the module docstring)."""

    instructions: str = ""
    action_names: tuple[str, ...] | None = None
    observation_tokens: int = 256
    settings: EnvSettings = EnvSettings()

    @abc.abstractmethod
    def reset(self, seed: int) -> str:
        """Starts an episode; the same seed gives the same episode. Returns its text."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Takes one action (text) -> (observation text, reward, done, info with "success")."""

    def close(self) -> None:
        """Releases what the instance holds (called when it is replaced or the pool closes)."""


def check_observation(env: str, seed: int, value: Any) -> str:
    """`value` if it is a str, else HostEnvError naming the env, seed and value."""
    if not isinstance(value, str):
        raise HostEnvError(f"env {env!r} (seed {seed}) returned an observation of type "
                           f"{type(value).__name__}: {value!r:.200}; it must be a str")
    return value


def check_step(env: str, seed: int, action: str, result: Any) -> tuple[str, float, bool, dict]:
    """A step's result checked: (str, finite real reward, bool-like done, dict with
    "success"). Raises HostEnvError naming the env, seed, action and bad value."""
    where = f"env {env!r} (seed {seed}, action {action!r:.80})"
    if not isinstance(result, tuple) or len(result) != 4:
        raise HostEnvError(f"{where}: step must return (observation, reward, done, info); got "
                           f"{result!r:.200}")
    obs, reward, done, info = result
    check_observation(env, seed, obs)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) \
            or not math.isfinite(float(reward)):
        raise HostEnvError(f"{where}: reward {reward!r} is not a finite number")
    if not isinstance(info, dict) or "success" not in info:
        raise HostEnvError(f"{where}: info must be a dict with a 'success' key; got {info!r:.200}")
    return obs, float(reward), bool(done), info
