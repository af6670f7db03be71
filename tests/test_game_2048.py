"""2048 on jumanji's Game2048 against a reference of the original (tests/helpers/ragen_2048.py):
the same observation text, rewards, ends and successes along 500 random action sequences from
the compiled env's own states, the original's spawn odds, and exact observation tokens."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import slot_text  # noqa: E402
from envs_jax.game_2048.env import Game2048  # noqa: E402
from helpers.ragen_2048 import Reference2048, slide  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402

SEQUENCES, STEPS = 500, 40


def dense_boards(key, count: int) -> jax.Array:
    """Nearly full boards (tiles up to 2048, two holes at most): games that end within a few
    moves, some of them with a 2048 tile (the original's success)."""
    tiles_key, holes_key = jax.random.split(key)
    board = jax.random.randint(tiles_key, (count, 4, 4), 1, 12, jnp.int32)
    holes = jax.random.randint(holes_key, (count, 2), 0, 17)  # 16: no hole
    cells = jnp.arange(16)[None]
    empty = (cells == holes[:, :1]) | (cells == holes[:, 1:])
    return jnp.where(empty.reshape(count, 4, 4), 0, board)


@pytest.fixture(scope="module")
def played():
    """(env, initial states, actions [N, T], per-step outputs) of SEQUENCES compiled games."""
    env = envs_jax.make("game_2048")
    keys = jax.random.split(jax.random.PRNGKey(0), SEQUENCES)
    states, _ = jax.jit(jax.vmap(env.reset))(keys)
    dense = SEQUENCES // 5  # the last fifth start from dense boards
    boards = states.board.at[-dense:].set(dense_boards(jax.random.PRNGKey(1), dense))
    masks = jax.vmap(env.env._get_action_mask)(boards)
    states = states.replace(board=boards, action_mask=masks)
    actions = jax.random.randint(jax.random.PRNGKey(2), (SEQUENCES, STEPS), 0, 4, jnp.int32)

    def game(state, acts):
        def body(s, a):
            s2, ts = env.step(s, a)
            out = (s2.board, env.render_symbols(s2), ts.reward, ts.last(),
                   ts.extras["success"], ts.extras["action_is_effective"])
            return s2, out
        return jax.lax.scan(body, state, acts)[1]

    outs = jax.device_get(jax.jit(jax.vmap(game))(states, actions))
    return env, jax.device_get(states), np.asarray(actions), outs


def values(exponents) -> np.ndarray:
    e = np.asarray(exponents, np.int64)
    return np.where(e > 0, 2**e, 0)


def test_games_follow_the_original(played):
    env, states, actions, (boards, symbols, rewards, last, success, effective) = played
    ended = won = invalid = 0
    for n in range(SEQUENCES):
        ref = Reference2048(values(states.board[n]), int(states.score[n]))
        if n < 3:  # the host rendering too (the rest: slot_text of the compiled symbols)
            assert env.render_text(jax.tree.map(lambda x, n=n: x[n], states)) == ref.render()
        for t in range(STEPS):
            after = values(boards[n, t])
            new = np.argwhere(after != slide(ref.grid, int(actions[n, t]))[0])
            spawn = None
            if len(new):
                assert len(new) == 1, (n, t)
                (r, c), = new
                spawn = (r, c, int(after[r, c]))
            reward, done, info = ref.step(int(actions[n, t]), spawn)
            assert np.array_equal(ref.grid, after), (n, t)
            assert rewards[n, t] == pytest.approx(reward, abs=1e-6), (n, t)
            assert bool(last[n, t]) == done and bool(success[n, t]) == info["success"], (n, t)
            assert bool(effective[n, t]) == info["action_is_effective"], (n, t)
            text = slot_text(env.observation_parts, jax.tree.map(lambda x: x[n, t], symbols))
            assert text == ref.render(), (n, t)
            invalid += not info["action_is_effective"]
            if done:
                ended += 1
                won += info["success"]
                break
    # The sequences reach what is compared: invalid moves, game overs, and wins.
    assert invalid > 100 and ended > 50 and won > 5, (invalid, ended, won)


def test_rewards_without_log_shaping():
    env = Game2048(use_log_reward=False)
    state, _ = env.reset(jax.random.PRNGKey(0))
    board = jnp.zeros((4, 4), jnp.int32).at[0, 0].set(1).at[0, 1].set(1)
    state = state.replace(board=board, action_mask=env.env._get_action_mask(board))
    _, ts = env.step(state, 0)  # Up: nothing moves
    assert float(ts.reward) == pytest.approx(-0.1) and not bool(ts.extras["action_is_effective"])
    _, ts = env.step(state, 3)  # Left: 2 + 2
    assert float(ts.reward) == 4.0


def test_start_and_spawn_follow_the_original():
    """Two starting tiles (jumanji starts with one), each a 2 with probability 0.9, in a
    uniformly random cell."""
    env = envs_jax.make("game_2048")
    states, _ = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(5), 4000))
    board = np.asarray(states.board)
    assert np.all((board > 0).sum(axis=(1, 2)) == 2)
    tiles = board[board > 0]
    assert set(np.unique(tiles)) == {1, 2}
    assert abs(np.mean(tiles == 1) - 0.9) < 0.015
    per_cell = (board > 0).sum(axis=0).reshape(-1)  # 500 expected in each
    assert per_cell.min() > 400 and per_cell.max() < 600
    one = Game2048(start_tiles=1, two_prob=0.5)
    states, _ = jax.jit(jax.vmap(one.reset))(jax.random.split(jax.random.PRNGKey(6), 2000))
    board = np.asarray(states.board)
    assert np.all((board > 0).sum(axis=(1, 2)) == 1)
    assert abs(np.mean(board[board > 0] == 1) - 0.5) < 0.04


@pytest.mark.parametrize("tok_name", ["smollm2_tok", "qwen_style_tok"])
def test_observation_tokens_are_the_tokenizers(request, played, tok_name):
    tok = request.getfixturevalue(tok_name)
    env, _, _, (_, symbols, *_) = played
    codec = build_codec(tok, env, verify=20)
    rows = jax.tree.map(lambda x: x[:, ::4].reshape(-1, *x.shape[2:])[:300], symbols)
    ids, lengths = jax.device_get(jax.jit(codec.render_observation)(rows))
    texts = [slot_text(env.observation_parts, jax.tree.map(lambda x, i=i: x[i], rows))
             for i in range(300)]
    want = tok(texts, add_special_tokens=False)["input_ids"]
    for row, n, expected in zip(ids, lengths, want):
        assert row[:n].tolist() == expected


@pytest.mark.parametrize("kwargs, match", [
    ({"size": 5}, "size must be an int in 2..4; got 5"),
    ({"two_prob": 1.5}, r"two_prob .* got 1.5"),
    ({"use_log_reward": 1}, "use_log_reward must be a bool; got 1"),
    ({"invalid_act_score": "x"}, "invalid_act_score must be a number; got 'x'"),
    ({"start_tiles": 0}, r"start_tiles must be an int in 1..16; got 0"),
])
def test_bad_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        envs_jax.make("game_2048", **kwargs)
