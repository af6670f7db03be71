"""Reply parsing in JAX vs the plain-Python regex reference, and the stop helper."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.text.parse import answer_closed, build_parser, parse, reference_parse, stop_strings  # noqa: E402
from starpo_jax.text.token_bytes import token_byte_table  # noqa: E402

NAMES = ("Left", "Down", "Right", "Up")
T = 96


@pytest.fixture(scope="module")
def tok(smollm2_tok):
    return smollm2_tok


@pytest.fixture(scope="module")
def table(tok):
    return token_byte_table(tok)


ROWS = 256  # every call uses [ROWS, T] so each mode compiles once


@pytest.fixture(scope="module")
def run(table):
    """run(texts or (ids, lengths), think) -> host ParsedReply, in [ROWS, T] chunks."""
    fns = {
        think: jax.jit(
            lambda i, n, p=build_parser(table, NAMES, think=think, max_actions=3, max_bytes=512): (
                parse(p, i, n)
            )
        )
        for think in (True, False)
    }

    def call(ids, lengths, think):
        count = ids.shape[0]
        pad = -count % ROWS
        ids = np.concatenate([ids, np.zeros((pad, T), np.int32)])
        lengths = np.concatenate([lengths, np.zeros((pad,), np.int32)])
        outs = [
            jax.device_get(fns[think](ids[i : i + ROWS], lengths[i : i + ROWS]))
            for i in range(0, len(ids), ROWS)
        ]
        return jax.tree.map(lambda *x: np.concatenate(x)[:count], *outs)

    return call


def _batch(tok, texts):
    ids = np.zeros((len(texts), T), np.int32)
    lengths = np.zeros((len(texts),), np.int32)
    for i, text in enumerate(texts):
        enc = tok.encode(text, add_special_tokens=False)[:T]
        ids[i, : len(enc)] = enc
        lengths[i] = len(enc)
    return ids, lengths


# (reply, think mode, expected action ids, expected format_ok); max_actions = 3.
CASES = [
    ("<think>go left</think><answer>Left</answer>", True, [0], True),
    ("<think> x </think> \n <answer> Left || Up </answer>", True, [0, 3], True),
    ("<think>\n</think>\n\n<answer>\nleft ||\nUP\n</answer>", True, [0, 3], True),
    ("<think>a</think><answer>rIgHt</answer>", True, [2], True),
    ("Sure! <think>a</think><answer>Down</answer> bye <answer>Up</answer>", True, [1], True),
    ("<think>a</think>so<answer>Down</answer>", True, [], False),  # text between the tags
    ("<think>a<answer>Down</answer>", True, [], False),  # missing </think>
    ("<think>a</think><answer>Down", True, [], False),  # missing </answer>
    ("<think>a</think><think>b</think><answer>Up</answer>", True, [3], True),  # doubled think
    ("<think>a</think><answer>Up</answer></answer>", True, [3], True),
    ("<think>é ü 漢字</think><answer>Left || Ünten</answer>", True, [0], False),  # unicode, unknown
    ("<think>a</think><answer></answer>", True, [], False),  # empty answer
    ("<think>a</think><answer> || </answer>", True, [], False),
    ("<think>a</think><answer>Jump</answer>", True, [], False),
    ("<think>a</think><answer>Up || Up || Down || Left || Right</answer>", True, [3, 3, 1], True),
    ("<think>a</think><answer>Up || Jump || Down || Jump</answer>", True, [3, 1], False),
    ("<think>a</think><answer>Up|||Down</answer>", True, [3], False),  # "|Down" is unknown
    ("<think>a</think><answer>Up||Left</answer>", True, [3, 0], True),
    ("<answer>Left</answer>", True, [], False),  # think mode needs the think block
    ("<answer>Left || Down</answer>", False, [0, 1], True),
    ("<think>a</think><answer>Left</answer>", False, [0], True),
    ("<answer>up</answer>", False, [3], True),
    ("no tags at all", False, [], False),
]


def test_parse_table(tok, run):
    for think in (True, False):
        rows = [c for c in CASES if c[1] == think]
        out = run(*_batch(tok, [c[0] for c in rows]), think)
        for row, (text, _, actions, ok) in enumerate(rows):
            got = np.asarray(out.actions[row])[: int(out.num_actions[row])].tolist()
            assert (got, bool(out.format_ok[row])) == (actions, ok), text
            assert reference_parse(text.encode(), NAMES, think=think, max_actions=3) == (
                actions,
                ok,
            ), text


def test_think_tokens_count_the_think_content(tok, run):
    text = "<think>one two three</think><answer>Up</answer>"
    out = run(*_batch(tok, [text]), True)
    enc = tok.encode(text, add_special_tokens=False)
    offsets = np.cumsum([len(tok.decode([t]).encode()) for t in enc])
    starts = offsets - [len(tok.decode([t]).encode()) for t in enc]
    expected = int(np.sum((starts < text.index("</think>")) & (offsets > len("<think>"))))
    assert int(out.think_tokens[0]) == expected > 0


def _grammar_reply(rng: np.random.Generator) -> str:
    """A near-valid reply: the right shape with random damage."""

    def pick(options):
        return options[rng.integers(len(options))]

    ws = lambda: pick(["", " ", "\n", "  ", "\t", " \n "])  # noqa: E731
    names = [*NAMES, "left", "UP", "down ", "jump", "Upp", "", "Lèft", "右"]
    items = [ws() + pick(names) + ws() for _ in range(rng.integers(0, 7))]
    answer = pick(["||", "||", " || ", "|", "|||", ","]).join(items)
    think = pick(["", "I should go", "<answer>x</answer>", "</think>", "步"])
    parts = [
        pick(["", "", "Sure. ", "<think>"]),
        pick(["<think>", "<think>", "<Think>", ""]),
        think,
        pick(["</think>", "</think>", "</think >", ""]),
        ws(),
        pick(["", "", "x"]),
        pick(["<answer>", "<answer>", "<ANSWER>", ""]),
        answer,
        pick(["</answer>", "</answer>", "</answer", ""]),
        pick(["", "", " extra", "</answer>"]),
    ]
    return "".join(parts)


@pytest.mark.parametrize("think", [True, False])
def test_matches_reference_on_random_replies(tok, run, think):
    rng = np.random.default_rng(int(think))
    texts = [_grammar_reply(rng) for _ in range(5000)]
    out = run(*_batch(tok, texts), think)
    for row, text in enumerate(texts):
        got = (out.actions[row][: out.num_actions[row]].tolist(), bool(out.format_ok[row]))
        assert got == reference_parse(text.encode(), NAMES, think=think, max_actions=3), text


def test_random_token_sequences_stay_in_range(table, run):
    rng = np.random.default_rng(0)
    ids = rng.integers(-5, table.vocab_size + 5, (ROWS, T)).astype(np.int32)
    lengths = rng.integers(0, T + 1, (ROWS,)).astype(np.int32)
    out = run(ids, lengths, True)
    assert np.all((out.actions >= 0) & (out.actions < len(NAMES)))
    assert np.all((out.num_actions >= 0) & (out.num_actions <= 3))
    assert np.all((out.think_tokens >= 0) & (out.think_tokens <= lengths))


def test_answer_closed_matches_substring(tok, table):
    text = "<think>a</think><answer>Up</answ" + "er> more"
    enc = tok.encode(text, add_special_tokens=False)
    from starpo_jax.text.stops import stop_tail_width

    tail = jnp.full((1, stop_tail_width(stop_strings())), -1, jnp.int32)
    step = jax.jit(answer_closed)  # one compile per shape, not one per eager op
    hits = []
    for t in enc:
        hit, tail = step(tail, jnp.array([t]), jnp.asarray(table.bytes), jnp.asarray(table.lengths))
        hits.append(bool(hit[0]))
    prefix_texts = [tok.decode(enc[: i + 1]) for i in range(len(enc))]
    first = next(i for i, s in enumerate(prefix_texts) if "</answer>" in s)
    assert hits.index(True) == first


def test_a_long_reply_is_read_to_its_end(tok, table):
    """The byte window follows the reply's token budget (issue: a fixed 2048-byte window lost
    the `</answer>` of a long thinking reply and gave a false format penalty)."""
    reply = "<think>" + "let me think about the box. " * 120 + "</think><answer>Up</answer>"
    ids = tok.encode(reply, add_special_tokens=False)
    assert len(reply) > 3000
    p = build_parser(table, NAMES, think=True, max_actions=3)
    got = jax.jit(lambda i, n: parse(p, i, n))(jnp.asarray([ids], jnp.int32),
                                               jnp.asarray([len(ids)], jnp.int32))
    assert bool(got.format_ok[0]) and got.actions[0, : int(got.num_actions[0])].tolist() == [3]
    assert reference_parse(reply.encode(), NAMES, think=True, max_actions=3) == ([3], True)
    capped = build_parser(table, NAMES, think=True, max_actions=3, max_bytes=2048)
    assert not bool(parse(capped, jnp.asarray(ids, jnp.int32), len(ids)).format_ok)
