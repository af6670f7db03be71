"""Host-env throughput: TextArena and an OpenEnv server on localhost beside the compiled game.

    PYTHONPATH=.:tests python experiments/bench/host_envs.py            # tiny-random model
    PYTHONPATH=.:tests python experiments/bench/host_envs.py --model smollm2-135m-instruct

Every row trains the same GRPO step shape (P groups x N rollouts, T turns of one action, NoThink
replies of R tokens) from the same initial state and model: the compiled step (Sokoban, the
env inside jax.jit), then HostTrainStep (the host rollout: a jitted sampler per turn, the env
stepped in the host pool's threads, the same jitted learn) on Sokoban wrapped as a host env,
on TextArena's GuessTheNumber-v0, and on the tests' guessing game served by openenv-core on
127.0.0.1 (tests/helpers/openenv_game.py, a subprocess; one WebSocket session per row).
Prints one markdown table: the mean seconds of the timed steps after a first (compiling) one,
episodes a second (rows / step seconds) and the share of the step spent waiting on the env
(timing/host_env_seconds / step seconds: reset and every step call of the rollout). Needs the
textarena and openenv extras and openenv-core (the test extra has them).
"""

from __future__ import annotations

import argparse
import functools
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402

import envs_host  # noqa: E402
import envs_jax  # noqa: E402
from envs_host import PoolConfig  # noqa: E402
from envs_host.jax_adapter import JaxTextEnvHost  # noqa: E402
from starpo_jax.config import RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.rollout.host_text import build_host_text  # noqa: E402
from starpo_jax.rollout.jax_env import prompt_widths  # noqa: E402
from starpo_jax.run.host_train import HostTrainStep  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_step  # noqa: E402

OPENENV_KWARGS = {"action_field": "message", "observation_field": "text",
                  "success_field": "solved", "timeout": 20, "retry_seconds": 30}


def _time(step, state, key, steps: int) -> tuple[float, dict]:
    """Mean seconds of `steps` steps after a first one (compiles), and the last metrics."""
    state, metrics = step(state, key)
    jax.block_until_ready(state)
    env_seconds, start = 0.0, time.perf_counter()
    for t in range(steps):
        state, metrics = step(state, jax.random.fold_in(key, t + 1))
        jax.block_until_ready(state)
        env_seconds += float(jax.device_get(metrics).get("timing/host_env_seconds", 0.0))
    return (time.perf_counter() - start) / steps, env_seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    from helpers.openenv_game import GameServer  # tests/helpers (PYTHONPATH=.:tests)

    model, tok = load_pretrained(args.model)
    rollout = RolloutConfig(groups=args.groups, group_size=args.group_size,
                            max_turns=args.turns, max_actions_per_turn=1,
                            max_actions_per_traj=args.turns, reply_tokens=args.reply_tokens,
                            mode="nothink", shared_env_randomness=True)
    config = TrainConfig(algo="grpo", rollout=rollout)
    kw = dict(model=model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    key = jax.random.PRNGKey(0)
    init = lambda: init_train_state(config, jax.random.PRNGKey(1), model=model)  # noqa: E731
    rows = rollout.groups * rollout.group_size
    table = []

    def record(name: str, seconds: float, env_seconds: float | None) -> None:
        share = "-" if env_seconds is None else f"{env_seconds / seconds:.1%}"
        table.append(f"| {name} | {seconds:.2f} | {rows / seconds:.2f} | {share} |")
        print(table[-1], flush=True)

    sokoban = envs_jax.make("sokoban")
    codec = build_codec(tok, sokoban, mode="nothink", max_tokens=args.reply_tokens, verify=50)
    seconds, _ = _time(make_train_step(config, sokoban, codec, **kw), init(), key, args.steps)
    record("sokoban, compiled (env inside jax.jit)", seconds, None)

    def host(name: str, label: str, factory) -> None:
        text = build_host_text(tok, factory(), rollout,
                               **({"widths": prompt_widths(codec)} if name == "sokoban" else {}))
        step = HostTrainStep(config, name, PoolConfig(workers=8), text, factory=factory, **kw)
        try:
            seconds, env_seconds = _time(step, init(), key, args.steps)
        finally:
            step.close()
        record(label, seconds, env_seconds)

    host("sokoban", "sokoban, host env (envs_host.jax_adapter)",
         functools.partial(JaxTextEnvHost, sokoban))
    host("textarena:GuessTheNumber-v0", "textarena:GuessTheNumber-v0",
         envs_host.factory("textarena:GuessTheNumber-v0"))
    with GameServer(sessions=2 * rows) as server:
        name = f"openenv:{server.url}"
        host(name, "openenv: the tests' game on 127.0.0.1 (WebSocket)",
             envs_host.factory(name, **OPENENV_KWARGS))
    print(f"\n{args.model}, P={args.groups} N={args.group_size} T={args.turns} "
          f"R={args.reply_tokens}, {args.steps} timed steps after a first, "
          f"{jax.device_count()} {jax.default_backend()} device(s)\n")
    print("| env | s/step | episodes/s | env wait share |\n|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
