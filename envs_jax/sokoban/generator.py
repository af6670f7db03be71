"""In-JAX level generator following the original's (RAGEN's fork of gym-sokoban's) recipe.

One attempt, all from the level's random stream:
1. carve the room: a random walk of int(1.7 * (h + w)) steps that turns w.p. 0.35 and stamps one
   of five 3x3 floor masks at each position, then walls on the border;
2. put the player and `num_boxes` targets on distinct random floor cells, boxes on the targets;
3. play backwards with pull moves only (the player walks; a box right behind it follows) and
   keep the most scrambled state, scored as the original scores it:
   (#times the pulled box changed) x (sum of box-to-own-target Manhattan distances), and 0 while
   any box or the player covers a target;
4. walk the player 0-3 random steps (w.p. 0.8 if the boxes moved one cell in total, else 0.5).

The original's step 3 is an exhaustive depth-first search (up to `search_depth` - 2 pulls deep).
Here it is `num_playouts` random playouts of `playout_length` effective pulls each, run side by
side; their lengths and number are calibrated so that the optimal solution lengths of the levels
match the original's (see tests/test_sokoban_generator.py, which compares to a plain-Python copy
of the DFS recipe).

An attempt is invalid when the room has too few floor cells or the best score is 0. Each attempt
carves `screen_rooms` rooms and plays out only the first that a cheap check says can score
(`_room`), since most of the cost is in the playouts. Invalid attempts are redrawn inside a
`lax.while_loop` capped at `max_attempts` attempts per level; under vmap the whole batch shares
that loop and its draws (`_search`), so a batch costs about the draws its levels need in total.
If every attempt fails (vanishingly rare) a fixed, solvable fallback level is returned.

Speed notes (XLA on CPU): randomness is one threefry call per level, then a counter hash; grids
in the hot loops are row or flat bit masks; per-direction and per-box values are separate arrays
so that every op runs across the (batch x playouts) lanes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.sokoban import constants as c
from envs_jax.sokoban.playouts import pack_bits, reverse_playouts

# Floor stamps of the carving walk (the original's five masks), centred on the walker.
_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=bool,
)
# Each mask as 9 bits, bit 3 * row + col.
_MASK_BITS = np.array([sum(1 << i for i in np.flatnonzero(m)) for m in _MASKS], np.uint32)
_MOVES = np.array(c.MOVES, np.int32)


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """Static settings of the generator (hashable, validated by `Sokoban`)."""

    dim_room: tuple[int, int]
    num_boxes: int
    search_depth: int
    num_playouts: int
    playout_length: int
    max_attempts: int
    slot_divisor: int
    screen_rooms: int


class Level(NamedTuple):
    """A generated level: walls, targets, boxes bool [H, W]; player int32 [2] (row, col);
    `attempts` int32 [] the number of candidates drawn (0 if the fallback level was used)."""

    walls: chex.Array
    targets: chex.Array
    boxes: chex.Array
    player: chex.Array
    attempts: chex.Array


class _Candidate(NamedTuple):
    floor: chex.Array  # [N] bool
    targets: chex.Array  # [nb] int32 flat cells
    boxes: chex.Array  # [nb] int32 flat cells
    player: chex.Array  # [] int32 flat cell
    valid: chex.Array  # [] bool


def _fmix32(x: chex.Array) -> chex.Array:
    """MurmurHash3's 32-bit finaliser (a bijection of uint32 that mixes every bit)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _words(seed: chex.Array, counter: chex.Array, count: int) -> chex.Array:
    """uint32 [count] pseudo-random words number counter..counter+count-1 of stream `seed` [2].

    A counter hash, where a threefry call per attempt would cost more than a playout and,
    on CPU, ~0.5 s of compile time per call site.
    """
    i = counter.astype(jnp.uint32) + jnp.arange(count, dtype=jnp.uint32)
    return _fmix32(_fmix32(i ^ seed[0]) + seed[1])


def _below(word: chex.Array, k: int | chex.Array) -> chex.Array:
    """A uniform int32 in [0, k) from a uint32 word (its top 24 bits; k < 256)."""
    return (((word >> 8) * jnp.asarray(k, jnp.uint32)) >> 24).astype(jnp.int32)


def _chance(word: chex.Array, p: float) -> chex.Array:
    """True with probability p (to 2^-32) from a uint32 word."""
    return word < jnp.uint32(min(int(p * 2**32), 2**32 - 1))


