"""How far a policy that does not read the board gets on the suite's held-out Sokoban states.

The suite's SFT start (`random` demonstrations) answers every board greedily with the same move
repeated. This plays fixed move sequences, the same on every board (a board-blind policy), on the
64 held-out initial states of the suite's evaluations (eval.seed 0: run_keys(0)'s EVAL_STREAM, as
evaluation.heldout_keys draws them) with the env's own step, and prints per length: each single
move repeated, the mean over sequences (every sequence for lengths <= 8, 200,000 random ones for
10), and the best sequence with its rate on the same states and on 64 other ones (eval.seed 1:
the best is chosen on the first set, so its rate there is optimistic).

    python results/cpu/pilots/blind_ceiling.py      # ~1 minute on 2 cores; blind_ceiling.txt
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax import registry
from starpo_jax.run.evaluation import heldout_keys
from starpo_jax.run.experiment import run_keys

EPISODES = 64


def initial_states(env, eval_seed: int):
    reset_key, _ = heldout_keys(run_keys(eval_seed)[1])
    states, _ = jax.vmap(env.reset)(jax.random.split(reset_key, EPISODES))
    return states


def solved(env, states, seq: jax.Array) -> jax.Array:
    """[EPISODES] bool: each state solved at some point while playing `seq` [T] int32."""
    def body(carry, action):
        s, done = carry
        s, _ = jax.vmap(env.step)(s, jnp.full((EPISODES,), action))
        return (s, done | s.success), None
    (_, done), _ = jax.lax.scan(body, (states, states.success), seq)
    return done


def main() -> None:
    env = registry.make("sokoban")
    names = env.action_names
    held, other = initial_states(env, 0), initial_states(env, 1)
    rates = jax.jit(jax.vmap(lambda seq: solved(env, held, seq).mean()))
    other_rate = jax.jit(lambda seq: solved(env, other, seq).mean())
    print(f"board-blind move sequences on {EPISODES} held-out Sokoban states (eval.seed 0)")
    print(f"| moves | sequences | each move repeated ({'/'.join(names)}) | mean | best | "
          "best's rate | best's rate on eval.seed 1 |")
    print("|---:|---:|---|---:|---|---:|---:|")
    for length in (5, 8, 10):
        if length <= 8:
            seqs = np.array(list(itertools.product(range(len(names)), repeat=length)), np.int32)
        else:
            seqs = np.random.default_rng(0).integers(0, len(names), (200_000, length),
                                                     dtype=np.int32)
        r = np.concatenate([np.asarray(rates(jnp.asarray(seqs[i:i + 8192])))
                            for i in range(0, len(seqs), 8192)])
        best = seqs[int(np.argmax(r))]
        repeated = [float(rates(jnp.full((1, length), a, jnp.int32))[0]) for a in range(len(names))]
        print(f"| {length} | {len(seqs)} | {' / '.join(f'{100 * x:.1f}%' for x in repeated)} | "
              f"{100 * r.mean():.1f}% | {' '.join(names[a] for a in best)} | "
              f"{100 * r.max():.1f}% | "
              f"{100 * float(other_rate(jnp.asarray(best))):.1f}% |")


if __name__ == "__main__":
    main()
