"""Sokoban level generator and BFS solver: solvable, deterministic, batched, and as hard as the
original's levels (compared with a plain-Python rendition of the original's DFS recipe below)."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest

import envs_jax
from envs_jax.sokoban import NEW_VOCAB_SYMBOLS
from envs_jax.sokoban.generator import _room, carve_room, carve_words, fallback_level
from envs_jax.sokoban.solver import solve

NUM_LEVELS = 200  # solved with BFS; the batch generated is 1024 (one compile per config)
BATCH = 1024

# --- plain-Python reference: the original generator (RAGEN's fork of gym-sokoban) -------------
_MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
_MASKS = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ]
)


def _reference_walk(h, w, first_dir, start, steps):
    """The original's carving walk; steps yields (turn?, new direction, mask index) per step."""
    level = np.zeros((h, w), int)
    d = _MOVES[first_dir]
    pos = start
    for turn, new_dir, mask in steps:
        if turn:
            d = _MOVES[new_dir]
        pos = (min(max(pos[0] + d[0], 1), h - 2), min(max(pos[1] + d[1], 1), w - 2))
        level[pos[0] - 1 : pos[0] + 2, pos[1] - 1 : pos[1] + 2] += _MASKS[mask]
    floor = level > 0
    floor[[0, -1], :] = False
    floor[:, [0, -1]] = False
    return floor


def _reference_carve(rng, h, w):
    def steps():
        for _ in range(int(1.7 * (h + w))):
            turn = rng.random() < 0.35
            yield turn, rng.integers(4) if turn else None, rng.integers(5)

    first_dir = rng.integers(4)
    return _reference_walk(h, w, first_dir, (rng.integers(1, h), rng.integers(1, w)), steps())


def _reference_dfs(floor, targets, player, depth):
    """The original's exhaustive pull-only DFS; returns (best score, (player, boxes))."""
    explored, best = set(), [-1, None]

    def dfs(player, boxes, pulled, swaps, last, ttl):
        ttl -= 1
        key = (player, frozenset(zip(boxes, pulled)))
        if ttl <= 0 or key in explored:
            return
        explored.add(key)
        disp = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
        covered = player in targets or any(b in targets for b in boxes)
        score = 0 if covered else swaps * disp
        if score > best[0]:
            best[:] = [score, (player, boxes)]
        for dr, dc in _MOVES:
            ahead = (player[0] + dr, player[1] + dc)
            if not floor[ahead] or ahead in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            new_boxes, new_pulled, new_last = boxes, pulled, last
            if behind in boxes:
                i = boxes.index(behind)
                new_boxes = boxes[:i] + (player,) + boxes[i + 1 :]
                new_pulled = pulled[:i] + (True,) + pulled[i + 1 :]
                new_last = i
            dfs(ahead, new_boxes, new_pulled, swaps + (new_last != last), new_last, ttl)

    dfs(player, tuple(targets), (False,) * len(targets), 0, -1, depth)
    return best


def reference_level(rng, dim_room, num_boxes, search_depth) -> str:
    h, w = dim_room
    while True:
        floor = _reference_carve(rng, h, w)
        cells = [tuple(x) for x in np.argwhere(floor)]
        if len(cells) <= num_boxes + 1:
            continue
        picks = [cells[i] for i in rng.permutation(len(cells))[: num_boxes + 1]]
        player, targets = picks[0], picks[1:]
        score, best = _reference_dfs(floor, targets, player, search_depth)
        if score > 0:
            break
    player, boxes = best
    disp = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
    if rng.random() < (0.8 if disp == 1 else 0.5):
        visited = [player]
        for step in range(3):
            options = [(player[0] + dr, player[1] + dc) for dr, dc in _MOVES]
            options = [o for o in options if floor[o] and o not in boxes and o not in visited]
            if not options:
                break
            player = options[rng.integers(len(options))]
            visited.append(player)
            if step == 2 or rng.random() > 0.5:
                break
    grid = np.where(floor, "_", "#").astype(object)
    for t in targets:
        grid[t] = "O"
    for b in boxes:
        grid[b] = "X"
    grid[player] = "S" if player in targets else "P"
    return "\n".join("".join(row) for row in grid)


