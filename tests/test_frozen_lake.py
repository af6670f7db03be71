"""FrozenLake: the rules (hand-written maps), gymnasium's transition table, the map generator
against a plain-Python version of the original's, and the original's random-policy statistic."""

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

from envs_jax.frozen_lake import FrozenLake
from envs_jax.frozen_lake.types import GOAL, HOLE

KEY = jax.random.PRNGKey(0)
# Shared jitted functions and one batch size: compiling dominates these tests' time.
ENV, FLAT = FrozenLake(), FrozenLake(slippery=False)
FLAT_STEP = jax.jit(FLAT.step)
BATCH = 4096
BATCH_RESET = jax.jit(jax.vmap(ENV.reset))
LEFT, DOWN, RIGHT, UP = range(4)
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))
OPEN = "____\n_P__\n____\n___G"
GYM_4X4 = ("SFFF", "FHFH", "FFFH", "HFFG")


def from_gym(desc: tuple[str, ...]) -> str:
    """A gymnasium map as our text: S becomes the player, F frozen, H hole."""
    return "\n".join(row.replace("S", "P").replace("F", "_").replace("H", "O") for row in desc)


def random_policy_success(env: FrozenLake, key: jax.Array, text: str | None, steps: int = 10):
    """[] bool: a uniformly random policy reaches the goal within `steps` steps."""
    reset_key, action_key = jax.random.split(key)
    state, _ = env.reset(reset_key) if text is None else env.reset_from_text(text, reset_key)

    def body(carry, action):
        state, done, success = carry
        state, timestep = env.step(state, action)
        return (state, done | timestep.last(), success | (~done & timestep.extras["success"])), None

    actions = jax.random.randint(action_key, (steps,), 0, 4)
    (_, _, success), _ = jax.lax.scan(body, (state, False, False), actions)
    return success


@pytest.mark.parametrize(
    "text, action, after, reward, last, discount, success",
    [
        ("PO__\n____\n____\n___G", RIGHT, "_X__\n____\n____\n___G", 0.0, True, 0.0, False),
        ("____\n____\n____\n__PG", RIGHT, "____\n____\n____\n___√", 1.0, True, 0.0, True),
        ("P___\n____\n____\n___G", LEFT, "P___\n____\n____\n___G", 0.0, False, 1.0, False),
        ("P___\n____\n____\n___G", UP, "P___\n____\n____\n___G", 0.0, False, 1.0, False),
        ("P___\n____\n____\n___G", DOWN, "____\nP___\n____\n___G", 0.0, False, 1.0, False),
        ("____\n____\n____\nG__P", RIGHT, "____\n____\n____\nG__P", 0.0, False, 1.0, False),
        # A finished episode stays finished, with no second reward (gymnasium's absorbing states).
        ("____\n____\n____\n___√", LEFT, "____\n____\n____\n___√", 0.0, True, 0.0, True),
        ("X___\n____\n____\n___G", DOWN, "X___\n____\n____\n___G", 0.0, True, 0.0, False),
    ],
)
def test_rules_without_slip(text, action, after, reward, last, discount, success):
    state, first = FLAT.reset_from_text(text, KEY)
    assert FLAT.render_text(state) == text and bool(first.first())
    state, timestep = FLAT_STEP(state, jnp.int32(action))
    assert FLAT.render_text(state) == after
    assert float(timestep.reward) == reward
    assert bool(timestep.last()) == last
    assert float(timestep.discount) == discount
    assert bool(timestep.extras["success"]) == success
    assert bool(timestep.extras["action_is_effective"]) == (after != text)


def test_start_renders_as_frozen_once_left():
    state, _ = FLAT.reset_from_text(OPEN, KEY)
    state, _ = FLAT_STEP(state, jnp.int32(RIGHT))
    assert FLAT.render_text(state) == "____\n__P_\n____\n___G"


def test_truncation_at_max_steps():
    env = FrozenLake(slippery=False, max_steps=3)
    state, _ = env.reset_from_text("P___\n____\n____\n___G", KEY)
    kinds = []
    for _ in range(3):
        state, timestep = env.step(state, jnp.int32(LEFT))
        kinds.append((bool(timestep.last()), float(timestep.discount)))
    assert kinds == [(False, 1.0), (False, 1.0), (True, 1.0)]  # truncated, not terminated