def carve_room(words: chex.Array, dim_room: tuple[int, int]) -> chex.Array:
    """Floor cells of a randomly carved room: bool [H, W] (False on the border).

    words: uint32 [carve_words(dim_room)] random words (one per walk step, then 3).
    """
    h, w = dim_room
    num_steps = int(c.CARVE_STEPS_PER_SIDE * (h + w))
    steps, extra = words[:num_steps], words[num_steps:]
    turn = (steps & 0xFFFF) < int(c.P_CHANGE_DIRECTION * 2**16)
    new_dir = ((steps >> 16) & 3).astype(jnp.int32)
    mask_id = ((steps >> 18) * len(_MASKS)) >> 14
    pattern = _select(mask_id, [int(m) for m in _MASK_BITS], jnp.uint32)  # [S] 9-bit masks

    def walk(carry, x):
        direction, row, col, rows = carry
        turn_now, new, stamp = x
        direction = jnp.where(turn_now, new, direction)
        # The original clamps each step into [1, side - 2].
        row = jnp.clip(row + _select(direction, [int(m) for m in _MOVES[:, 0]]), 1, h - 2)
        col = jnp.clip(col + _select(direction, [int(m) for m in _MOVES[:, 1]]), 1, w - 2)
        # Floor as one bit mask per row: the 3x3 stamp is three 3-bit row slices.
        shift = (col - 1).astype(jnp.uint32)
        for k in range(3):
            piece = ((stamp >> (3 * k)) & 7) << shift
            rows = rows | jnp.where(jnp.arange(h) == row - 1 + k, piece, jnp.uint32(0))
        return (direction, row, col, rows), None

    # The original starts anywhere in [1, side - 1].
    start = (_below(extra[2], 4), 1 + _below(extra[0], h - 1), 1 + _below(extra[1], w - 1))
    init = (*start, jnp.zeros(h, jnp.uint32))
    (*_, rows), _ = jax.lax.scan(walk, init, (turn, new_dir, pattern))
    floor = ((rows[:, None] >> jnp.arange(w, dtype=jnp.uint32)) & 1).astype(bool)
    r, col = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
    return floor & (r > 0) & (r < h - 1) & (col > 0) & (col < w - 1)


def _select(index: chex.Array, values: list[int], dtype=jnp.int32) -> chex.Array:
    """values[index] for a short list of Python ints, as a chain of selects.

    The generator builds no array constants: `jax.custom_batching.custom_vmap` (see
    `_searcher`) rejects closed-over constants once an outer vmap batches them (as jumanji's
    auto-reset wrapper does through its lax.cond).
    """
    out = jnp.full(index.shape, values[0], dtype)
    for i, v in enumerate(values[1:], 1):
        out = jnp.where(index == i, v, out)
    return out


def carve_words(dim_room: tuple[int, int]) -> int:
    """How many random words `carve_room` takes."""
    return int(c.CARVE_STEPS_PER_SIDE * sum(dim_room)) + 3


