"""Scripted-policy baselines of JAX envs: success of the random policy (and the solver, where the
env has one) on held-out initial states, under each env's own agent-side budget.

    PYTHONPATH=. python experiments/policy_baselines.py [--envs game_2048,rubiks_cube_2x2]
        [--states 256] [--seed 0]

Each state is played as the rollout plays it (envs_jax.settings(name): max_turns turns, each
turn the policy's actions up to the first -1, at most max_actions_per_turn of them, at most
max_actions_per_traj in all, until the episode ends), with the policies of
starpo_jax.rollout.policies.make_policy. Prints one markdown table: success rate, mean return,
mean env steps (and, for 2048, the median largest tile). The docs' rows
(docs/environments.md) come from this script.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from starpo_jax.rollout.policies import make_policy


def play(env, policy, key: jax.Array, states: int):
    """(success [N], return [N], steps [N], final states) of `states` episodes."""
    s = env.settings
    reset_key, play_key = jax.random.split(key)
    start, _ = jax.vmap(env.reset)(jax.random.split(reset_key, states))
    zeros = jnp.zeros((states,), jnp.int32)
    carry = (start, zeros + s.max_actions_per_traj, zeros.astype(bool), zeros.astype(bool),
             zeros.astype(jnp.float32), zeros)

    def turn(carry, turn_key):
        actions = jax.vmap(policy)(carry[0], jax.random.split(turn_key, states))  # [N, A]
        actions = actions[:, : s.max_actions_per_turn]
        live = jnp.ones((states,), bool)

        def act(inner, a):
            (state, left, done, won, total, steps), live = inner
            live = live & (a >= 0)
            go = live & (left > 0) & ~done
            new, ts = jax.vmap(env.step)(state, jnp.maximum(a, 0))
            state = jax.tree.map(lambda x, y: jnp.where(
                go.reshape(go.shape + (1,) * (x.ndim - 1)), x, y), new, state)
            carry = (state, left - go, done | (go & ts.last()),
                     jnp.where(go, ts.extras["success"], won), total + jnp.where(go, ts.reward, 0),
                     steps + go)
            return (carry, live), None

        (carry, _), _ = jax.lax.scan(act, (carry, live), actions.T)
        return carry, None

    carry, _ = jax.lax.scan(turn, carry, jax.random.split(play_key, s.max_turns))
    state, _, _, won, total, steps = carry
    return won, total, steps, state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", default="game_2048,rubiks_cube_2x2,maze")
    parser.add_argument("--states", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| env | policy | success | mean return | mean steps | note |")
    print("|---|---|---|---|---|---|")
    for name in args.envs.split(","):
        env = envs_jax.make(name)
        s = env.settings
        for policy_name in ("random", "solver"):
            try:
                policy = make_policy(policy_name, env, max_actions_per_turn=s.max_actions_per_turn,
                                     max_turns=s.max_turns,
                                     max_actions_per_traj=s.max_actions_per_traj)
            except ValueError:
                continue  # no solver for this env
            won, total, steps, state = jax.device_get(jax.jit(
                lambda k: play(env, policy, k, args.states))(jax.random.PRNGKey(args.seed)))
            note = ""
            if hasattr(state, "board"):  # 2048: the largest tile reached
                best = 2 ** np.asarray(state.board).max(axis=(1, 2))
                note = f"median largest tile {int(np.median(best))}"
            print(f"| {name} | {policy_name} | {np.mean(won):.1%} | {np.mean(total):.3f} | "
                  f"{np.mean(steps):.1f} | {note} |")


if __name__ == "__main__":
    main()