SLIP_STEP = jax.jit(jax.vmap(ENV.step, (0, None)))


@pytest.mark.parametrize("action", range(4))
def test_slip_frequencies(action):
    n = 30_000
    state, _ = ENV.reset_from_text(OPEN, KEY)
    states = jax.vmap(lambda k: state.replace(key=k))(jax.random.split(KEY, n))
    players = SLIP_STEP(states, jnp.int32(action))[0].player
    offsets = [tuple(d) for d in np.asarray(players) - np.array([1, 1])]
    for k in (-1, 0, 1):
        freq = offsets.count(MOVES[(action + k) % 4]) / n
        assert abs(freq - 1 / 3) < 0.015, (action, k, freq)
    assert offsets.count(MOVES[(action + 2) % 4]) == 0


def test_transitions_match_gymnasium_table():
    """Each of our three slip branches (forced via slippery=False) is one of gymnasium's."""
    generated = jax.tree.map(lambda x: x[:3], BATCH_RESET(jax.random.split(KEY, BATCH))[0])
    texts = [FLAT.render_text(jax.tree.map(lambda x: x[i], generated)) for i in range(3)]
    for text in [from_gym(GYM_4X4), *texts]:
        start, _ = FLAT.reset_from_text(text, KEY)
        desc = [
            "".join("S" if (r, c) == tuple(start.start) else "FHG"[t] for c, t in enumerate(row))
            for r, row in enumerate(np.asarray(start.tiles))
        ]
        table = FrozenLakeEnv(desc=desc, is_slippery=True).unwrapped.P
        for cell in range(16):
            state = start.replace(player=jnp.asarray(divmod(cell, 4), jnp.int32))
            for action in range(4):
                ours = []
                for k in (-1, 0, 1):
                    nxt, ts = FLAT_STEP(state, jnp.int32((action + k) % 4))
                    row, col = np.asarray(nxt.player)
                    ours.append((int(row * 4 + col), float(ts.reward), bool(ts.discount == 0)))
                branches = table[cell][action]  # (prob, next, reward, terminated), 1/3 or 1
                theirs = [(s, float(r), d) for p, s, r, d in branches for _ in range(round(p * 3))]
                assert sorted(ours) == sorted(theirs), (text, cell, action)


def bfs_has_path(tiles: np.ndarray, start: tuple[int, int]) -> bool:
    """Plain-Python reference: goal reachable from start over non-hole cells."""
    size = tiles.shape[0]
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if tiles[r, c] == GOAL:
            return True
        for dr, dc in MOVES:
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < size and 0 <= nxt[1] < size and nxt not in seen and tiles[nxt] != HOLE:
                seen.add(nxt)
                queue.append(nxt)
    return False


@pytest.mark.parametrize(
    "size, p, tries",
    [(4, 0.8, 64), (5, 0.2, 1)],  # the second one relies on the thawed corridor
)
def test_every_generated_map_has_a_path(size, p, tries):
    if (size, p, tries) == (4, 0.8, 64):
        states = BATCH_RESET(jax.random.split(KEY, BATCH))[0]
    else:
        env = FrozenLake(size=size, p=p, max_map_tries=tries)
        states = jax.jit(jax.vmap(env.reset))(jax.random.split(KEY, 500))[0]
    for tiles, start, player in zip(*map(np.asarray, (states.tiles, states.start, states.player))):
        assert (tiles == GOAL).sum() == 1 and tiles[tuple(start)] != HOLE
        assert (player == start).all()
        assert bfs_has_path(tiles, tuple(start))


def test_same_key_same_map_and_keys_differ():
    keys = jax.random.split(KEY, BATCH)
    first, again = BATCH_RESET(keys)[0], BATCH_RESET(keys)[0]
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), first, again)))
    one = jax.jit(ENV.reset)(keys[5])[0]
    assert ENV.render_text(one) == ENV.render_text(jax.tree.map(lambda x: x[5], first))
    maps = np.concatenate([first.tiles.reshape(BATCH, -1), first.start], axis=1)[:100]
    assert len({m.tobytes() for m in np.asarray(maps)}) > 90


