"""The JAX-assembled conversation equals apply_chat_template; reward text; template checks."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import symbol_text  # noqa: E402
from starpo_jax.text import blocks as bk  # noqa: E402
from starpo_jax.text import Codec, build_codec, env_intro, format_reward, render_conversation_text  # noqa: E402
from starpo_jax.text.templates import PromptTemplate  # noqa: E402


_reward_symbols = jax.jit(bk.reward_symbols)  # one compile for the table, not one per eager op


@pytest.mark.parametrize(
    "value,text",
    [
        (0.0, "0"),
        (0.1, "0.1"),
        (-0.1, "-0.1"),
        (10.0, "10"),
        (9.9, "9.9"),
        (1.25, "1.25"),
        (-0.001, "0"),
        (0.125, "0.12"),
        (1e9, "999999.99"),
        (-1.1, "-1.1"),
        (10.9, "10.9"),
        (100.5, "100.5"),
    ],
)
def test_reward_text_host_and_jax(value, text):
    assert format_reward(value) == text
    spelled = "".join(bk.NUMBER_SYMBOLS[i] for i in np.asarray(_reward_symbols(jnp.float32(value))))
    assert spelled == text


@pytest.mark.parametrize(
    "bad",
    [
        dict(turn="Turn {turn}: {state}"),
        dict(reward="Reward"),
        dict(turn="{turn}{state}{actions_left}{oops}"),
        dict(forced_prefix="<answer>"),
    ],
)
def test_template_validation(bad):
    with pytest.raises(ValueError):
        PromptTemplate(**bad)


# The codec is an argument, not a constant, so its tables are not baked into the program.
_first = jax.jit(Codec.first_prompt)
_later = jax.jit(Codec.next_prompt)


@pytest.mark.parametrize("kind,mode", [("smollm2", "think"), ("qwen_style", "nothink")])
def test_conversation_equals_chat_template(request, kind, mode):
    env = envs_jax.make("frozen_lake")
    tok = request.getfixturevalue(f"{kind}_tok")
    codec = build_codec(tok, env, mode=mode, verify=100)
    rng = np.random.default_rng(0)
    turns = 5
    grids = rng.integers(0, len(env.symbol_strings), (turns, 4, 4)).astype(np.int32)
    rewards = rng.choice([0.0, 1.0, -0.1, 0.9], turns)
    left = [10 - 2 * k for k in range(turns)]
    tag = codec.template.forced_prefix
    replies = [
        f"{tag} step {k} </think> <answer> Left || Up </answer>"
        if mode == "think"
        else f"{tag} Down </answer>"
        for k in range(turns)
    ]
    reply_ids = [tok.encode(r, add_special_tokens=False) for r in replies]
    assert all(
        r[: len(codec.forced_prefix_ids)] == list(codec.forced_prefix_ids) for r in reply_ids
    )
    ids, n = _first(codec, grids[0], left[0])
    got = np.asarray(ids)[: int(n)].tolist()
    for k in range(1, turns + 1):
        convo = got + reply_ids[k - 1] + list(codec.closing_ids)
        messages = render_conversation_text(
            codec.template,
            env_intro(codec.template, env, max_actions_per_turn=5, max_actions_per_traj=10),
            [symbol_text(env.symbol_strings, g) for g in grids[:k]],
            replies[:k],
            rewards[:k],
            left[:k],
        )
        assert convo == tok.apply_chat_template(messages, tokenize=True, return_dict=False), k
        if k < turns:
            ids, n = _later(codec, k + 1, rewards[k - 1], grids[k], left[k])
            got = got + reply_ids[k - 1] + np.asarray(ids)[: int(n)].tolist()
