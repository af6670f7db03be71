"""Free-text envs through the text layer: observations and prompts computed in JAX are the
tokenizer's own tokens of the rendered text, and replies parse into the env's actions."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.sudoku.parse import Move  # noqa: E402
from starpo_jax.text import Codec, build_codec, render_conversation_text  # noqa: E402
from starpo_jax.text.templates import env_intro  # noqa: E402

# countdown_5 renders through the same slots as countdown (one more number): not rebuilt here.
ENVS = ("countdown", "sudoku_4x4")
STATES = 128


@pytest.fixture(scope="module", params=["smollm2", "qwen_style"])
def tok(request):
    return request.getfixturevalue(f"{request.param}_tok")


_codecs: dict = {}


def codec_for(tok, name: str, mode: str = "think") -> Codec:
    key = (id(tok), name, mode)
    if key not in _codecs:
        _codecs[key] = build_codec(tok, envs_jax.make(name), mode=mode, verify=20)
    return _codecs[key]


def random_states(env, count: int, seed: int = 0):
    """Initial states, and for Sudoku states after 0..12 random moves of every kind."""
    keys = jax.random.split(jax.random.PRNGKey(seed), count)
    states, _ = jax.jit(jax.vmap(env.reset))(keys)
    if not isinstance(env, envs_jax.sudoku.Sudoku):
        return states
    rng = np.random.default_rng(seed)
    moves = Move(parsed=jnp.asarray(rng.random((12, count)) < 0.9),
                 row=jnp.asarray(rng.integers(0, env.n + 2, (12, count)), jnp.int32),
                 col=jnp.asarray(rng.integers(1, env.n + 1, (12, count)), jnp.int32),
                 num=jnp.asarray(rng.integers(1, env.n + 1, (12, count)), jnp.int32))
    taken = jnp.asarray(rng.integers(0, 13, count))

    @jax.jit
    def play(states):
        def one(states, x):
            k, move = x
            new, _ = jax.vmap(env.step)(states, move)
            go = k < taken
            return jax.tree.map(lambda a, b: jnp.where(
                go.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, states), None
        return jax.lax.scan(one, states, (jnp.arange(12), moves))[0]

    return play(states)


_render = jax.jit(Codec.render_observation)


@pytest.mark.optimized  # its time is running, not compiling (conftest)
@pytest.mark.parametrize("name", ENVS)
def test_observation_equals_encode(tok, name):
    env = envs_jax.make(name)
    codec = codec_for(tok, name)
    states = random_states(env, STATES)
    ids, lengths = jax.device_get(_render(codec, jax.vmap(env.render_symbols)(states)))
    texts = [env.render_text(jax.tree.map(lambda x, b=b: x[b], states)) for b in range(STATES)]
    want = tok(texts, add_special_tokens=False)["input_ids"]
    for row, n, expected, text in zip(ids, lengths, want, texts):
        assert row[:n].tolist() == expected, text
        assert np.all(row[n:] == -1)
    assert len(set(texts)) > STATES // 2


_first = jax.jit(Codec.first_prompt)
_later = jax.jit(Codec.next_prompt)


def test_sudoku_conversation_equals_chat_template(tok):
    env = envs_jax.make("sudoku_4x4")
    codec = codec_for(tok, "sudoku_4x4")
    states = random_states(env, 4, seed=1)
    symbols = [jax.tree.map(lambda x, b=b: x[b], jax.vmap(env.render_symbols)(states))
               for b in range(4)]
    texts = [env.render_text(jax.tree.map(lambda x, b=b: x[b], states)) for b in range(4)]
    replies = [f"<think> move {k} </think> <answer> place 2 at row 1 col {k + 1} </answer>"
               for k in range(4)]
    reply_ids = [tok.encode(r, add_special_tokens=False) for r in replies]
    rewards, left = [1.0, -0.1, 0.5, 11.0], [20, 19, 18, 17]
    ids, n = _first(codec, symbols[0], left[0])
    got = np.asarray(ids)[: int(n)].tolist()
    intro = env_intro(codec.template, env, max_actions_per_turn=env.settings.max_actions_per_turn,
                      max_actions_per_traj=env.settings.max_actions_per_traj)
    for k in range(1, 5):
        convo = got + reply_ids[k - 1] + list(codec.closing_ids)
        messages = render_conversation_text(codec.template, intro, texts[:k], replies[:k],
                                            rewards[:k], left[:k],
                                            max_tokens=env.settings.announced_tokens)
        assert convo == tok.apply_chat_template(messages, tokenize=True, return_dict=False), k
        if k < 4:
            ids, n = _later(codec, k + 1, rewards[k - 1], symbols[k], left[k])
            got = got + reply_ids[k - 1] + np.asarray(ids)[: int(n)].tolist()
    assert "Your available actions are" not in tok.decode(got)


def _parse(codec, tok, reply: str):
    ids = tok.encode(reply, add_special_tokens=False)
    return jax.jit(codec.parse_reply)(jnp.array([ids]), jnp.array([len(ids)]))


def test_countdown_reply_to_reward(smollm2_tok):
    env = envs_jax.make("countdown")
    codec = codec_for(smollm2_tok, "countdown")
    state, _ = jax.jit(env.reset)(jax.random.PRNGKey(4))
    nums = [int(x) for x in state.nums[: int(state.count)]]
    target = int(state.target)
    signs = next(s for s in np.ndindex(*(2,) * len(nums))
                 if sum(x if b else -x for x, b in zip(nums, s)) == target)
    expr = "".join(("+" if b else "-") + str(x) for x, b in zip(nums, signs)).lstrip("+")
    step = jax.jit(env.step)
    for answer, reward in ((expr, 1.0), (f"({expr}) + 0", 0.0), ("+".join(map(str, nums)), None)):
        parsed = _parse(codec, smollm2_tok, f"<think> sum </think> <answer> {answer} </answer>")
        assert bool(parsed.format_ok[0]) and int(parsed.num_actions[0]) == 1
        _, ts = step(state, jax.tree.map(lambda a: a[0, 0], parsed.actions))
        want = reward if reward is not None else (1.0 if sum(nums) == target else 0.1)
        assert float(ts.reward) == pytest.approx(want), answer
    parsed = _parse(codec, smollm2_tok, "<think> hm </think> no answer")
    assert not bool(parsed.format_ok[0]) and int(parsed.num_actions[0]) == 0


def test_sudoku_reply_with_several_moves(smollm2_tok):
    codec = codec_for(smollm2_tok, "sudoku_4x4")
    parsed = _parse(codec, smollm2_tok, "<think> a </think><answer> place 3 at row 1 col 2 || "
                    "2,4,1 ||  || nonsense </answer>")
    moves = jax.device_get(jax.tree.map(lambda a: a[0], parsed.actions))
    # Sudoku keeps 2 actions a turn (the original's max_actions_per_turn): "nonsense" is dropped.
    assert bool(parsed.format_ok[0]) and int(parsed.num_actions[0]) == 2
    assert [(bool(p), int(r), int(c), int(d)) for p, r, c, d in zip(*moves)][:2] == [
        (True, 1, 2, 3), (True, 2, 4, 1)]
