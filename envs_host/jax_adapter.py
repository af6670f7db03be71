"""Any envs_jax TextEnv as a host env: `render_text` as the observation, action words as text.

    host = JaxTextEnvHost(envs_jax.make("sokoban"))
    host.reset(7)          # the state of env.reset(key_for_seed(7)), as render_text shows it

With `key_for_seed` mapping the host rollout's seeds to the compiled rollout's reset keys, the
host path replays the compiled path exactly (tests/test_host_rollout.py); the N rows of a group
then share their env randomness (the compiled path's `shared_env_randomness=True`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from envs_host.base import HostEnv

_JITTED: dict[int, tuple[Any, Callable, Callable]] = {}


def _jitted(env: Any) -> tuple[Callable, Callable]:
    """(jit(env.reset), jit(env.step)), compiled once per env object for all its adapters."""
    if id(env) not in _JITTED or _JITTED[id(env)][0] is not env:
        _JITTED[id(env)] = (env, jax.jit(env.reset), jax.jit(env.step))
    return _JITTED[id(env)][1:]


class JaxTextEnvHost(HostEnv):
    """A TextEnv stepped one unbatched state at a time on the host (see module docstring)."""

    def __init__(self, env: Any, key_for_seed: Callable[[int], jax.Array] | None = None,
                 observation_tokens: int = 256):
        self.env = env
        self.instructions = env.instructions
        self.symbol_legend = env.symbol_legend  # the prompt's legend line, as the JAX codec's
        self.lists_actions = env.lists_actions
        self.action_names = tuple(env.action_names)
        self.observation_tokens = observation_tokens
        self._key_for_seed = key_for_seed or jax.random.PRNGKey
        self._index = {name.lower(): i for i, name in enumerate(self.action_names)}
        self._reset, self._step = _jitted(env)
        self.state = None

    def reset(self, seed: int) -> str:
        self.state, _ = self._reset(self._key_for_seed(seed))
        return self.env.render_text(self.state)

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action.lower() not in self._index:
            raise ValueError(f"unknown action {action!r}; valid: {self.action_names}")
        self.state, ts = self._step(self.state, jnp.int32(self._index[action.lower()]))
        info = {"success": bool(ts.extras["success"]),
                "action_is_effective": bool(ts.extras["action_is_effective"])}
        return self.env.render_text(self.state), float(ts.reward), bool(ts.last()), info
