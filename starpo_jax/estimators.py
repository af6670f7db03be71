"""What the configuration knows of each advantage estimator, without JAX: its registry name,
whether it uses the critic and the parameters its function reads. starpo_jax.config checks
`advantage.estimator` against this table (the name, its critic against `algo`, the fields set
away from their defaults) before the heavy stack loads.

    estimator_spec("gae").critic  # True: the critic's values in, its targets out
    estimator_spec("grpo").params  # ('mode', 'eps', 'whiten_advantages')

The functions live in starpo_jax.algo.advantages (JAX). Its `register_advantage_estimator`, by
which users add estimators at run time, records each one here (`declare_estimator`): the
`critic` it is registered with and the names of its function's parameters after `inputs`. The
built-in estimators are declared below too, so that their names are known before JAX is
imported; registering their functions checks that the declarations agree, and
tests/test_advantages.py compares the whole table with the registered functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """critic: the estimator reads the critic's values and returns the critic's targets (algo
    "ppo"); critic-free ones train with algo "grpo". params: the keyword parameters its function
    takes after `inputs`, in the signature's order (config.ESTIMATOR_PARAMS maps the
    AdvantageConfig fields onto them)."""

    critic: bool
    params: tuple[str, ...]


_SPECS: dict[str, EstimatorSpec] = {}


def declare_estimator(name: str, *, critic: bool, params: Iterable[str]) -> EstimatorSpec:
    """Records estimator `name`'s metadata; declaring it again with the same metadata changes
    nothing, with other metadata raises ValueError (a declaration that drifted from the
    function registered under the name)."""
    spec = EstimatorSpec(critic=bool(critic), params=tuple(params))
    known = _SPECS.setdefault(name, spec)
    if known != spec:
        raise ValueError(f"advantage estimator {name!r} is declared as {known}, but its "
                         f"registration has {spec}")
    return spec


def estimator_names() -> tuple[str, ...]:
    """The declared estimator names (the built-ins and any registered since), sorted."""
    return tuple(sorted(_SPECS))


def estimator_spec(name: str) -> EstimatorSpec:
    """The metadata of estimator `name`; ValueError listing the declared names otherwise."""
    if name not in _SPECS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: "
                         f"{', '.join(estimator_names())}")
    return _SPECS[name]


# The built-in estimators (their functions: starpo_jax.algo.advantages).
declare_estimator("gae", critic=True, params=("gamma", "lam", "whiten_advantages"))
declare_estimator("bi_level_gae", critic=True,
                  params=("gamma", "lam", "gamma_turn", "lam_turn", "whiten_advantages"))
declare_estimator("grpo", critic=False, params=("mode", "eps", "whiten_advantages"))
declare_estimator("gigpo", critic=False,
                  params=("mode", "step_mode", "step_gamma", "omega", "eps"))
declare_estimator("rloo", critic=False, params=())
declare_estimator("reinforce_plus_plus", critic=False, params=("gamma",))
declare_estimator("reinforce_plus_plus_baseline", critic=False, params=())
