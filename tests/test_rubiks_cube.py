"""The 2x2 Rubik's cube on jumanji's RubiksCube against a reference of the original
(tests/helpers/ragen_rubiks.py): its twelve turns sticker for sticker, the same text, rewards,
ends and successes along 500 random action sequences from the compiled env's own scrambles,
the original's scramble, exact observation tokens, and the solver's optimality."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import slot_text  # noqa: E402
from envs_jax.rubiks_cube import moves, solver  # noqa: E402
from envs_jax.rubiks_cube.env import RubiksCube2x2  # noqa: E402
from helpers import ragen_rubiks as ref  # noqa: E402
from starpo_jax.rollout.policies import make_policy  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402

SEQUENCES, STEPS = 500, 20
# jumanji sticker value (the face it started on: U F R B L D) -> the original's colour index.
COLOUR = np.array([0, 2, 3, 4, 1, 5])


def stickers(cube) -> np.ndarray:
    """jumanji's cube [6, 2, 2] -> the original's 24 stickers (faces U L F R B D)."""
    cube = np.asarray(cube)
    return COLOUR[np.concatenate([cube[f].reshape(-1) for f in moves.ORIGINAL_FACES])]


def test_turns_are_the_originals():
    """Each word moves the stickers as the original's turn; B and B' only under moves="ragen"
    (moves="jumanji" keeps jumanji's rigid turns, which differ from the original's there)."""
    for rule in moves.MOVES:
        perms = moves.permutations(rule)
        for a, name in enumerate(moves.ACTION_NAMES):
            labels = np.arange(24).reshape(6, 2, 2)
            after = labels.reshape(-1)[perms[a]].reshape(6, 2, 2)
            ours = np.concatenate([after[f].reshape(-1) for f in moves.ORIGINAL_FACES])
            start = np.concatenate([labels[f].reshape(-1) for f in moves.ORIGINAL_FACES])
            same = np.array_equal(ours, start[ref.PERMUTATIONS[a]])
            assert same == (rule == "ragen" or not name.startswith("B")), (rule, name)


@pytest.fixture(scope="module")
def played():
    """(env, initial states, actions, per-step outputs): half the games from the registered
    5-turn scrambles, half from 1-turn ones (so that random play solves some)."""
    env = envs_jax.make("rubiks_cube_2x2")
    near = RubiksCube2x2(scramble_depth=1)
    keys = jax.random.split(jax.random.PRNGKey(0), SEQUENCES)
    far, _ = jax.jit(jax.vmap(env.reset))(keys[: SEQUENCES // 2])
    close, _ = jax.jit(jax.vmap(near.reset))(keys[SEQUENCES // 2:])
    states = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), far, close)
    actions = jax.random.randint(jax.random.PRNGKey(1), (SEQUENCES, STEPS), 0, 12, jnp.int32)

    def game(state, acts):
        def body(s, a):
            s2, ts = env.step(s, a)
            return s2, (env.render_symbols(s2), ts.reward, ts.last(), ts.extras["success"],
                        ts.extras["action_is_effective"])
        return jax.lax.scan(body, state, acts)[1]

    outs = jax.device_get(jax.jit(jax.vmap(game))(states, actions))
    return env, jax.device_get(states), np.asarray(actions), outs


def test_games_follow_the_original(played):
    env, states, actions, (symbols, rewards, last, success, effective) = played
    solved = timed_out = 0
    for n in range(SEQUENCES):
        cube = ref.ReferenceCube(stickers(states.cube[n]), int(states.step_count[n]))
        if n < 3:
            assert env.render_text(jax.tree.map(lambda x, n=n: x[n], states)) == cube.render()
        for t in range(STEPS):
            reward, done, info = cube.step(int(actions[n, t]))
            assert float(rewards[n, t]) == reward and bool(last[n, t]) == done, (n, t)
            assert bool(success[n, t]) == info["success"] and bool(effective[n, t]), (n, t)
            text = slot_text(env.observation_parts, jax.tree.map(lambda x: x[n, t], symbols))
            assert text == cube.render(), (n, t)
            if done:
                solved += info["success"]
                timed_out += not info["success"]
                break
    assert solved > 20 and timed_out > 100, (solved, timed_out)


def test_scrambles_are_the_originals():
    """Depth d: d turns, each uniform over the twelve quarter turns (jumanji's own scrambler
    also draws half turns)."""
    env = RubiksCube2x2(scramble_depth=1)
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(3), 2400))
    singles = {tuple(ref.SOLVED[ref.PERMUTATIONS[a]]): a for a in range(12)}
    seen = [singles[tuple(stickers(c))] for c in np.asarray(states.cube)]
    counts = np.bincount(seen, minlength=12)  # 200 expected each
    assert counts.min() > 140 and counts.max() < 260
    deep = envs_jax.make("rubiks_cube_2x2")
    states, _ = jax.jit(jax.vmap(deep.reset))(jax.random.split(jax.random.PRNGKey(4), 64))
    assert np.all(np.asarray(states.step_count) == 0)


def _solves_within(start: np.ndarray, length: int) -> bool:
    """Brute force on the reference's turns: does any sequence of `length` turns solve it?"""
    states = start[None]
    for _ in range(length):
        states = states[:, ref.PERMUTATIONS].reshape(-1, 24)
    faces = states.reshape(-1, 6, 4)
    return bool(np.any(np.all(faces == faces[:, :, :1], axis=(1, 2))))


