"""In-JAX level generator following the original's (RAGEN's fork of gym-sokoban's) recipe.

One attempt, all from the key:
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

An attempt is invalid when the room has too few floor cells or the best score is 0; invalid
attempts are redrawn inside a `lax.while_loop` of at most `max_attempts` rounds, each round
drawing `attempts_per_round` candidates side by side and keeping the first valid one. If every
round fails (vanishingly rare) a fixed, solvable fallback level is returned.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.sokoban import constants as c

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
    attempts_per_round: int


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


def carve_room(key: chex.PRNGKey, dim_room: tuple[int, int]) -> chex.Array:
    """Floor cells of a randomly carved room: bool [H, W] (False on the border)."""
    h, w = dim_room
    num_steps = int(c.CARVE_STEPS_PER_SIDE * (h + w))
    k_dir, k_start, k_turn, k_new, k_mask = jax.random.split(key, 5)
    turn = jax.random.uniform(k_turn, (num_steps,)) < c.P_CHANGE_DIRECTION
    new_dir = jax.random.randint(k_new, (num_steps,), 0, 4)
    mask_id = jax.random.randint(k_mask, (num_steps,), 0, len(_MASKS))
    # The original starts anywhere in [1, side - 1] and clamps each step into [1, side - 2].
    start = jax.random.randint(k_start, (2,), 1, jnp.array([h, w]))
    hi = jnp.array([h - 2, w - 2])

    def walk(carry, x):
        direction, pos = carry
        turn_now, new = x
        direction = jnp.where(turn_now, new, direction)
        pos = jnp.clip(pos + jnp.asarray(_MOVES)[direction], 1, hi)
        return (direction, pos), pos

    first_dir = jax.random.randint(k_dir, (), 0, 4)
    _, pos = jax.lax.scan(walk, (first_dir, start), (turn, new_dir))  # [S, 2]
    rel_r = jnp.arange(h)[None, :, None] - pos[:, 0, None, None] + 1  # [S, H, 1]
    rel_c = jnp.arange(w)[None, None, :] - pos[:, 1, None, None] + 1  # [S, 1, W]
    inside = (rel_r >= 0) & (rel_r < 3) & (rel_c >= 0) & (rel_c < 3)
    row_i, col_i = jnp.clip(rel_r, 0, 2), jnp.clip(rel_c, 0, 2)
    stamp = jnp.asarray(_MASKS)[mask_id[:, None, None], row_i, col_i]
    floor = jnp.any(inside & stamp, axis=0)
    border = np.ones((h, w), bool)
    border[1:-1, 1:-1] = False
    return floor & ~border


def pack_bits(cells: chex.Array) -> chex.Array:
    """Bit-packs bool [N] into uint32 [ceil(N / 32)] (cell i is bit i % 32 of word i // 32).

    Lookups into packed words are a few elementwise ops, where a per-lane table gather under vmap
    is the slowest op of a playout step on CPU.
    """
    n = cells.shape[0]
    words = -(-n // 32)
    padded = jnp.zeros(words * 32, jnp.uint32).at[:n].set(cells.astype(jnp.uint32))
    return jnp.sum(padded.reshape(words, 32) << jnp.arange(32, dtype=jnp.uint32), axis=1,
                   dtype=jnp.uint32)


def bit_at(bits: chex.Array, cell: chex.Array) -> chex.Array:
    """Whether flat `cell` (int32, any shape) is set in packed `bits` uint32 [W]: bool."""
    word = cell >> 5
    picked = jnp.zeros(cell.shape, jnp.uint32)
    for w in range(bits.shape[0]):
        picked = picked | jnp.where(word == w, bits[w], jnp.uint32(0))
    return ((picked >> (cell & 31).astype(jnp.uint32)) & 1).astype(bool)


def _pick(values: chex.Array, onehot: chex.Array) -> chex.Array:
    """values[argmax(onehot)] along the last axis, as a masked sum (no gather under vmap)."""
    return jnp.sum(jnp.where(onehot, values, 0), axis=-1)


def _xorshift(x: chex.Array) -> chex.Array:
    """Marsaglia's xorshift32 step (uint32, never 0 from non-0): the playouts' cheap stream."""
    x = x ^ (x << 13)
    x = x ^ (x >> 17)
    return x ^ (x << 5)


def _reverse_playouts(
    key: chex.PRNGKey,
    wall_bits: chex.Array,
    target_bits: chex.Array,
    targets: chex.Array,
    player: chex.Array,
    cfg: GeneratorConfig,
) -> tuple[chex.Array, chex.Array, chex.Array]:
    """Best (score [], player [], boxes [nb]) over `num_playouts` random pull-only playouts.

    wall_bits, target_bits: packed uint32 [ceil(N / 32)] over flat cells; targets int32 [nb]
    (the boxes start on them); player int32 [].
    """
    width = cfg.dim_room[1]
    deltas = jnp.asarray(_MOVES[:, 0] * width + _MOVES[:, 1])  # [4]
    t_row, t_col = targets // width, targets % width

    def score_of(p, boxes, swaps):
        disp = jnp.sum(jnp.abs(boxes // width - t_row) + jnp.abs(boxes % width - t_col))
        covered = bit_at(target_bits, p) | jnp.any(bit_at(target_bits, boxes))
        return jnp.where(covered, 0, swaps * disp)

    def pull(carry, _):
        p, boxes, last, swaps, rng, best = carry
        ahead = p + deltas  # [4]
        free = ~(bit_at(wall_bits, ahead) | jnp.any(ahead[:, None] == boxes[None, :], axis=1))
        # A uniformly random free direction: the DFS only counts moves that change the state.
        rng = _xorshift(rng)
        num_free = jnp.sum(free, dtype=jnp.uint32)
        pick = ((rng >> 16) * num_free) >> 16  # uniform in [0, num_free)
        # Rank of each free direction among the free ones (an explicit prefix sum: cumsum
        # lowers to a slow reduce-window on CPU).
        f = free.astype(jnp.int32)
        rank = jnp.stack([jnp.int32(0) * f[0], f[0], f[0] + f[1], f[0] + f[1] + f[2]])
        chosen = free & (rank == pick.astype(jnp.int32))
        can = num_free > 0
        new_p = _pick(ahead, chosen)
        pulled = can & (boxes == 2 * p - new_p)  # [nb]: the box right behind the player
        boxes = jnp.where(pulled, p, boxes)
        p = jnp.where(can, new_p, p)
        any_pull = jnp.any(pulled)
        box = jnp.argmax(pulled)
        swaps = swaps + (any_pull & (box != last))
        last = jnp.where(any_pull, box, last)
        score = score_of(p, boxes, swaps)
        better = score > best[0]
        best = jax.tree.map(lambda new, old: jnp.where(better, new, old), (score, p, boxes), best)
        return (p, boxes, last, swaps, rng, best), None

    def playout(seed):
        start_best = (jnp.int32(0), player, targets)
        init = (player, targets, jnp.int32(-1), jnp.int32(0), seed, start_best)
        (*_, best), _ = jax.lax.scan(pull, init, None, length=cfg.playout_length)
        return best

    # Threefry per step would dominate the cost; one draw seeds a cheap xorshift per playout.
    seeds = jax.random.bits(key, (cfg.num_playouts,), jnp.uint32) | jnp.uint32(1)
    scores, players, boxes = jax.vmap(playout)(seeds)
    k = jnp.argmax(scores)
    return scores[k], players[k], boxes[k]


def _candidate(key: chex.PRNGKey, cfg: GeneratorConfig) -> _Candidate:
    """One attempt of steps 1-3 (module docstring)."""
    h, w = cfg.dim_room
    k_room, k_place, k_play = jax.random.split(key, 3)
    floor = carve_room(k_room, cfg.dim_room).reshape(h * w)
    # Distinct random floor cells: the first is the player, the rest are the targets.
    priority = jnp.where(floor, jax.random.uniform(k_place, (h * w,)), -1.0)
    cells = jax.lax.top_k(priority, cfg.num_boxes + 1)[1].astype(jnp.int32)
    player, targets = cells[0], cells[1:]
    is_target = jnp.zeros(h * w, bool).at[targets].set(True)
    score, player, boxes = _reverse_playouts(
        k_play, pack_bits(~floor), pack_bits(is_target), targets, player, cfg
    )
    enough_floor = jnp.sum(floor) > cfg.num_boxes + 1
    return _Candidate(floor, targets, boxes, player, enough_floor & (score > 0))


def _wander(key: chex.PRNGKey, cand: _Candidate, width: int) -> chex.Array:
    """Step 4: the player's cell after 0-3 random steps onto free, not yet visited cells."""
    deltas = jnp.asarray(_MOVES[:, 0] * width + _MOVES[:, 1])
    t_row, t_col = cand.targets // width, cand.targets % width
    disp = jnp.sum(jnp.abs(cand.boxes // width - t_row) + jnp.abs(cand.boxes % width - t_col))
    k_go, k_steps = jax.random.split(key)
    go = jax.random.uniform(k_go) < jnp.where(disp == 1, 0.8, 0.5)
    noise = jax.random.uniform(k_steps, (3, 5))  # per step: 4 direction draws, 1 continue draw
    free = cand.floor & ~jnp.zeros_like(cand.floor).at[cand.boxes].set(True)

    def step(carry, x):
        p, visited, moving = carry
        ahead = p + deltas
        ok = free[ahead] & ~jnp.any(ahead[:, None] == visited[None, :], axis=1)
        a = jnp.argmax(jnp.where(ok, x[:4], -1.0))
        moved = moving & ok[a]
        p = jnp.where(moved, ahead[a], p)
        visited = jnp.concatenate([visited[1:], p[None]])
        return (p, visited, moved & (x[4] <= 0.5)), None

    visited = jnp.full((4,), cand.player)
    (p, _, _), _ = jax.lax.scan(step, (cand.player, visited, go), noise)
    return p


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


def generate(key: chex.PRNGKey, cfg: GeneratorConfig) -> Level:
    """A solvable level drawn from `key` (pure; jit/vmap-able). See the module docstring."""
    h, w = cfg.dim_room
    n = h * w
    k_draw, k_wander = jax.random.split(key)
    draw = jax.vmap(lambda k: _candidate(k, cfg))

    def keep_drawing(carry):
        rnd, found, _ = carry
        return (~found) & (rnd < cfg.max_attempts)

    def one_round(carry):
        rnd, _, best = carry
        keys = jax.random.split(jax.random.fold_in(k_draw, rnd), cfg.attempts_per_round)
        cands = draw(keys)
        i = jnp.argmax(cands.valid)
        cand = jax.tree.map(lambda x: x[i], cands)
        attempts = rnd * cfg.attempts_per_round + i + 1
        return rnd + 1, cand.valid, (cand, attempts.astype(jnp.int32))

    empty = _Candidate(
        jnp.zeros(n, bool), jnp.zeros(cfg.num_boxes, jnp.int32),
        jnp.zeros(cfg.num_boxes, jnp.int32), jnp.int32(0), jnp.bool_(False),
    )
    _, found, (cand, attempts) = jax.lax.while_loop(
        keep_drawing, one_round, (jnp.int32(0), jnp.bool_(False), (empty, jnp.int32(0)))
    )
    player = _wander(k_wander, cand, w)
    generated = Level(
        walls=~cand.floor.reshape(h, w),
        targets=jnp.zeros(n, bool).at[cand.targets].set(True).reshape(h, w),
        boxes=jnp.zeros(n, bool).at[cand.boxes].set(True).reshape(h, w),
        player=jnp.stack([player // w, player % w]).astype(jnp.int32),
        attempts=attempts,
    )
    return jax.tree.map(lambda g, f: jnp.where(found, g, f), generated, fallback_level(cfg))
