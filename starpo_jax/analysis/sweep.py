"""Seeded sweeps: a grid of config overrides x seeds, one compiled program per setting.

    grid = parse_grid(["filter.keep_ratio=0.25,1.0", "loss.kl_coef=0,0.001"], base)
    runs = []
    for setting in settings(grid):                       # the product, in the grid's order
        exp = experiment.build(setting_config(base, setting))   # checked before anything compiles
        step = compile_batched_step(exp, seeds)
        history = run_batched(exp, step, seeds, steps)   # {seed: [metrics of step 1, 2, ...]}
        runs.append(Run(setting, history))
    text = results_csv([key for key, _ in grid], runs, seeds)

Settings differ in static config, so each is its own compile; the seeds of a setting share it.
`run_batched` stacks the seeds' train states on a leading axis and runs one jitted
`jax.vmap(step)` over (states, keys); `run_sequential` reuses the experiment's own compiled step
for one seed after another. Seed s starts from the state and key `experiment.build` derives from
seed s, so each seed's numbers are those of `experiments/run.py --config.seed=s` (sequential:
bitwise; vmapped: within float tolerance, since batching changes how XLA orders reductions,
and so does the number of seeds batched together).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_dict

from starpo_jax.run import experiment
from starpo_jax.run.overrides import (NOT_SWEPT, GridAxis, field,  # noqa: F401 (API)
                                      parse_grid, parse_overrides)
from starpo_jax.train.collapse import drop_uncomputed
from starpo_jax.train.step import TrainState, init_train_state

ConfigDict = config_dict.ConfigDict
Metrics = dict[str, float]
History = dict[int, list[Metrics]]  # seed -> one metrics dict per step, step 1 first
OnStep = Callable[[tuple[int, ...], int, list[Metrics]], None]  # (seeds, step, their metrics)


@dataclasses.dataclass(frozen=True)
class Run:
    """The finished runs of one setting: its swept values and each seed's history."""

    setting: dict[str, Any]
    history: History


def parse_seeds(text: str) -> tuple[int, ...]:
    """'0,1,2' -> (0, 1, 2). Raises ValueError naming a bad, negative or repeated seed."""
    seeds = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--seeds {text!r}: {part!r} is not a seed; valid: comma-separated "
                             "ints >= 0, e.g. 0,1,2")
        if int(part) in seeds:
            raise ValueError(f"--seeds {text!r}: seed {int(part)} is repeated")
        seeds.append(int(part))
    return tuple(seeds)


def settings(grid: Sequence[GridAxis]) -> list[dict[str, Any]]:
    """Every combination of the grid, the last key varying fastest; [{}] for an empty grid."""
    keys = [key for key, _ in grid]
    return [dict(zip(keys, values)) for values in itertools.product(*(v for _, v in grid))]


def setting_name(setting: Mapping[str, Any]) -> str:
    """{'filter.keep_ratio': 0.25, 'loss.kl_coef': 0.0} -> 'filter.keep_ratio=0.25,loss.kl_coef=0.0'
    ('base' for the empty setting)."""
    return ",".join(f"{k}={v}" for k, v in setting.items()) or "base"


def setting_config(base: ConfigDict, setting: Mapping[str, Any], seed: int | None = None,
                   check: Callable[[ConfigDict], Any] = experiment.train_config) -> ConfigDict:
    """A copy of `base` with the setting's values (and `seed`), checked by `check` (an SFT
    config's: sft.split_config)."""
    config = base.copy_and_resolve_references()
    for key, value in setting.items():
        section, leaf = field(config, key)
        try:
            section[leaf] = value
        except TypeError as error:
            raise ValueError(f"--grid {key}={value!r}: {error}") from None
    if seed is not None:
        config.seed = seed
    check(config)
    return config


def seed_start(exp: experiment.Experiment, seed: int) -> tuple[TrainState, jax.Array]:
    """The step-0 state and run key that experiment.build gives `exp`'s config with seed `seed`."""
    init_key, key = experiment.run_keys(seed)
    return init_train_state(exp.train, init_key, model=exp.model), key


def _stack(trees: Sequence[Any]) -> Any:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def batched_start(exp: experiment.Experiment, seeds: Sequence[int]) -> tuple[TrainState, jax.Array]:
    """The seeds' step-0 states and keys stacked on a leading axis of size len(seeds)."""
    states, keys = zip(*(seed_start(exp, seed) for seed in seeds))
    return _stack(states), jnp.stack(keys)