# --- the JAX generator ---------------------------------------------------------------------
CONFIGS = {
    "sokoban": dict(dim=(6, 6), boxes=1, depth=300, median=(2.5, 4.0)),
    "sokoban_large": dict(dim=(8, 8), boxes=2, depth=10, median=(4.0, 7.0)),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def generated(request):
    """(name, env, batched states, symbol ids [NUM_LEVELS, H, W], optimal solution lengths)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    env = envs_jax.make(request.param)
    reset = jax.jit(jax.vmap(env.reset))
    keys = jax.random.split(jax.random.key(2024), BATCH)
    states, timesteps = reset(keys)
    ids = np.asarray(timesteps.observation.grid)
    lengths = [solve(level) for level in ids[:NUM_LEVELS]]
    return request.param, env, reset, keys, states, ids, lengths


def test_every_generated_level_is_solvable_and_unsolved(generated):
    *_, lengths = generated
    assert all(n is not None and n >= 1 for n in lengths), lengths


def test_generated_levels_are_well_formed(generated):
    _, env, _, _, states, ids, _ = generated
    walls, boxes, targets = (np.asarray(x) for x in (states.walls, states.boxes, states.targets))
    assert (boxes.sum((1, 2)) == env.num_boxes).all()
    assert (targets.sum((1, 2)) == env.num_boxes).all()
    border = np.ones(env.dim_room, bool)
    border[1:-1, 1:-1] = False
    assert walls[:, border].all()
    assert not (boxes & walls).any() and not (targets & walls).any()
    assert ((ids == 5) | (ids == 6)).sum((1, 2)).tolist() == [1] * BATCH
    assert ids.shape == (BATCH, *env.dim_room)
    # The original never leaves a box on a target in a fresh level.
    assert not (boxes & targets).any()


def test_difficulty_matches_the_original(generated):
    name, *_, lengths = generated
    cfg = CONFIGS[name]
    low, high = cfg["median"]
    assert low <= np.median(lengths) <= high
    rng = np.random.default_rng(7)
    reference = [
        solve(reference_level(rng, cfg["dim"], cfg["boxes"], cfg["depth"]))
        for _ in range(NUM_LEVELS)
    ]
    # Two samples of 200 (sd ~2 moves): a 0.6 gap in means is ~3 standard errors.
    assert abs(np.mean(lengths) - np.mean(reference)) < 0.6, (np.mean(lengths), np.mean(reference))
    assert abs(np.max(lengths) - np.max(reference)) <= 3


def test_same_key_same_level_wherever_it_sits_in_the_batch(generated):
    _, env, reset, keys, states, ids, _ = generated
    order = np.random.default_rng(0).permutation(BATCH)
    _, again = reset(keys[order])
    np.testing.assert_array_equal(np.asarray(again.observation.grid), ids[order])
    assert len({level.tobytes() for level in ids}) > 0.9 * BATCH  # and keys differ


def _below(word: int, k: int) -> int:
    return ((word >> 8) * k) >> 24


@pytest.mark.parametrize("dim", [(6, 6), (8, 8), (5, 9), (10, 7)])
def test_carving_matches_the_original_walk_on_the_same_draws(dim):
    """carve_room decodes its words into the original's walk (first direction, start, then per
    step: turn w.p. 0.35 (16 bits), new direction (2 bits), mask (14 bits))."""
    h, w = dim
    num = carve_words(dim)
    words = np.random.default_rng(h * w).integers(0, 2**32, (50, num), dtype=np.uint32)
    carved = np.asarray(jax.jit(jax.vmap(lambda x: carve_room(x, dim)))(words))
    for row, floor in zip(words.tolist(), carved):
        steps = [
            ((x & 0xFFFF) < int(0.35 * 2**16), (x >> 16) & 3, ((x >> 18) * 5) >> 14)
            for x in row[: num - 3]
        ]
        start = (1 + _below(row[-3], h - 1), 1 + _below(row[-2], w - 1))
        np.testing.assert_array_equal(
            floor, _reference_walk(h, w, _below(row[-1], 4), start, steps)
        )


def test_one_box_screen_is_exact():
    """With one box, a room is kept for playouts iff the player can walk to a cell next to
    the box with floor beyond it (one pull then scores): the screen never drops a valid room."""
    cfg = envs_jax.make("sokoban").generator_config
    h, w = cfg.dim_room
    words = np.random.default_rng(1).integers(
        0, 2**32, (300, carve_words(cfg.dim_room) + h * w), dtype=np.uint32
    )
    floor, player, targets, promising = jax.jit(jax.vmap(lambda x: _room(x, cfg)))(words)
    expected = []
    for f, p, (t,) in zip(np.asarray(floor), np.asarray(player), np.asarray(targets)):
        seen, todo = {int(p)}, [int(p)]
        while todo:
            cell = todo.pop()
            for d in (-w, w, -1, 1):
                nxt = cell + d
                if f[nxt] and nxt != t and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        expected.append(any(t + d in seen and f[t + 2 * d] for d in (-w, w, -1, 1)))
    assert np.asarray(promising).tolist() == expected
    assert 0 < sum(expected) < len(expected)


def test_a_key_alone_gives_the_level_it_gives_in_a_batch(generated):
    """Unbatched reset runs the single-key path of the generator's custom_vmap."""
    _, env, _, keys, _, ids, _ = generated
    reset_one = jax.jit(env.reset)
    for i in (0, 517, BATCH - 1):
        np.testing.assert_array_equal(np.asarray(reset_one(keys[i])[1].observation.grid), ids[i])


def test_fallback_level_is_solvable():
    for name in ["sokoban", "sokoban_large"]:
        env = envs_jax.make(name)
        level = fallback_level(env.generator_config)
        state, _ = env._start(jax.random.key(0), *level[:4])
        # Push box 0 up, then per further box: down, right, up.
        assert solve(env.render_text(state)) == 1 + 3 * (env.num_boxes - 1)


# --- the solver ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "level, expected",
    [
        ("#####\n#PXO#\n#####", 1),
        ("######\n#P_XO#\n######", 2),
        ("######\n#OX_P#\n######", 2),  # push left: walk is not needed
        ("#####\n#P√_#\n#####", 0),  # already solved
        ("####\n#XP#\n#O_#\n####", None),  # box in a corner
        ("#######\n#PX_XO#\n#___O_#\n#######", None),  # two boxes in a row cannot be pushed
        ("#####\n#_O_#\n#_X_#\n#_P_#\n#####", 1),
        ("######\n#S_X_#\n#____#\n######", 7),  # from a target, walk around the box to push it back
        ("PXO", 1),  # no walls: off-grid counts as wall
    ],
)
def test_solver_known_levels(level, expected):
    assert solve(level) == expected


def test_solver_reads_ids_and_new_vocab():
    text = "######\n#P_XO#\n######"
    new_vocab = text.translate(str.maketrans("#_OXP", "W.GBA"))
    assert solve(new_vocab, symbols=NEW_VOCAB_SYMBOLS) == 2
    ids = np.array([[0] * 6, [0, 5, 1, 4, 2, 0], [0] * 6])
    assert solve(ids) == 2
