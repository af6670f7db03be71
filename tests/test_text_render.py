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

# One env per distinct (symbol table, grid shape) rendered by BPE; the bandits list their few
# grids and are rendered by lookup (their English text is too large an alphabet for BPE).
ENVS = ("sokoban", "sokoban_large", "sokoban_new_vocab", "frozen_lake")
LISTED = ("bandit", "bandit_test")  # bandit_rev has bandit's symbols
STATES = 1000


@pytest.fixture(scope="module", params=["smollm2", "qwen_style"])
def tok(request):
    return request.getfixturevalue(f"{request.param}_tok")


@pytest.fixture(scope="module")
def envs():
    """name -> (env, grid shape), traced once per module."""
    made = {name: envs_jax.make(name) for name in ENVS + LISTED}
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


@pytest.mark.parametrize("name", LISTED)
def test_listed_grids_render_by_lookup_exactly(tok, envs, name):
    """An env that lists its grids gets lookup regions as wide as its longest rendering, and
    every listed grid renders exactly as the tokenizer encodes it, between BPE slots too."""
    env, (rows, cols) = envs[name]
    grids = env.symbol_grids()
    number = bk.Slot("n", bk.NUMBER_SYMBOLS, bk.sample_int)
    listed = bk.build_block(
        tok,
        ["Turn ", number, ":\nState:\n", bk.grid_slot(env.symbol_strings, rows, cols, grids),
         "\nEnd ", number, "."],
        verify=bk.VERIFY_ROWS,
    )
    assert listed.bpe_index[1] == -1 and min(listed.bpe_index[::2]) >= 0
    values = np.arange(len(grids)) * 37
    texts = [f"Turn {v}:\nState:\n" + symbol_text(env.symbol_strings, g) + f"\nEnd {v}."
             for v, g in zip(values, grids)]
    want = tok(texts, add_special_tokens=False)["input_ids"]
    ids, lengths = jax.device_get(jax.vmap(lambda g, v: listed.encode(
        {"state": bk.flatten_grid(g, len(env.symbol_strings)), "n": bk.int_symbols(v)}))(
        grids, values))
    assert [row[:n].tolist() for row, n in zip(ids, lengths)] == want
    region = max(len(tok.encode(symbol_text(env.symbol_strings, g), add_special_tokens=False))
                 for g in grids)
    assert listed.max_tokens[1] <= region + 4  # the longest rendering (+ the widened edges)


def test_a_too_large_alphabet_is_named(smollm2_tok):
    """The bandit's game text as BPE symbols: refused with the reason, not mis-rendered."""
    env = envs_jax.make("bandit")
    with pytest.raises(ValueError, match="too large"):
        bk.build_block(smollm2_tok, [bk.grid_slot(env.symbol_strings, 1, 13)], verify=1)


def test_bad_symbol_grids_are_named():
    with pytest.raises(ValueError, match=r"expected \[K > 0, 1, 3\]"):
        bk.grid_slot(("a", "b"), 1, 3, np.zeros((2, 1, 4), np.int32))
    with pytest.raises(ValueError, match=r"outside \[0, 2\)"):
        bk.grid_slot(("a", "b"), 1, 3, np.full((2, 1, 3), 2, np.int32))
