"""reasoning-gym tasks (https://github.com/open-thought/reasoning-gym) as one-turn host envs.

    env = ReasoningGymEnv("chain_sum")
    env.reset(3)                       # "State the final answer to ...: 4 - 1 - 7 ="
    env.step("-4")                     # ("Correct.", 1.0, True, {"success": True, ...})

An episode is one generated question; the answer is scored by the dataset's own
`score_answer` (1.0 correct, partial credit where the task defines it), and the episode ends.
Question `seed` is item `seed % size` of a dataset generated once from `dataset_seed`, so the
same seed is the same question. Pure Python, no network: an optional dependency
(`pip install "starpo-jax[envs]"`), imported only when an instance is built.
"""

from __future__ import annotations

from typing import Any

from envs_host.base import HostEnv
from envs_host.registry import register
from envs_jax.catalog import ONE_SHOT


class ReasoningGymEnv(HostEnv):
    """One reasoning-gym dataset (see the module docstring)."""

    instructions = ("Solve the problem. Write your final answer, and nothing else, between the "
                    "answer tags.")
    observation_tokens = 256
    settings = ONE_SHOT  # one reply, one answer (the original's bandit / Countdown settings)

    def __init__(self, dataset: str, size: int = 100_000, dataset_seed: int = 0,
                 **dataset_config: Any):
        try:
            import reasoning_gym
        except ImportError as error:
            raise ImportError("the reasoning-gym envs need the reasoning-gym package: pip "
                              "install 'starpo-jax[envs]' (or reasoning-gym)") from error
        self.dataset = dataset
        self._data = reasoning_gym.create_dataset(dataset, size=size, seed=dataset_seed,
                                                  **dataset_config)
        self._entry: dict[str, Any] | None = None

    def reset(self, seed: int) -> str:
        self._entry = self._data[seed % len(self._data)]
        return self._entry["question"]

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._entry is None:
            raise RuntimeError(f"reasoning-gym {self.dataset!r}: step before reset")
        score = float(self._data.score_answer(action, self._entry))
        success = score >= 1.0
        return ("Correct." if success else "Incorrect."), score, True, {
            "success": success, "action_is_valid": True, "action_is_effective": True}


# Small arithmetic tasks a small model can learn, and Countdown (as reasoning-gym words it).
for _name in ("chain_sum", "basic_arithmetic", "countdown"):
    register(f"rg_{_name}", ReasoningGymEnv, dataset=_name)