def compile_batched_step(exp: experiment.Experiment, seeds: Sequence[int]) -> jax.stages.Compiled:
    """jit(vmap(exp's step)) compiled ahead of time for len(seeds) seeds (state donated).

    Raises whatever tracing or compiling raises (e.g. an op without a batching rule), before
    any step has run, so that the caller can fall back to run_sequential.
    """
    abstract = jax.eval_shape(lambda: batched_start(exp, seeds))
    return jax.jit(jax.vmap(exp.train_step), donate_argnums=0).lower(*abstract).compile()


def _host(metrics: Mapping[str, jax.Array]) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in jax.device_get(metrics).items()}


def run_batched(exp: experiment.Experiment, step: Callable, seeds: Sequence[int], steps: int,
                on_step: OnStep | None = None) -> History:
    """`steps` iterations of every seed at once with `step` (from compile_batched_step)."""
    seeds = tuple(seeds)
    state, keys = batched_start(exp, seeds)
    history: History = {seed: [] for seed in seeds}
    for t in range(1, steps + 1):
        state, metrics = step(state, keys)
        host = _host(metrics)
        for i, seed in enumerate(seeds):
            history[seed].append(drop_uncomputed({name: float(value[i])
                                                  for name, value in host.items()}))
        if on_step:
            on_step(seeds, t, [history[seed][-1] for seed in seeds])
    return history


def run_sequential(exp: experiment.Experiment, seeds: Sequence[int], steps: int,
                   on_step: OnStep | None = None) -> History:
    """`steps` iterations of each seed in turn, all with exp's one compiled step."""
    history: History = {}
    for seed in seeds:
        state, key = seed_start(exp, seed)
        history[seed] = []
        for t in range(1, steps + 1):
            state, metrics = exp.train_step(state, key)
            history[seed].append(drop_uncomputed({name: float(v)
                                                  for name, v in _host(metrics).items()}))
            if on_step:
                on_step((seed,), t, history[seed][-1:])
    return history


def _cell(value: Any) -> str:
    # float32 metrics: the shortest text that reads back as the same float32.
    return str(np.float32(value)) if isinstance(value, float) else str(value)


def results_csv(keys: Sequence[str], runs: Sequence[Run], seeds: Sequence[int]) -> str:
    """Long format: one row per (setting, seed, step) in the order given, columns the swept
    `keys`, 'seed', 'step', then every metric name sorted (empty where a run lacks it)."""
    metrics = sorted({name for run in runs for seed in seeds
                      for row in run.history[seed] for name in row})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*keys, "seed", "step", *metrics])
    for run in runs:
        swept = [str(run.setting[key]) for key in keys]
        for seed in seeds:
            for step, row in enumerate(run.history[seed], start=1):
                writer.writerow([*swept, seed, step,
                                 *(_cell(row[m]) if m in row else "" for m in metrics)])
    return out.getvalue()


def seed_curves(history: History, seeds: Sequence[int], metric: str) -> np.ndarray | None:
    """[S, T] float64: `metric` per seed and step; None unless every step of every seed has it."""
    if not all(metric in row for seed in seeds for row in history[seed]):
        return None
    return np.array([[row[metric] for row in history[seed]] for seed in seeds])


def final_mean_std(history: History, seeds: Sequence[int], metric: str, final_steps: int,
                   ) -> tuple[float, float] | None:
    """Each seed's mean over its last `final_steps` steps, then (mean, population std) of
    those over the seeds; None if the metric is missing."""
    curves = seed_curves(history, seeds, metric)
    if curves is None:
        return None
    per_seed = curves[:, -final_steps:].mean(axis=1)
    return float(per_seed.mean()), float(per_seed.std())


def summary_table(runs: Sequence[Run], seeds: Sequence[int], metrics: Sequence[str],
                  final_steps: int) -> str:
    """A text table: one line per setting, 'mean ± std' over seeds of the final-steps mean."""
    header = ["setting", *(m.split("/")[-1] for m in metrics)]
    lines = [header]
    for run in runs:
        cells = [setting_name(run.setting)]
        for metric in metrics:
            stat = final_mean_std(run.history, seeds, metric, final_steps)
            cells.append("-" if stat is None else f"{stat[0]:.4g} ± {stat[1]:.2g}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    return "\n".join(text) + "\n"
