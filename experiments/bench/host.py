"""The host-env path against the compiled path, on the same JAX env (Sokoban), tiny model.

    python experiments/bench/host.py                 # P=2, N=4, 3 turns, 3 timed steps each
    python experiments/bench/host.py --steps 5 --groups 4

Both train the same config from the same state: the compiled step (rollout + learn in one
jax.jit) and HostTrainStep (the host rollout: jitted sampler per turn, the env stepped on the
host through envs_host.jax_adapter, then the same jitted learn). Prints the first-call (compile)
and the mean later step seconds of each, and the host rollout's env seconds.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402

import envs_jax  # noqa: E402
from envs_host import PoolConfig  # noqa: E402
from envs_host.jax_adapter import JaxTextEnvHost  # noqa: E402
from starpo_jax.config import RolloutConfig, TrainConfig  # noqa: E402
from starpo_jax.rollout.host_text import build_host_text  # noqa: E402
from starpo_jax.run.host_train import HostTrainStep  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.rollout.jax_env import prompt_widths  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_step  # noqa: E402


def _time(step, state, key, steps: int) -> tuple[float, float, dict]:
    start = time.perf_counter()
    state, metrics = step(state, key)
    jax.block_until_ready(state)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, key)
    jax.block_until_ready(state)
    return first, (time.perf_counter() - start) / steps, jax.device_get(metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    model, tok = load_pretrained("tiny-random")
    env = envs_jax.make("sokoban")
    rollout = RolloutConfig(groups=args.groups, group_size=args.group_size,
                            max_turns=args.turns, reply_tokens=args.reply_tokens,
                            mode="nothink", shared_env_randomness=True)
    config = TrainConfig(algo="grpo", rollout=rollout)
    codec = build_codec(tok, env, mode="nothink", max_tokens=args.reply_tokens, verify=50)
    kw = dict(model=model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    key = jax.random.PRNGKey(0)
    compiled = make_train_step(config, env, codec, **kw)
    factory = functools.partial(JaxTextEnvHost, env)
    text = build_host_text(tok, factory(), rollout, widths=prompt_widths(codec))
    host = HostTrainStep(config, "sokoban", PoolConfig(workers=8), text, factory=factory, **kw)
    init = lambda: init_train_state(config, jax.random.PRNGKey(1), model=model)  # noqa: E731
    shape = f"P={args.groups} N={args.group_size} T={args.turns} R={args.reply_tokens}"
    first, mean, _ = _time(compiled, init(), key, args.steps)
    print(f"compiled step  ({shape}): first {first:.1f} s, then {mean:.2f} s/step", flush=True)
    first, mean, metrics = _time(host, init(), key, args.steps)
    print(f"host-env step  ({shape}): first {first:.1f} s, then {mean:.2f} s/step "
          f"(env {metrics['timing/host_env_seconds']:.2f} s of the last)", flush=True)
    host.close()


if __name__ == "__main__":
    main()
