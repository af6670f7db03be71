"""Demonstrations of the free-text envs: the Countdown and Sudoku policies' answers, checked
with the envs' own parse and step and with Python's arithmetic, and their reply tokens, checked
against tokenizer.encode of the reply text and through the JSONL round trip."""

from __future__ import annotations

import functools
import math
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from starpo_jax.config import RolloutConfig  # noqa: E402
from starpo_jax.rollout.demonstrations import (build_reply_encoder, demonstrate,  # noqa: E402
                                               tokenize_conversations, transcripts)
from starpo_jax.rollout.policies import answer_samples, answer_symbols, make_policy  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from test_countdown import original_reward  # noqa: E402

SEP = " || "
WIDTH = 128  # answer item bytes given to the envs' parsers


def _texts(env, answers) -> list[str]:
    symbols = answer_symbols(env, SEP)
    return ["".join(symbols[i] for i in row) for row in np.asarray(answers)]


def _bytes(item: str):
    data = item.encode()
    return np.array(list(data) + [-1] * (WIDTH - len(data)), np.int32), np.int32(len(data))


def _policy(name, env, per_turn=1, **budget):
    return jax.jit(jax.vmap(make_policy(name, env, max_actions_per_turn=per_turn, max_turns=1,
                                        max_actions_per_traj=per_turn, **budget)))


@pytest.mark.parametrize("name,overrides", [("countdown", {}), ("countdown_5", {}),
                                            ("countdown", {"plus_minus_only": False})])
def test_countdown_solver_reaches_every_target(name, overrides):
    """64 instances: the solver's answer scores 1 with the env's own parse and step and with the
    original's Python check; the random policy's answers use exactly the numbers (0.1 at
    least) and rarely reach the target."""
    env = envs_jax.make(name, **overrides)
    states = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(11), 64))[0]
    keys = jax.random.split(jax.random.PRNGKey(1), 64)
    step = jax.jit(jax.vmap(lambda s, item, n: env.step(s, env.parse_action(item, n))[1]))
    rewards = {}
    for policy in ("solver", "random"):
        texts = _texts(env, _policy(policy, env)(states, keys))
        items, lengths = map(np.stack, zip(*(_bytes(t) for t in texts)))
        ts = step(states, items, lengths)
        rewards[policy] = np.asarray(ts.reward)
        host = jax.device_get(states)
        python = [original_reward(t, [int(x) for x in host.nums[b, : host.count[b]]],
                                  int(host.target[b])) for b, t in enumerate(texts)]
        np.testing.assert_allclose(rewards[policy], python, err_msg=str(texts[:4]))
        assert all(SEP.strip() not in t for t in texts)  # one answer item
    assert (rewards["solver"] == 1.0).all()
    assert (rewards["random"] >= 0.1).all() and (rewards["random"] == 1.0).mean() < 0.5


@pytest.mark.parametrize("name", ["sudoku_4x4", "sudoku"])
def test_sudoku_solver_fills_the_grid(name):
    """16 puzzles, 2 moves a turn, played with the env's own parse and step: the solver's
    placements are all correct and solve each puzzle in ceil(blanks / 2) turns; the random
    policy's moves parse and name an empty cell."""
    env = envs_jax.make(name)
    states = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.PRNGKey(5), 16))[0]
    blanks = np.asarray((states.grid == 0).sum(axis=(1, 2)))

    @jax.jit
    @jax.vmap
    def play(state, items, lengths, present):  # one state, its turn's moves [2, WIDTH]
        out = []
        for k in range(2):
            move = env.parse_action(items[k], lengths[k])
            was_empty = state.grid[jnp.clip(move.row - 1, 0, env.n - 1),
                                   jnp.clip(move.col - 1, 0, env.n - 1)] == 0
            new, ts = env.step(state, move)
            state = jax.tree.map(lambda a, b: jnp.where(present[k], a, b), new, state)
            out.append((move.parsed & was_empty, ts.reward, ts.extras["success"] & present[k]))
        return state, *(jnp.stack(x) for x in zip(*out))

    for policy, turns in (("solver", int(math.ceil(blanks.max() / 2))), ("random", 1)):
        answer = _policy(policy, env, per_turn=2)
        current, success = states, np.zeros(16, bool)
        for turn in range(turns):
            texts = _texts(env, answer(current, jax.random.split(jax.random.PRNGKey(turn), 16)))
            items = [t.split(SEP) for t in texts]
            assert all(1 <= len(i) <= 2 and all(re.fullmatch(r"\d,\d,\d", x) for x in i)
                       for i in items), texts
            present = np.array([[k < len(i) for k in range(2)] for i in items]) & ~success[:, None]
            moves = [[_bytes(i[k] if k < len(i) else "") for k in range(2)] for i in items]
            data = np.array([[m[0] for m in row] for row in moves])
            lengths = np.array([[m[1] for m in row] for row in moves])
            current, ok, reward, won = play(current, data, lengths, present)
            assert np.asarray(ok)[present].all()
            if policy == "solver":
                assert (np.asarray(reward)[present] >= 1.0).all()  # the solution's digit
            success |= np.asarray(won).any(axis=1)
        if policy == "solver":
            assert success.all() and turns == int(math.ceil(blanks.max() / 2))


