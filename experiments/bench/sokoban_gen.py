"""Sokoban level generation inside JAX: levels/s, CPU time per level, compile time, difficulty.

    PYTHONPATH=. python experiments/bench/sokoban_gen.py [--quick] [--envs sokoban sokoban_large]

Times `jit(vmap(env.reset))` (a reset is one generated level) at several batch sizes: wall
levels/s from the median of repeated calls after a warm-up call, and CPU microseconds per level
from `time.process_time` over the same calls (all threads of the process; less noisy than wall
time on a machine shared with other jobs). Compile time is the first call at the largest batch
(trace + compile + one run). Difficulty: the median and mean optimal solution length
(envs_jax.sokoban.solver, BFS) of 200 levels. Prints one markdown table.

`measure_generation(env_name, batch, repeats)` is importable (experiments/bench/envs.py may
call it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import cache
from typing import Callable

import jax
import numpy as np

import envs_jax
from envs_jax.sokoban import solver


@cache
def _compiled_reset(env_name: str, batch: int) -> tuple[Callable, float]:
    """(jit(vmap(env.reset)) compiled for `batch` keys, seconds to trace, compile and run once)."""
    env = envs_jax.make(env_name)
    reset = jax.jit(jax.vmap(env.reset))
    keys = jax.random.split(jax.random.key(0), batch)
    start = time.perf_counter()
    jax.block_until_ready(reset(keys))
    return reset, time.perf_counter() - start


def measure_generation(env_name: str, batch: int, repeats: int = 5) -> dict:
    """Generation speed of a registered Sokoban env: `jit(vmap(env.reset))` over `batch` keys.

    Returns a dict: levels_per_s (batch / median wall seconds of one call), cpu_us_per_level
    (process CPU time over all `repeats` calls / levels), compile_s (first call, includes one
    run), batch, repeats. Each call uses fresh keys, so the timings are over different levels.
    """
    if batch < 1 or repeats < 1:
        raise ValueError(f"batch and repeats must be >= 1; got batch={batch}, repeats={repeats}")
    reset, compile_s = _compiled_reset(env_name, batch)
    walls = []
    cpu_start = time.process_time()
    for r in range(repeats):
        keys = jax.random.split(jax.random.key(r + 1), batch)
        keys.block_until_ready()
        start = time.perf_counter()
        jax.block_until_ready(reset(keys))
        walls.append(time.perf_counter() - start)
    cpu = time.process_time() - cpu_start
    return {
        "levels_per_s": batch / statistics.median(walls),
        "cpu_us_per_level": 1e6 * cpu / (batch * repeats),
        "compile_s": compile_s,
        "batch": batch,
        "repeats": repeats,
    }


def solution_lengths(env_name: str, num_levels: int = 200, seed: int = 2024) -> list[int]:
    """Optimal solution lengths (BFS) of `num_levels` generated levels; raises if any is None."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    env = envs_jax.make(env_name)
    _, ts = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(seed), num_levels))
    lengths = [solver.solve(level) for level in np.asarray(ts.observation.grid)]
    if any(n is None for n in lengths):
        raise RuntimeError(f"{env_name}: a generated level is unsolvable")
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 1024, fewer repeats")
    parser.add_argument("--envs", nargs="+", default=["sokoban", "sokoban_large"])
    args = parser.parse_args()
    batches = (1, 1024) if args.quick else (1, 1024, 4096)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {len(jax.devices())} device(s)")
    print()
    print("| env | batch | levels/s (wall) | CPU us/level | compile s | median / mean moves |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.envs:
        lengths = solution_lengths(name)
        moves = f"{np.median(lengths):.1f} / {np.mean(lengths):.2f}"
        for batch in batches:
            repeats = (20 if batch == 1 else 3) if args.quick else (50 if batch == 1 else 5)
            m = measure_generation(name, batch, repeats)
            print(
                f"| {name} | {batch} | {m['levels_per_s']:,.0f} | {m['cpu_us_per_level']:,.1f} "
                f"| {m['compile_s']:.1f} | {moves} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
