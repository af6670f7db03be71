"""Scripted policies that play a JAX env, for demonstrations (starpo_jax.demonstrations).

    policy = make_policy("solver", env, max_actions_per_turn=5, max_turns=5,
                         max_actions_per_traj=10)
    actions = policy(state, key)     # one env state -> [A] int32, -1 after the turn's actions

A policy is any function `(env_state, key) -> actions`: one (unbatched) state of a JAX env, a
PRNG key, and the turn's actions as ids into env.action_names, A = max_actions_per_turn of them
at most, padded with -1 (the first -1 ends the turn). By name:
  random: 1 to A uniformly random actions (every action id is a valid move in the grid games:
    it teaches the answer format and nothing of the task);
  solver: Sokoban (one box): shortest-path moves from a breadth-first search over (player, box)
    cells, computed in JAX with the env's own step; FrozenLake: the optimal policy of the
    slippery MDP within the action budget (finite-horizon value iteration in JAX), played along
    the path the intended moves would take, ceil(budget / turns) actions a turn; Bandit: the
    high-risk arm.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from envs_jax.bandit.env import Bandit
from envs_jax.frozen_lake import types as fl
from envs_jax.frozen_lake.env import FrozenLake
from envs_jax.sokoban.env import Sokoban

Policy = Callable[[Any, jax.Array], jax.Array]
POLICY_NAMES = ("random", "solver")
_SOLVED_ENVS = (Sokoban, FrozenLake, Bandit)


def make_policy(name: str, env: Any, *, max_actions_per_turn: int, max_turns: int,
                max_actions_per_traj: int) -> Policy:
    """The policy called `name` (POLICY_NAMES) for `env`. Raises ValueError naming the valid
    names, or the envs that have a solver."""
    if name == "random":
        return random_policy(env, max_actions_per_turn)
    if name != "solver":
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICY_NAMES)} or a "
                         "function (env_state, key) -> actions")
    if isinstance(env, Sokoban):
        return sokoban_solver(env, max_actions_per_turn)
    if isinstance(env, FrozenLake):
        per_turn = min(max_actions_per_turn, math.ceil(max_actions_per_traj / max_turns))
        return frozen_lake_solver(env, max_actions_per_turn, per_turn, max_actions_per_traj)
    if isinstance(env, Bandit):
        return bandit_solver(env, max_actions_per_turn)
    raise ValueError(f"no 'solver' policy for {type(env).__name__}; valid: 'random', or "
                     f"'solver' for {', '.join(e.__name__ for e in _SOLVED_ENVS)}")


def _padded(actions: jax.Array, count: jax.Array) -> jax.Array:
    """actions [A] int32 with -1 from position `count` on."""
    return jnp.where(jnp.arange(actions.shape[0]) < count, actions, -1).astype(jnp.int32)


def random_policy(env: Any, max_actions_per_turn: int) -> Policy:
    """1..A uniformly random action ids (A = max_actions_per_turn)."""
    names = len(env.action_names)
    if names == 0:
        raise ValueError(f"{type(env).__name__} has no action names (a free-text env); the "
                         "'random' policy picks among action names")

    def policy(state: Any, key: jax.Array) -> jax.Array:
        count_key, action_key = jax.random.split(key)
        count = jax.random.randint(count_key, (), 1, max_actions_per_turn + 1)
        return _padded(jax.random.randint(action_key, (max_actions_per_turn,), 0, names), count)

    return policy


def bandit_solver(env: Bandit, max_actions_per_turn: int) -> Policy:
    """Always the high-risk arm (id 1: the arm with the higher expected reward in RAGEN)."""
    del env

    def policy(state: Any, key: jax.Array) -> jax.Array:
        return _padded(jnp.ones((max_actions_per_turn,), jnp.int32), 1)

    return policy


_UNREACHED = 1 << 20


def sokoban_distances(env: Sokoban, state: Any) -> tuple[jax.Array, jax.Array]:
    """Shortest solution lengths of a one-box level from every (player, box) cell pair.

    state: one Sokoban state (its walls and targets are read). Returns (distances [N * N]
    int32, index N * player + box, _UNREACHED where no solution; next [N * N, 4] int32, the
    pair each action leads to), N = rows * cols. Moves are `env.step`'s own.
    """
    rows, cols = env.dim_room
    n = rows * cols
    cells = jnp.arange(n)
    player = jnp.repeat(cells, n)
    box = jnp.tile(cells, n)

    def step(p, b, action):
        boxes = (jnp.arange(n) == b).reshape(rows, cols)
        s = state.replace(player=jnp.stack([p // cols, p % cols]).astype(jnp.int32), boxes=boxes,
                          step_count=jnp.int32(0), success=jnp.bool_(False))
        new, _ = env.step(s, action)
        return new.player[0] * cols + new.player[1], jnp.argmax(new.boxes.reshape(-1))

    actions = jnp.arange(4)
    p2, b2 = jax.vmap(lambda p, b: jax.vmap(lambda a: step(p, b, a))(actions))(player, box)
    nxt = (p2 * n + b2).astype(jnp.int32)  # [N * N, 4]
    solved = state.targets.reshape(-1)[box]
    start = jnp.where(solved, 0, _UNREACHED).astype(jnp.int32)

    def relax(carry):
        dist, _ = carry
        new = jnp.minimum(dist, 1 + jnp.min(dist[nxt], axis=1))
        return new, jnp.any(new != dist)

    dist, _ = jax.lax.while_loop(lambda c: c[1], relax, (start, jnp.bool_(True)))
    return dist, nxt


def sokoban_solver(env: Sokoban, max_actions_per_turn: int) -> Policy:
    """Up to A moves of a shortest solution (fewer when it is shorter); an unsolvable level
    (a deadlock) gets one Up."""
    if env.num_boxes != 1:
        raise ValueError(f"the Sokoban solver policy handles num_boxes=1; this env has "
                         f"num_boxes={env.num_boxes}")
    rows, cols = env.dim_room
    n = rows * cols

    def policy(state: Any, key: jax.Array) -> jax.Array:
        dist, nxt = sokoban_distances(env, state)
        box = jnp.argmax(state.boxes.reshape(-1))
        here = (state.player[0] * cols + state.player[1]) * n + box

        def move(s, _):
            action = jnp.argmin(dist[nxt[s]]).astype(jnp.int32)
            return nxt[s, action], action

        _, actions = jax.lax.scan(move, here, None, length=max_actions_per_turn)
        left = dist[here]
        count = jnp.where(left >= _UNREACHED, 1, jnp.clip(left, 1, max_actions_per_turn))
        return _padded(jnp.where(left >= _UNREACHED, 3, actions), count)  # 3: Up

    return policy


def frozen_lake_values(env: FrozenLake, tiles: jax.Array, horizon: int) -> jax.Array:
    """Q[h, cell, action]: the best probability of reaching the goal with h + 1 actions left,
    taking `action` first, from each cell of a map (tiles [S, S] int32), under the env's slip
    (each of the intended and the two perpendicular directions 1/3 when slippery). [H, S*S, 4]
    float32, H = horizon."""
    size = env.size
    cells = jnp.arange(size * size)
    pos = jnp.stack([cells // size, cells % size], axis=1)
    moves = jnp.asarray(fl.MOVES, jnp.int32)
    flat = tiles.reshape(-1)
    slips = (-1, 0, 1) if env.slippery else (0,)

    def lands(action):  # [S*S, len(slips)] the cell each slip lands on
        d = (action + jnp.asarray(slips)) % 4
        to = jnp.clip(pos[:, None, :] + moves[d][None], 0, size - 1)
        return to[..., 0] * size + to[..., 1]

    landing = jax.vmap(lands)(jnp.arange(4))  # [4, S*S, k]
    goal = (flat == fl.GOAL).astype(jnp.float32)
    alive = (flat == fl.FROZEN).astype(jnp.float32)

    def backup(value, _):  # value [S*S]: best with h actions left, from a frozen cell
        after = goal[landing] + alive[landing] * value[landing]  # [4, S*S, k]
        q = after.mean(-1).T  # [S*S, 4]
        return jnp.max(q, axis=1), q

    _, qs = jax.lax.scan(backup, jnp.zeros(size * size, jnp.float32), None, length=horizon)
    return qs


def frozen_lake_solver(env: FrozenLake, max_actions_per_turn: int, per_turn: int,
                       budget: int) -> Policy:
    """`per_turn` actions of the finite-horizon optimal policy (horizon = the action budget
    left, from the state's step count), each chosen at the cell the previous intended move
    would reach (a turn's actions are fixed before they are taken)."""
    size = env.size
    moves = jnp.asarray(fl.MOVES, jnp.int32)

    def policy(state: Any, key: jax.Array) -> jax.Array:
        qs = frozen_lake_values(env, state.tiles, budget)

        def act(carry, _):
            at, used = carry
            left = jnp.clip(budget - state.step_count - used, 1, budget)
            action = jnp.argmax(qs[left - 1, at[0] * size + at[1]]).astype(jnp.int32)
            return (jnp.clip(at + moves[action], 0, size - 1), used + 1), action

        _, actions = jax.lax.scan(act, (state.player, jnp.int32(0)), None,
                                  length=max_actions_per_turn)
        return _padded(actions, per_turn)

    return policy