def _room(words: chex.Array, cfg: GeneratorConfig) -> tuple[chex.Array, ...]:
    """Steps 1-2 and a cheap screen: (floor bool [N], player int32 [], targets int32 [nb],
    promising bool []).

    words: uint32 [carve_words + N]. `promising` is False only for rooms where no playout can
    score: too little floor, a box with no (floor, floor) pair to be pulled along, or no box
    the player can reach a pulling position of. With one box it is exact (a single pull scores).
    """
    h, w = cfg.dim_room
    n = h * w
    num_carve = carve_words(cfg.dim_room)
    floor = carve_room(words[:num_carve], cfg.dim_room)  # [H, W]
    flat = floor.reshape(n)
    # Distinct random floor cells, by random priority: the first is the player, then targets.
    priority = jnp.where(flat, words[num_carve:] | 1, 0)
    cells = []
    for _ in range(cfg.num_boxes + 1):
        cell = jnp.argmax(priority).astype(jnp.int32)
        cells.append(cell)
        priority = jnp.where(jnp.arange(n) == cell, 0, priority)
    player, targets = cells[0], jnp.stack(cells[1:])

    # Where the player can walk with every box on its target: flood fill over row bit masks.
    col_bits = jnp.uint32(1) << jnp.arange(w, dtype=jnp.uint32)
    is_box = jnp.any(jnp.arange(n)[:, None] == targets[None, :], axis=1).reshape(h, w)
    open_rows = jnp.sum(jnp.where(floor & ~is_box, col_bits, 0), axis=1, dtype=jnp.uint32)
    start = jnp.where(jnp.arange(h) == player // w, jnp.uint32(1) << (player % w), 0)

    def spread(_, reach):
        zero = jnp.zeros(1, jnp.uint32)
        near = jnp.concatenate([zero, reach[:-1]]) | jnp.concatenate([reach[1:], zero])
        return (reach | (reach << 1) | (reach >> 1) | near) & open_rows

    reach = jax.lax.fori_loop(0, (h - 2) * (w - 2), spread, start.astype(jnp.uint32))
    reach = ((reach[:, None] & col_bits) != 0).reshape(n)
    pullable, reachable = [], []
    for t in (targets[i] for i in range(cfg.num_boxes)):
        for dr, dc in _MOVES:
            a = jnp.clip(t + int(dr * w + dc), 0, n - 1)  # off-grid only behind a wall
            b = jnp.clip(t + 2 * int(dr * w + dc), 0, n - 1)
            pair = flat[a] & flat[b]
            pullable.append(pair)
            # The first pull: every box is still on its target.
            reachable.append(pair & reach[a] & jnp.all(targets != b))
    per_box = jnp.stack(pullable).reshape(cfg.num_boxes, 4)
    promising = (
        (jnp.sum(flat) > cfg.num_boxes + 1)
        & jnp.all(jnp.any(per_box, axis=1))
        & functools.reduce(jnp.logical_or, reachable)
    )
    return flat, player, targets, promising


def _candidate(seed: chex.Array, attempt: chex.Array, cfg: GeneratorConfig) -> _Candidate:
    """Attempt number `attempt` of steps 1-3 (module docstring) from stream `seed` uint32 [2].

    Draws `screen_rooms` rooms and plays out only the first promising one (see `_room`): a
    room the screen rejects could never be valid, so the rooms accepted are distributed as
    before, at a fraction of the playouts.
    """
    n = cfg.dim_room[0] * cfg.dim_room[1]
    per_room = carve_words(cfg.dim_room) + n
    count = cfg.screen_rooms * per_room + cfg.num_playouts
    words = _words(seed, attempt * count, count)
    rooms = jax.vmap(lambda x: _room(x, cfg))(
        words[: cfg.screen_rooms * per_room].reshape(cfg.screen_rooms, per_room)
    )
    k = jnp.argmax(rooms[3])
    floor, player, targets, promising = jax.tree.map(lambda x: x[k], rooms)
    seeds = words[cfg.screen_rooms * per_room :] | 1  # xorshift never leaves 0
    score, player, boxes = reverse_playouts(
        seeds, pack_bits(~floor), targets, player, cfg.dim_room[1], cfg.playout_length
    )
    return _Candidate(floor, targets, boxes, player, promising & (score > 0))


def _wander(words: chex.Array, cand: _Candidate, width: int) -> chex.Array:
    """Step 4: the player's cell after 0-3 random steps onto free, not yet visited cells.

    words: uint32 [WANDER_WORDS] random words.
    """
    deltas = jnp.asarray(_MOVES[:, 0] * width + _MOVES[:, 1])
    t_row, t_col = cand.targets // width, cand.targets % width
    disp = jnp.sum(jnp.abs(cand.boxes // width - t_row) + jnp.abs(cand.boxes % width - t_col))
    go = jnp.where(disp == 1, _chance(words[0], 0.8), _chance(words[0], 0.5))
    noise = words[1:].reshape(3, 5)  # per step: 4 direction draws, 1 continue draw
    free = cand.floor & ~jnp.zeros_like(cand.floor).at[cand.boxes].set(True)

    def step(carry, x):
        p, visited, moving = carry
        ahead = p + deltas
        ok = free[ahead] & ~jnp.any(ahead[:, None] == visited[None, :], axis=1)
        a = jnp.argmax(jnp.where(ok, x[:4] | 1, 0))
        moved = moving & ok[a]
        p = jnp.where(moved, ahead[a], p)
        visited = jnp.concatenate([visited[1:], p[None]])
        return (p, visited, moved & _chance(x[4], 0.5)), None

    visited = jnp.full((4,), cand.player)
    (p, _, _), _ = jax.lax.scan(step, (cand.player, visited, go), noise)
    return p


WANDER_WORDS = 16


def fallback_level(cfg: GeneratorConfig) -> Level:
    """A fixed solvable level: targets on interior row 1, boxes below them, player below box 0.

    Needs h >= 5 and w - 2 >= num_boxes (checked by `Sokoban`).
    """
    h, w = cfg.dim_room
    walls = np.ones((h, w), bool)
    walls[1:-1, 1:-1] = False
    targets = np.zeros((h, w), bool)
    boxes = np.zeros((h, w), bool)
    targets[1, 1 : 1 + cfg.num_boxes] = True
    boxes[2, 1 : 1 + cfg.num_boxes] = True
    return Level(
        jnp.asarray(walls), jnp.asarray(targets), jnp.asarray(boxes),
        jnp.array([3, 1], jnp.int32), jnp.int32(0),
    )


def _search(seeds: chex.Array, cfg: GeneratorConfig) -> tuple[_Candidate, chex.Array]:
    """First valid attempt of each level: (candidates [B, ...], attempts int32 [B], 0 if none).

    seeds: uint32 [B, 2], each level's random stream; attempt a of a level reads its a-th
    stretch, so a level depends on its seed only. Each round fills `slots` side-by-side draws
    with the levels still pending,
    in order: while there are more pending levels than slots, each gets one draw; once fewer
    remain, each gets several consecutive attempts at once. So a batch costs about as many draws
    as its levels need in total, not B times what its unluckiest level needs (what a vmapped
    retry loop would cost).
    """
    b = seeds.shape[0]
    slots = max(1, -(-b // cfg.slot_divisor))
    slot = jnp.arange(slots)
    draw = jax.vmap(lambda seed, a: _candidate(seed, a, cfg))
    never = jnp.int32(cfg.max_attempts)

    def pending(carry):
        done, next_attempt, _, _ = carry
        return jnp.any(~done & (next_attempt < cfg.max_attempts))

    def one_round(carry):
        done, next_attempt, best, attempts = carry
        waiting = ~done & (next_attempt < cfg.max_attempts)
        num = jnp.sum(waiting, dtype=jnp.int32)
        # The waiting levels in index order, as many as there are slots.
        rank = jnp.cumsum(waiting, dtype=jnp.int32) - 1
        queue = jnp.zeros(slots, jnp.int32).at[jnp.where(waiting, rank, slots)].set(
            jnp.arange(b, dtype=jnp.int32), mode="drop"
        )
        served = jnp.maximum(jnp.minimum(num, slots), 1)
        level = queue[slot % served]
        attempt = next_attempt[level] + slot // served
        used = (num > 0) & (attempt < cfg.max_attempts)
        cands = draw(seeds[level], attempt)
        ok = used & cands.valid
        first = jax.ops.segment_min(jnp.where(ok, attempt, never), level, num_segments=b)
        dest = jnp.where(ok & (attempt == first[level]), level, b)
        best = jax.tree.map(lambda r, x: r.at[dest].set(x, mode="drop"), best, cands)
        attempts = attempts.at[dest].set(attempt + 1, mode="drop")
        next_attempt = next_attempt + jax.ops.segment_sum(
            used.astype(jnp.int32), level, num_segments=b
        )
        return done | (first < never), next_attempt, best, attempts

    n = cfg.dim_room[0] * cfg.dim_room[1]
    empty = _Candidate(
        jnp.zeros((b, n), bool), jnp.zeros((b, cfg.num_boxes), jnp.int32),
        jnp.zeros((b, cfg.num_boxes), jnp.int32), jnp.zeros(b, jnp.int32), jnp.zeros(b, bool),
    )
    init = (jnp.zeros(b, bool), jnp.zeros(b, jnp.int32), empty, jnp.zeros(b, jnp.int32))
    _, _, best, attempts = jax.lax.while_loop(pending, one_round, init)
    return best, attempts


@functools.cache
def _searcher(cfg: GeneratorConfig):
    """`_search` for one key, whose vmap runs `_search` on the whole batch of keys at once."""

    @jax.custom_batching.custom_vmap
    def search_one(seed):
        return jax.tree.map(lambda x: x[0], _search(seed[None], cfg))

    @search_one.def_vmap
    def search_batch(axis_size, in_batched, seed):
        if not in_batched[0]:
            seed = jnp.broadcast_to(seed, (axis_size, *seed.shape))
        out = _search(seed, cfg)
        return out, jax.tree.map(lambda _: True, out)

    return search_one


def generate(key: chex.PRNGKey, cfg: GeneratorConfig) -> Level:
    """A solvable level drawn from `key` (pure; jit/vmap-able). See the module docstring.

    Under vmap the retries of the whole batch share one pool of draws (see `_search`).
    """
    h, w = cfg.dim_room
    n = h * w
    # One threefry call per level; everything else hashes these words (see `_words`).
    words = jax.random.bits(key, (2 + WANDER_WORDS,), jnp.uint32)
    cand, attempts = _searcher(cfg)(words[:2])
    found = attempts > 0
    player = _wander(words[2:], cand, w)
    generated = Level(
        walls=~cand.floor.reshape(h, w),
        targets=jnp.zeros(n, bool).at[cand.targets].set(True).reshape(h, w),
        boxes=jnp.zeros(n, bool).at[cand.boxes].set(True).reshape(h, w),
        player=jnp.stack([player // w, player % w]).astype(jnp.int32),
        attempts=attempts,
    )
    return jax.tree.map(lambda g, f: jnp.where(found, g, f), generated, fallback_level(cfg))
