"""Environment throughput: every registered env (jit + vmap) against the original's Python peers.

    PYTHONPATH=. python experiments/bench/envs.py [--quick] [--sokoban-python PYTHON]
        [--envs countdown,sudoku]

(--quick: batch 64 only, few repetitions; a smoke run, not a measurement.)

Prints one table. Our figures: `vmap(env.step)` scanned over T steps with random actions
(no auto-reset: under vmap jumanji's AutoResetWrapper turns its cond into a select, so it would
run a full reset, level generation included, at every step), and `vmap(env.reset)` for
levels/s. Peers, timed in the same run: gymnasium FrozenLake-v1 in a Python loop (bare, and
with a text render per step as the original's step does); gym-sokoban 0.0.6 step with its
per-step RGB render and without it, and its `generate_room` (the original's generator), run by
the interpreter given by --sokoban-python (it needs old gym; skipped with a note if absent).
Also the median optimal solution length (envs_jax.sokoban.solver) of each generator's levels,
and the machine's f32 matmul rate for scale. Times are medians of repeated runs after a
warm-up call; no allocator settings are changed (XLA CPU defaults).

Free-text games (Countdown, Sudoku) step from answer text: each step parses a random answer's
bytes (`env.parse_action`, in the same program) and applies it. Their peers are the original's
rules transcribed to plain Python (experiments/bench/freetext_peers.py) on the same answers, in a
loop: Countdown's `compute_reward` (regex numbers check, `eval`), Sudoku's `parse_action` + `step`
(with and without its "with_feedback" text render).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
import freetext_peers
from envs_jax.base import FreeTextEnv
from envs_jax.sokoban import solver

# Run by the gym-sokoban interpreter; prints one JSON line. Level ids use our symbol ids
# (the same codes as gym-sokoban's room_state, plus 6 for the player on a target).
PEER_SCRIPT = r"""
import json, random, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
from gym_sokoban.envs.room_utils import generate_room
from gym_sokoban.envs.sokoban_env import SokobanEnv

cfg = json.loads(sys.argv[1])
random.seed(0); np.random.seed(0)
dim = tuple(cfg["dim_room"])
env = SokobanEnv(dim_room=dim, max_steps=100, num_boxes=1)
saved = (env.room_state.copy(), env.player_position.copy())
actions = [random.randint(1, 4) for _ in range(cfg["steps"])]  # push-or-move Up/Down/Left/Right

def restore():
    # Episode ends restart the same level: timing the step, not the generator.
    env.room_state, env.player_position = saved[0].copy(), saved[1].copy()
    env.num_env_steps, env.boxes_on_target, env.reward_last = 0, 0, 0

def steps_per_s(n):
    restore()
    start = time.perf_counter()
    for a in actions[:n]:
        if env.step(a)[2]:
            restore()
    return n / (time.perf_counter() - start)

rendered = steps_per_s(cfg["render_steps"])
env.render = lambda *a, **k: None
bare = steps_per_s(cfg["steps"])

levels, failures = [], 0
start = time.perf_counter()
while len(levels) < cfg["levels"]:
    try:
        fixed, state, _ = generate_room(dim=dim, num_steps=int(1.7 * sum(dim)), num_boxes=1)
    except (RuntimeError, RuntimeWarning):
        failures += 1  # the original's env retries these
        continue
    state = state.astype(int)
    state[(state == 5) & (fixed == 2)] = 6
    levels.append(state.tolist())
gen = cfg["levels"] / (time.perf_counter() - start)
print(json.dumps({"rendered": rendered, "bare": bare, "gen": gen, "failures": failures,
                  "levels": levels[: cfg["solve"]]}))
"""


def median_seconds(fn: Callable[[], Any], reps: int) -> float:
    """Median wall time of fn() over reps calls, after one warm-up (compile) call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_gflops(n: int, reps: int) -> float:
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return 2 * n**3 / median_seconds(lambda: f(a), reps) / 1e9