def test_solver_plans_are_optimal():
    env = envs_jax.make("rubiks_cube_2x2")
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(7), 48))
    plans, totals = jax.device_get(jax.jit(jax.vmap(
        lambda c: solver.solve(c, "ragen")))(states.cube))
    step = jax.jit(env.step)
    lengths = []
    for n in range(48):
        total = int(totals[n])
        assert total <= 5  # five scrambling turns undo in five
        plan = [int(a) for a in plans[n] if a >= 0]
        assert len(plan) == total
        state = jax.tree.map(lambda x, n=n: x[n], states)
        cube = ref.ReferenceCube(stickers(state.cube))
        for a in plan:
            state, ts = step(state, a)
            cube.step(a)
        assert ref.is_solved(cube.stickers) and (not plan or bool(ts.extras["success"]))
        start = stickers(states.cube[n])
        for shorter in range(total):  # nothing shorter solves it (12**4 sequences at most)
            assert not _solves_within(start, shorter), (n, shorter)
        lengths.append(total)
    assert max(lengths) == 5 and min(lengths) <= 3


def test_solver_policy_plays_by_name():
    env = envs_jax.make("rubiks_cube_2x2")
    policy = make_policy("solver", env, max_actions_per_turn=4, max_turns=25,
                         max_actions_per_traj=20)
    state, _ = env.reset(jax.random.PRNGKey(11))
    done, turns = False, 0
    while not done:
        actions = np.asarray(jax.jit(policy)(state, jax.random.PRNGKey(0)))
        assert actions.shape == (4,) and actions[0] >= 0
        for a in actions[actions >= 0]:
            state, ts = env.step(state, int(a))
            done = bool(ts.last())
            if done:
                break
        turns += 1
    assert bool(ts.extras["success"]) and turns <= 2
    # A solved cube (the env still wants a move) gets a plan that leaves and restores it.
    solved = state.replace(step_count=jnp.int32(0))
    plan, total = solver.solve(solved.cube, "ragen", at_least_one=True)
    assert int(total) == 2


@pytest.mark.parametrize("tok_name", [
    "smollm2_tok", pytest.param("qwen_style_tok", marks=pytest.mark.slow),  # 80 s on 2 cores
])
def test_observation_tokens_are_the_tokenizers(request, played, tok_name):
    tok = request.getfixturevalue(tok_name)
    env, _, _, (symbols, *_) = played
    codec = build_codec(tok, env, verify=20)
    rows = jax.tree.map(lambda x: x[:, ::3].reshape(-1, *x.shape[2:])[:300], symbols)
    ids, lengths = jax.device_get(jax.jit(codec.render_observation)(rows))
    texts = [slot_text(env.observation_parts, jax.tree.map(lambda x, i=i: x[i], rows))
             for i in range(300)]
    want = tok(texts, add_special_tokens=False)["input_ids"]
    for row, n, expected in zip(ids, lengths, want):
        assert row[:n].tolist() == expected


@pytest.mark.parametrize("kwargs, match", [
    ({"scramble_depth": -1}, "scramble_depth must be an int >= 0; got -1"),
    ({"max_steps": 0}, "max_steps must be an int in 1..999; got 0"),
    ({"max_steps": 2.5}, "max_steps must be an int in 1..999; got 2.5"),
    ({"moves": "wca"}, r"moves must be one of \('ragen', 'jumanji'\); got 'wca'"),
])
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs_jax.make("rubiks_cube_2x2", **kwargs)
