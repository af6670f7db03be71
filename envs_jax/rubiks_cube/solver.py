"""Optimal 2x2 cube solutions in JAX by meeting in the middle, and the "solver" policy.

The cube counts as solved whenever every face is one colour, whichever colour: the 24 ways the
whole cube can sit (and, with the original's B turns, mirrored colourings) all count. So the
search compares colour *patterns*: a colouring relabelled by first appearance (sticker 0's
colour becomes 0, the next new colour 1, ...). A plan b solves state s exactly when s's pattern
is the pattern of the solved cube taken back through b. Hence:

- backward table (host, once): for every word sequence b of length 0..HALF, the pattern of
  the state b solves; a pattern keeps its shortest b; sorted for binary search;
- forward (JAX, per state): the state after every sequence a of length 0..HALF, its pattern
  looked up in the table; the best a + b is an optimal plan when one of length <= 2 * HALF
  exists (the original's scrambles are 5 turns: 1,885 lookups a state).

A pattern is two uint32 words, twelve stickers each in base 6 (6**12 < 2**32).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.rubiks_cube import moves

HALF = 3  # sequences searched from each side: plans of up to 2 * HALF turns are optimal
NONE = 1 << 20  # distance of a state beyond the search
_WORDS = len(moves.ACTION_NAMES)


def _sequences(most: int) -> list[tuple[int, ...]]:
    return [s for n in range(most + 1) for s in itertools.product(range(_WORDS), repeat=n)]


def _compose(perms: np.ndarray, seq: tuple[int, ...]) -> np.ndarray:
    """The [24] permutation of playing `seq`: c -> c[p1][p2]... = c[p1[p2[...]]]."""
    out = np.arange(24)
    for a in seq:
        out = out[perms[a]]
    return out


def _pattern(colours: np.ndarray) -> np.ndarray:
    """Host: [..., 24] colours -> [..., 2] uint32 pattern keys (module docstring)."""
    colours = np.asarray(colours)
    first = np.where(colours[..., None] == np.arange(6), np.arange(24)[:, None], 24).min(-2)
    rank = np.argsort(np.argsort(first, axis=-1), axis=-1)
    canon = np.take_along_axis(rank, colours, axis=-1).astype(np.uint64)
    weights = 6 ** np.arange(12, dtype=np.uint64)
    return np.stack([(canon[..., :12] * weights).sum(-1), (canon[..., 12:] * weights).sum(-1)],
                    -1).astype(np.uint32)


def pattern(colours: jax.Array) -> jax.Array:
    """JAX twin of _pattern for [..., 24] int colours."""
    colours = colours.astype(jnp.int32)
    first = jnp.where(colours[..., None] == jnp.arange(6), jnp.arange(24)[:, None], 24).min(-2)
    rank = jnp.argsort(jnp.argsort(first, axis=-1), axis=-1)
    canon = jnp.take_along_axis(rank, colours, axis=-1).astype(jnp.uint32)
    weights = jnp.asarray(6 ** np.arange(12, dtype=np.uint64), jnp.uint32)
    return jnp.stack([(canon[..., :12] * weights).sum(-1, dtype=jnp.uint32),
                      (canon[..., 12:] * weights).sum(-1, dtype=jnp.uint32)], -1)


@functools.cache
def tables(moves_rule: str) -> dict[str, np.ndarray]:
    """Host tables of the search for a moves rule (cached): forward permutations [F, 24], plans
    [F, HALF] (-1 padded) and lengths [F]; the backward table's sorted keys [K, 2], plans
    [K, HALF] and lengths [K]."""
    perms = moves.permutations(moves_rule)
    seqs = _sequences(HALF)
    plans = np.array([list(s) + [-1] * (HALF - len(s)) for s in seqs], np.int32)
    lengths = np.array([len(s) for s in seqs], np.int32)
    forward = np.stack([_compose(perms, s) for s in seqs]).astype(np.int32)
    # The state b solves: s with s[Q_b] = solved, i.e. s[Q_b[i]] = solved[i].
    solved = np.repeat(np.arange(6), 4)
    states = np.empty((len(seqs), 24), np.int64)
    np.put_along_axis(states, forward, np.broadcast_to(solved, states.shape), axis=1)
    keys = _pattern(states)
    order = np.lexsort((lengths, keys[:, 1], keys[:, 0]))  # by key, then shortest first
    keys, back_plans, back_lengths = keys[order], plans[order], lengths[order]
    first = np.ones(len(keys), bool)
    first[1:] = np.any(keys[1:] != keys[:-1], axis=1)
    return dict(forward=forward, plans=plans, lengths=lengths, keys=keys[first],
                back_plans=back_plans[first], back_lengths=back_lengths[first])


def _find(keys: jax.Array, query: jax.Array) -> jax.Array:
    """Index of `query` [2] uint32 in the lexicographically sorted `keys` [K, 2], or -1."""
    size = keys.shape[0]

    def less(i):  # keys[i] < query
        return (keys[i, 0] < query[0]) | ((keys[i, 0] == query[0]) & (keys[i, 1] < query[1]))

    def body(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        go_right = less(mid)
        return jnp.where(go_right, mid + 1, lo), jnp.where(go_right, hi, mid)

    lo, _ = jax.lax.fori_loop(0, int(np.ceil(np.log2(size + 1))) + 1, body,
                              (jnp.int32(0), jnp.int32(size)))
    at = jnp.minimum(lo, size - 1)
    return jnp.where(jnp.all(keys[at] == query), at, -1)


def solve(cube: jax.Array, moves_rule: str = "ragen", at_least_one: bool = False):
    """An optimal plan for one cube [6, 2, 2]: (plan [2 * HALF] int32 word ids, -1 padded;
    length [] int32, NONE when no plan of <= 2 * HALF turns exists). at_least_one: a solved
    cube gets its shortest non-empty plan (the env wants a move) instead of the empty one."""
    t = tables(moves_rule)
    flat = cube.reshape(-1)
    states = flat[jnp.asarray(t["forward"])]  # [F, 24]
    found = jax.vmap(_find, in_axes=(None, 0))(jnp.asarray(t["keys"]), pattern(states))
    back = jnp.asarray(t["back_lengths"])[jnp.maximum(found, 0)]
    total = jnp.where(found >= 0, jnp.asarray(t["lengths"]) + back, NONE)
    if at_least_one:
        total = jnp.where(total == 0, NONE, total)
    best = jnp.argmin(total)
    a = jnp.asarray(t["plans"])[best]
    b = jnp.asarray(t["back_plans"])[jnp.maximum(found[best], 0)]
    n = jnp.asarray(t["lengths"])[best]
    # The plan: a's n words, then b's.
    joined = jnp.concatenate([a, b, jnp.full((HALF,), -1, jnp.int32)])
    index = jnp.arange(2 * HALF)
    plan = jnp.where(index < n, joined[jnp.minimum(index, HALF - 1)],
                     joined[HALF + jnp.clip(index - n, 0, HALF - 1)])
    plan = jnp.where(index < total[best], plan, -1)
    return plan.astype(jnp.int32), total[best].astype(jnp.int32)


def solver_policy(env, max_actions_per_turn: int):
    """policy(state, key) -> [A] int32: the first A words of an optimal plan (-1 after it).
    A state beyond 2 * HALF turns (not one the original's 5-turn scrambles make) gets one U."""

    def policy(state, key):
        plan, total = solve(state.cube, env.moves, at_least_one=True)
        width = max(max_actions_per_turn, 2 * HALF)
        padded = jnp.concatenate([plan, jnp.full((width - 2 * HALF,), -1, jnp.int32)])
        found = total < NONE
        head = jnp.where(found, padded[:max_actions_per_turn], -1)
        return head.at[0].set(jnp.where(found, head[0], 0))

    return policy