@functools.cache
def _codec(tok, mode: str):
    """A Countdown codec (the reply encoders read only its template and forced prefix, which
    are every env's in a mode: a Sudoku codec takes minutes to build)."""
    return build_codec(tok, envs_jax.make("countdown"), mode=mode, max_tokens=64, verify=5)


# CI: think replies; nothink ones (the reply starts after the forced "<answer>") in the slow
# tier (README); that boundary is checked in CI on the grid games (test_sft.py).
@pytest.mark.parametrize("mode", [pytest.param("nothink", marks=pytest.mark.slow), "think"])
def test_free_text_reply_tokens_are_the_tokenizers_own(mode, qwen_style_tok):
    """On answers the encoder was not checked on, forced prefix + reply tokens equal
    tokenizer.encode of the whole reply text and the end of turn, for SmolLM2's tokenizer (the
    tiny model's too) and a Qwen2-style one."""
    from helpers.text_testing import smollm2_tokenizer

    head = "<answer>" if mode == "nothink" else (
        "<think>I will take the actions below.</think><answer>")
    for tok in (smollm2_tokenizer(), qwen_style_tok):
        codec = _codec(tok, mode)
        for name in ("countdown", "sudoku_4x4"):
            env = envs_jax.make(name)
            encoder = build_reply_encoder(tok, env, codec, max_actions_per_turn=2, verify=64)
            answers = answer_samples(env, 2, 32, seed=7)
            ids, lengths = jax.jit(jax.vmap(encoder.encode))(jnp.asarray(answers))
            for row, n, text in zip(np.asarray(ids), np.asarray(lengths), _texts(env, answers)):
                want = tok.encode(head + text + "</answer><|im_end|>", add_special_tokens=False)
                assert list(codec.forced_prefix_ids) + row[:n].tolist() == want, text


def test_countdown_demonstrations_round_trip():
    """Solver demonstrations in think mode: every row succeeds; the JSONL transcripts' answers
    reach the target in Python; the chat template re-tokenises them to the rollout's rows."""
    from helpers.text_testing import smollm2_tokenizer

    tok = smollm2_tokenizer()
    env = envs_jax.make("countdown")
    codec = _codec(tok, "think")
    config = RolloutConfig(groups=8, group_size=1, max_turns=1, reply_tokens=48, mode="think",
                           max_actions_per_turn=1, max_actions_per_traj=1)
    encoder = build_reply_encoder(tok, env, codec, max_actions_per_turn=1)
    policy = make_policy("solver", env, max_actions_per_turn=1, max_turns=1,
                         max_actions_per_traj=1)
    out = jax.device_get(jax.jit(lambda k: demonstrate(
        env, codec, config, policy, encoder, k, eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id))(jax.random.PRNGKey(2)))
    assert out.success.all() and out.format_ok.all()
    conversations = transcripts(out, tok, codec)
    for item in conversations:
        user, reply = item["messages"][1]["content"], item["messages"][2]["content"]
        target, nums = re.search(r"Target: (\d+), nums: \[([\d, ]+)\]", user).groups()
        answer = re.fullmatch(r"<think>.*</think><answer>(.*)</answer>", reply).group(1)
        assert original_reward(answer, [int(x) for x in nums.split(", ")], int(target)) == 1.0
    rows = tokenize_conversations(tok, conversations, length=out.tokens.shape[1],
                                  pad_id=tok.pad_token_id, skip_prefix="<think>")
    np.testing.assert_array_equal(rows.tokens, out.tokens)
    np.testing.assert_array_equal(rows.loss_mask, out.loss_mask)


def test_countdown_search_is_bounded():
    with pytest.raises(ValueError, match=r"the Countdown solver searches at most 100000 "
                                         r"expressions; .* has 2764800"):
        make_policy("solver", envs_jax.make("countdown", min_numbers=6, max_numbers=6,
                                            plus_minus_only=False),
                    max_actions_per_turn=1, max_turns=1, max_actions_per_traj=1)


def test_a_tokenizer_that_merges_prefix_and_answer_is_named():
    """A Qwen2-style tokenizer trained to merge ">(" cannot spell "<answer>" + "(12 + 3) ..."
    as the forced prefix's tokens followed by the reply's."""
    from helpers.text_testing import qwen_style_tokenizer

    env = envs_jax.make("countdown")
    tok = qwen_style_tokenizer((env.symbol_strings,), (env.instructions, *(
        f"<answer>({i} + 3) - 4</answer>" for i in range(300))))
    assert ">(" in tok.tokenize("<answer>(12 + 3)")
    codec = build_codec(tok, env, mode="nothink", max_tokens=64, verify=5)
    with pytest.raises(ValueError, match=r"Countdown answers: this tokenizer merges the forced "
                                         r"prefix '<answer>' with the reply that follows it"):
        build_reply_encoder(tok, env, codec, max_actions_per_turn=1, verify=64)