def original_generator(rng: np.random.Generator, size: int = 4, p: float = 0.8):
    """Plain-Python reference of the original's rejection sampler: (holes, start-goal distance)."""
    while True:
        holes = rng.random((size, size)) >= p
        while True:
            start, goal = tuple(rng.integers(0, size, 2)), tuple(rng.integers(0, size, 2))
            if start != goal:
                break
        tiles = np.where(holes, HOLE, 0)
        tiles[start], tiles[goal] = 0, GOAL
        if bfs_has_path(tiles, start):
            return (tiles == HOLE).sum(), abs(start[0] - goal[0]) + abs(start[1] - goal[1])


def test_generator_matches_original_distribution():
    rng = np.random.default_rng(0)
    ref = np.array([original_generator(rng) for _ in range(3000)], float)
    states = BATCH_RESET(jax.random.split(jax.random.PRNGKey(3), BATCH))[0]
    holes = np.asarray((states.tiles == HOLE).sum((1, 2)))
    goals = np.argwhere(np.asarray(states.tiles) == GOAL)[:, 1:]
    distance = np.abs(goals - np.asarray(states.start)).sum(1)
    assert abs(holes.mean() - ref[:, 0].mean()) < 0.15, (holes.mean(), ref[:, 0].mean())
    assert abs(distance.mean() - ref[:, 1].mean()) < 0.12, (distance.mean(), ref[:, 1].mean())


def exact_random_success(desc: tuple[str, ...], steps: int) -> float:
    """Reference from gymnasium's own transition table: P(random policy hits G within steps)."""
    table = FrozenLakeEnv(desc=list(desc), is_slippery=True).unwrapped.P
    flat = "".join(desc)
    value = np.zeros(len(flat))
    for _ in range(steps):
        value = np.array([
            0.0 if flat[s] in "GH" else sum(
                0.25 * p * (r if d else value[s2]) for a in range(4) for p, s2, r, d in table[s][a]
            )
            for s in range(len(flat))
        ])
    return float(value[flat.index("S")])


def test_random_policy_on_gymnasium_map_matches_exact_value():
    keys = jax.random.split(KEY, 40_000)
    ours = jax.jit(jax.vmap(lambda k: random_policy_success(ENV, k, from_gym(GYM_4X4))))(keys)
    exact = exact_random_success(GYM_4X4, 10)  # 0.55%
    assert abs(float(ours.mean()) - exact) < 0.0025, (float(ours.mean()), exact)


def test_random_policy_success_band_on_random_maps():
    """The original reports 22.7% of its maps; a plain-Python run of its generator gives
    22.1% +- 0.2% (10k maps, exact values); ours measures 21.7% (400k episodes)."""
    keys = jax.random.split(jax.random.PRNGKey(7), 20_000)
    rate = float(jax.jit(jax.vmap(lambda k: random_policy_success(ENV, k, None)))(keys).mean())
    assert 0.19 < rate < 0.25, rate


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": 1}, "size must be an int >= 2; got 1"),
        ({"size": 4.0}, "size"),
        ({"p": 0.0}, r"p \(probability a tile is frozen\) must be in \(0, 1\]; got 0.0"),
        ({"p": 1.2}, "p "),
        ({"max_steps": 0}, "max_steps must be an int >= 1"),
        ({"max_map_tries": 0}, "max_map_tries"),
        ({"slippery": 1}, "slippery must be a bool"),
    ],
)
def test_constructor_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FrozenLake(**kwargs)


@pytest.mark.parametrize(
    "text, match",
    [
        ("P___\n____\n____", "expected 4 rows of 4 symbols; got 3 rows"),
        ("P___\n____\n___\n___G", "lengths"),
        ("P___\n__#_\n____\n___G", r"unknown symbols \['#'\]"),
        ("P___\n____\n____\n____", "0 goals"),
        ("PP__\n____\n____\n___G", "2 players"),
        ("P__G\n____\n____\n___G", "2 goals"),
    ],
)
def test_reset_from_text_rejects_malformed_maps(text, match):
    with pytest.raises(ValueError, match=match):
        FrozenLake().reset_from_text(text, KEY)
