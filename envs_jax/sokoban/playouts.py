"""Random pull-only playouts: the generator's stand-in for the original's reverse DFS.

Bit-packed walls and per-lane scalars keep every op elementwise over the (batch x playouts)
lanes, which is what XLA on CPU runs fast.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
from jax import lax

from envs_jax.sokoban.constants import MOVES

def pack_bits(cells: chex.Array) -> chex.Array:
    """Bit-packs bool [N] into uint32 [ceil(N / 32)] (cell i is bit i % 32 of word i // 32).

    Lookups into packed words are a few elementwise ops, where a per-lane table gather under vmap
    is the slowest op of a playout step on CPU.
    """
    n = cells.shape[0]
    words = -(-n // 32)
    # Padding by concatenation: `.at[:n].set` on an exact multiple of 32 (an 8x8 room) traces a
    # scatter with an empty index constant, which custom_vmap rejects under an outer vmap.
    padded = jnp.concatenate([cells.astype(jnp.uint32), jnp.zeros(words * 32 - n, jnp.uint32)])
    return jnp.sum(padded.reshape(words, 32) << jnp.arange(32, dtype=jnp.uint32), axis=1,
                   dtype=jnp.uint32)


def bit_at(bits: chex.Array, cell: chex.Array) -> chex.Array:
    """Whether flat `cell` (int32, any shape) is set in packed `bits` uint32 [W]: bool."""
    word = cell >> 5
    picked = jnp.zeros(cell.shape, jnp.uint32)
    for w in range(bits.shape[0]):
        picked = picked | jnp.where(word == w, bits[w], jnp.uint32(0))
    return ((picked >> (cell & 31).astype(jnp.uint32)) & 1).astype(bool)


def _xorshift(x: chex.Array) -> chex.Array:
    """Marsaglia's xorshift32 step (uint32, never 0 from non-0): the playouts' cheap stream."""
    x = x ^ (x << 13)
    x = x ^ (x >> 17)
    return x ^ (x << 5)


def reverse_playouts(
    seeds: chex.Array,
    wall_bits: chex.Array,
    targets: chex.Array,
    player: chex.Array,
    width: int,
    length: int,
) -> tuple[chex.Array, chex.Array, chex.Array]:
    """Best (score [], player [], boxes [nb]) over random pull-only playouts, one per seed.

    seeds: uint32 [num_playouts], non-zero; wall_bits: packed uint32 [ceil(N / 32)] over flat
    cells of a room `width` wide; targets int32 [nb] (the boxes start on them); player int32 [];
    `length` moves per playout.

    Directions and boxes are unrolled into Python lists of per-playout scalars, so every op
    runs over the (batch x playouts) lanes: a trailing axis of 4 directions or 2 boxes would
    leave most of each SIMD register empty.
    """
    deltas = [int(dr * width + dc) for dr, dc in MOVES]
    goals = [targets[i] for i in range(targets.shape[0])]
    goal_rc = [(lax.div(t, width), lax.rem(t, width)) for t in goals]

    def score_of(p, boxes, swaps):
        disp = sum(
            jnp.abs(lax.div(b, width) - tr) + jnp.abs(lax.rem(b, width) - tc)
            for b, (tr, tc) in zip(boxes, goal_rc)
        )
        # Few targets: comparing against each is cheaper than a bit lookup.
        covered = functools.reduce(
            jnp.logical_or, [t == x for t in goals for x in (p, *boxes)]
        )
        return jnp.where(covered, 0, swaps * disp)

    def choose(p, boxes, rng):
        """(the next move: a flat delta, 0 if boxed in; the advanced rng)."""
        free = [
            ~functools.reduce(jnp.logical_or, [a == b for b in boxes], bit_at(wall_bits, a))
            for a in (p + d for d in deltas)
        ]
        # A uniformly random free direction: the DFS only counts moves that change the state.
        rng = _xorshift(rng)
        f = [x.astype(jnp.uint32) for x in free]
        rank = [jnp.uint32(0), f[0], f[0] + f[1], f[0] + f[1] + f[2]]
        pick = ((rng >> 16) * (rank[3] + f[3])) >> 16  # uniform in [0, number free)
        return sum(jnp.where(fr & (r == pick), d, 0) for fr, r, d in zip(free, rank, deltas)), rng

    def pull(carry, _):
        # The next move and the current score come in the carry (computed at the end of the
        # previous step), so XLA materialises them once instead of fusing a copy of their
        # computation into each of the ~10 carry outputs that read them.
        p, boxes, last, swaps, rng, step, score, best = carry
        better = score > best[0]
        best = jax.tree.map(lambda new, old: jnp.where(better, new, old), (score, p, boxes), best)
        behind = p - step  # a box there follows the player
        pulled = [(step != 0) & (b == behind) for b in boxes]
        boxes = tuple(jnp.where(x, p, b) for x, b in zip(pulled, boxes))
        p = p + step
        any_pull = functools.reduce(jnp.logical_or, pulled)
        box = sum(jnp.where(x, i, 0) for i, x in enumerate(pulled))
        swaps = swaps + (any_pull & (box != last))
        last = jnp.where(any_pull, box, last)
        step, rng = choose(p, boxes, rng)
        return (p, boxes, last, swaps, rng, step, score_of(p, boxes, swaps), best), None

    def playout(seed):
        start = tuple(goals)
        step, rng = choose(player, start, seed)
        best = (jnp.int32(0), player, start)
        init = (player, start, jnp.int32(-1), jnp.int32(0), rng, step, jnp.int32(0), best)
        (p, boxes, _, _, _, _, score, best), _ = jax.lax.scan(
            pull, init, None, length=length
        )
        better = score > best[0]
        return jax.tree.map(lambda new, old: jnp.where(better, new, old), (score, p, boxes), best)

    scores, players, boxes = jax.vmap(playout)(seeds)
    k = jnp.argmax(scores)
    return scores[k], players[k], jnp.stack([b[k] for b in boxes])
