"""Observation rendering in JAX equals the tokenizer's encoding of the rendered text."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from envs_jax.base import symbol_text  # noqa: E402
from starpo_jax.text import blocks as bk  # noqa: E402

# One env per distinct (symbol table, grid shape); bandit_rev has bandit's symbols.
ENVS = ("sokoban", "sokoban_large", "sokoban_new_vocab", "frozen_lake", "bandit", "bandit_test")
STATES = 1000


@pytest.fixture(scope="module", params=["smollm2", "qwen_style"])
def tok(request):
    return request.getfixturevalue(f"{request.param}_tok")


@pytest.fixture(scope="module")
def envs():
    """name -> (env, grid shape), traced once per module."""
    made = {name: envs_jax.make(name) for name in ENVS}
    return {
        name: (
            env,
            jax.eval_shape(
                lambda k, e=env: e.render_symbols(e.reset(k)[0]), jax.random.PRNGKey(0)
            ).shape,
        )
        for name, env in made.items()
    }


# Block and newline id are arguments, not constants: envs whose tables and shapes agree share
# a compile (e.g. the two tokenizers' renderings of one env).
_render = jax.jit(
    jax.vmap(
        lambda block, grid, newline: block.encode({"state": bk.flatten_grid(grid, newline)}),
        in_axes=(None, 0, None),
    )
)


@pytest.mark.parametrize("name", ENVS)
def test_render_equals_encode_on_random_grids(tok, envs, name):
    env, (rows, cols) = envs[name]
    # build_block checks random grids against tokenizer.encode itself (build_codec: 1000) and
    # raises on a mismatch; here 1000 go through the rendering that jit code calls.
    block = bk.build_block(
        tok, [bk.grid_slot(env.symbol_strings, rows, cols)], verify=bk.VERIFY_ROWS, seed=1
    )
    grids = (
        np.random.default_rng(2)
        .integers(0, len(env.symbol_strings), (STATES, rows, cols))
        .astype(np.int32)
    )
    ids, lengths = jax.device_get(_render(block, grids, len(env.symbol_strings)))
    want = tok([symbol_text(env.symbol_strings, g) for g in grids], add_special_tokens=False)[
        "input_ids"
    ]
    for row, n, expected in zip(ids, lengths, want):
        assert row[:n].tolist() == expected
        assert np.all(row[n:] == -1)


def test_symbol_the_tokenizer_cannot_render_is_named(qwen_style_tok):
    decomposed = "e\u0301"  # NFC (the Qwen-style normalizer) turns it into one char
    with pytest.raises(ValueError, match=decomposed):
        bk.build_block(qwen_style_tok, [bk.grid_slot(("#", decomposed), 2, 2)])


@pytest.mark.parametrize("name", ["bandit", "bandit_test"])
def test_listed_grids_size_the_region_exactly(tok, envs, name):
    """An env that lists its grids gets regions as wide as its longest rendering (not the
    byte bound), and every listed grid still renders exactly as the tokenizer encodes it."""
    env, (rows, cols) = envs[name]
    grids = env.symbol_grids()
    listed = bk.build_block(tok, ["State:\n", bk.grid_slot(env.symbol_strings, rows, cols, grids),
                                  "\nEnd"], verify=bk.VERIFY_ROWS)
    generic = bk.build_block(tok, ["State:\n", bk.grid_slot(env.symbol_strings, rows, cols),
                                   "\nEnd"], verify=bk.VERIFY_ROWS)
    texts = ["State:\n" + symbol_text(env.symbol_strings, g) + "\nEnd" for g in grids]
    want = tok(texts, add_special_tokens=False)["input_ids"]
    ids, lengths = jax.device_get(jax.vmap(lambda g: listed.encode(
        {"state": bk.flatten_grid(g, len(env.symbol_strings))}))(grids))
    assert [row[:n].tolist() for row, n in zip(ids, lengths)] == want
    assert ids.shape[1] == max(map(len, want))  # padded to the longest rendering, no more
    assert ids.shape[1] < generic.encode({"state": bk.flatten_grid(
        grids[0], len(env.symbol_strings))})[0].shape[0] - 100


def test_bad_symbol_grids_are_named():
    with pytest.raises(ValueError, match=r"expected \[K > 0, 1, 3\]"):
        bk.grid_slot(("a", "b"), 1, 3, np.zeros((2, 1, 4), np.int32))
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        bk.grid_slot(("a", "b"), 1, 3, np.full((2, 1, 3), 2, np.int32))