def env_steps_per_s(env: envs_jax.TextEnv, batch: int, steps: int, reps: int) -> float:
    """Steps/s of jit(scan(vmap(env.step))) over `steps` steps of `batch` envs."""
    key = jax.random.PRNGKey(0)
    state, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(key, batch))
    if isinstance(env, FreeTextEnv):  # answer bytes [T, B, W] and lengths, parsed in the step
        actions = freetext_peers.encoded_answers(env, jax.device_get(state), steps)
        step = jax.vmap(lambda s, a: env.step(s, env.parse_action(*a)))
    else:
        actions = jax.random.randint(key, (steps, batch), 0, len(env.action_names), jnp.int32)
        step = jax.vmap(env.step)

    @jax.jit
    def rollout(state, actions):
        def body(state, action):
            state, timestep = step(state, action)
            return state, timestep.reward

        state, rewards = jax.lax.scan(body, state, actions)
        return state, rewards.sum()

    return batch * steps / median_seconds(lambda: rollout(state, actions), reps)


def env_resets_per_s(env: envs_jax.TextEnv, batch: int, reps: int) -> tuple[float, Any]:
    """(resets/s of jit(vmap(env.reset)) at `batch`, one batch of reset states)."""
    keys = jax.random.split(jax.random.PRNGKey(1), batch)
    reset = jax.jit(jax.vmap(env.reset))
    return batch / median_seconds(lambda: reset(keys), reps), reset(keys)[0]


