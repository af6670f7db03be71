"""The codec renders real env states (reset + random play) exactly as the tokenizer encodes them.

test_text_render covers random symbol grids (a superset of the reachable states); this file ties
the codec to the envs themselves: states come from `env.reset` and `env.step`, the text from
`env.render_text`, and the ids from the public `build_codec(...).render_observation`.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import symbol_text  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402

# sokoban_large renders sokoban's symbols on a bigger grid: the slow tier (README).
ENVS = ("sokoban", pytest.param("sokoban_large", marks=pytest.mark.slow), "sokoban_new_vocab",
        "frozen_lake", "bandit", "bandit_test")
KEYS = 250  # x 4 time points (reset and 3 random steps) = 1000 states per env
STEPS = 3


def play(env, key):
    """States [STEPS + 1, KEYS, ...] along random episodes (reset, then random actions)."""
    reset_key, action_key = jax.random.split(key)
    states, _ = jax.vmap(env.reset)(jax.random.split(reset_key, KEYS))
    actions = jax.random.randint(action_key, (STEPS, KEYS), 0, len(env.action_names))

    def body(states, action):
        states, _ = jax.vmap(env.step)(states, action)
        return states, states

    _, later = jax.lax.scan(body, states, actions)
    return jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), states, later)


@pytest.mark.parametrize("name", ENVS)
def test_codec_renders_env_states_as_the_tokenizer_encodes_their_text(smollm2_tok, name):
    env = envs_jax.make(name)
    codec = build_codec(smollm2_tok, env)
    states = jax.device_get(jax.jit(lambda k: play(env, k))(jax.random.PRNGKey(7)))
    flat = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), states)
    symbols = jax.vmap(env.render_symbols)(flat)
    ids, lengths = jax.device_get(jax.jit(codec.render_observation)(symbols))
    texts = [symbol_text(env.symbol_strings, grid) for grid in np.asarray(symbols)]
    for i in range(0, len(texts), 125):  # render_text (eager, slow) on a sample: the same text
        assert env.render_text(jax.tree.map(lambda x, i=i: x[i], flat)) == texts[i]
    assert len(set(texts)) > 1  # the states really differ
    want = smollm2_tok(texts, add_special_tokens=False)["input_ids"]
    for row, n, expected, text in zip(ids, lengths, want, texts):
        assert row[:n].tolist() == expected, text
        assert np.all(row[n:] == -1)