def gymnasium_frozen_lake(steps: int, render_steps: int) -> tuple[float, float]:
    """(bare, with text render) steps/s of gymnasium FrozenLake-v1 (slippery) in a Python loop."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    env = FrozenLakeEnv(map_name="4x4", is_slippery=True)
    actions = np.random.default_rng(0).integers(0, 4, steps).tolist()
    lookup = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}

    def text() -> str:
        # The original's step re-renders the grid as text after every move.
        room = np.vectorize(lambda c: lookup[c])(env.desc)
        room[divmod(int(env.s), env.ncol)] = "P"
        return "\n".join("".join(row) for row in room)

    def steps_per_s(n: int, render: bool) -> float:
        env.reset(seed=0)
        start = time.perf_counter()
        for a in actions[:n]:
            _, _, terminated, truncated, _ = env.step(a)
            if render:
                text()
            if terminated or truncated:
                env.reset()
        return n / (time.perf_counter() - start)

    return steps_per_s(steps, False), steps_per_s(render_steps, True)


def gym_sokoban_peer(python: str, cfg: dict) -> dict | None:
    try:
        out = subprocess.run(
            [python, "-c", PEER_SCRIPT, json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=1200,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        print(f"note: gym-sokoban peer at {python} failed: {detail.strip()[-300:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def default_sokoban_python() -> str | None:
    try:
        import gym_sokoban  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument(
        "--sokoban-python",
        default=None,
        help="interpreter with gym-sokoban 0.0.6 installed (e.g. /tmp/gsvenv/bin/python)",
    )
    parser.add_argument("--envs", default="", help="comma-separated env names (default: all)")
    args = parser.parse_args()
    quick = args.quick
    names = tuple(n for n in args.envs.split(",") if n) or envs_jax.names()
    unknown = sorted(set(names) - set(envs_jax.names()))
    if unknown:
        parser.error(f"unknown envs {unknown}; registered: {', '.join(envs_jax.names())}")
    batches = (64,) if quick else (1, 64, 4096)
    level_batch = 64 if quick else 1024
    reps = 1 if quick else 5
    solve_n = 10 if quick else 50

    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform} ({os.cpu_count()} cores), "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
    )
    gflops = matmul_gflops(512 if quick else 2048, reps)
    print(f"f32 matmul: {gflops:.1f} GFLOP/s (machine scale)\n")

    rows: list[tuple[str, str, float, str]] = []
    ours: dict[tuple[str, int], float] = {}
    levels: dict[str, Any] = {}
    for name in names:
        env = envs_jax.make(name)
        for batch in batches:
            steps = (200 if quick else 2000) if batch == 1 else (20 if quick else 100)
            rate = env_steps_per_s(env, batch, steps, reps)
            ours[name, batch] = rate
            rows.append((f"{name} step (jit+vmap)", f"B={batch}", rate, "steps/s"))
        rate, states = env_resets_per_s(env, level_batch, reps)
        ours[name, -1] = rate
        levels[name] = (env, states)
        rows.append((f"{name} reset (jit+vmap)", f"B={level_batch}", rate, "levels/s"))

    peer_steps = 20_000 if quick else 200_000
    fl_bare = fl_text = None
    if "frozen_lake" in names:
        fl_bare, fl_text = gymnasium_frozen_lake(peer_steps, peer_steps // 20)
        rows.append(("gymnasium FrozenLake-v1 step", "Python", fl_bare, "steps/s"))
        rows.append(("  + text render per step", "Python", fl_text, "steps/s"))
    free_peers = []  # (env name, peer label, steps/s)
    for name in names:
        env = levels[name][0]
        if isinstance(env, FreeTextEnv):
            for label, rate in freetext_peers.python_steps_per_s(env, peer_steps // 10).items():
                rows.append((f"{name} step, {label}", "Python", rate, "steps/s"))
                free_peers.append((name, label, rate))

    python = args.sokoban_python or default_sokoban_python()
    peer = None
    if not any(n.startswith("sokoban") for n in names):
        python = None
    elif python is None:
        print("note: gym-sokoban not importable here; pass --sokoban-python to time the peer")
    else:
        cfg = {
            "dim_room": [6, 6],
            "steps": 5_000 if quick else 100_000,
            "render_steps": 100 if quick else 3_000,
            "levels": 30 if quick else 500,
            "solve": solve_n,
        }
        peer = gym_sokoban_peer(python, cfg)
    if peer:
        rows.append(("gym-sokoban step, RGB render", "Python", peer["rendered"], "steps/s"))
        rows.append(("gym-sokoban step, bare", "Python", peer["bare"], "steps/s"))
        rows.append(("gym-sokoban generate_room 6x6", "Python", peer["gen"], "levels/s"))

    print(f"{'what':<34} {'batch':>8} {'rate':>14}  unit")
    for what, batch, rate, unit in rows:
        print(f"{what:<34} {batch:>8} {rate:>14,.0f}  {unit}")

    top = max(batches)
    print(f"\nratios (ours at B={top} / peer):")
    ratios = []
    if fl_bare is not None:
        ratios += [("frozen_lake", "gymnasium bare", fl_bare)]
        ratios += [("frozen_lake", "gymnasium + text", fl_text)]
    ratios += [(name, f"Python {label}", rate) for name, label, rate in free_peers]
    if peer:
        for name in ("sokoban", "sokoban_large"):
            if (name, top) in ours:
                ratios += [(name, "gym-sokoban bare", peer["bare"])]
                ratios += [(name, "gym-sokoban rendered", peer["rendered"])]
    for name, against, rate in ratios:
        if (name, top) in ours:
            print(f"  {name:<14} step vs {against:<30} {ours[name, top] / rate:>10,.1f}x")
    if peer and ("sokoban", -1) in ours:
        print(
            f"  {'sokoban':<14} reset (B={level_batch}) vs generate_room "
            f"{ours['sokoban', -1] / peer['gen']:>10,.1f}x "
            f"(peer: {peer['failures']} failed generate_room calls retried)"
        )

    generated = {
        name: np.asarray(jax.vmap(env.render_symbols)(states))[:solve_n]
        for name, (env, states) in levels.items()
        if name.startswith("sokoban")
    }
    if not generated:
        return
    print(f"\noptimal solution length (BFS over {solve_n} levels of each generator):")
    if peer:
        generated["gym-sokoban 6x6"] = [np.asarray(level) for level in peer["levels"]]
    for name, ids in generated.items():
        lengths = [solver.solve(level) for level in ids]
        solved = [n for n in lengths if n is not None]
        print(
            f"  {name:<22} median {statistics.median(solved):>4}  "
            f"mean {statistics.mean(solved):.1f}  max {max(solved)}  "
            f"unsolvable {len(lengths) - len(solved)}"
        )

if __name__ == "__main__":
    main()
