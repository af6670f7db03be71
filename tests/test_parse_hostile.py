"""Hostile replies through the in-JAX parser: random bytes and tokens, broken and nested tags,
invalid UTF-8, every action name in every case, separators and whitespace at the ends, and a
reply far longer than the parser's byte window. Each must give exactly what the original's
parsing gives on the decoded text (`reference_parse`), with no crash and no value out of range.
"""

from __future__ import annotations

import itertools
import os
import random
import time

import jax
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import envs_jax  # noqa: E402
from starpo_jax.text import build_codec  # noqa: E402
from starpo_jax.text.parse import build_parser, parse, reference_parse  # noqa: E402
from starpo_jax.text.token_bytes import TokenBytes  # noqa: E402

# frozen_lake's names and one with a "k" (U+212A KELVIN SIGN lower-cases to it in the original).
NAMES = ("Left", "Down", "Right", "Up", "Skip")
MAX_ACTIONS = 3
WINDOW = 384  # bytes read by the bulk parser; replies run past it too
ROWS, T = 512, 192  # one compiled shape for every bulk call
COUNT = 5200  # generated replies per mode (10,400 in all, plus the name and random-token rows)
MAX_PIECE = 12  # longest token used when a byte string is cut into tokens (`<|im_start|>`)


@pytest.fixture(scope="module")
def codec(smollm2_tok):
    return build_codec(smollm2_tok, envs_jax.make("frozen_lake"), "think", verify=0)


@pytest.fixture(scope="module")
def table(codec):
    """The parser's token bytes: token id -> bytes (special tokens read as nothing)."""
    p = codec.parser
    return np.asarray(p.token_bytes), np.asarray(p.token_lengths)


@pytest.fixture(scope="module")
def pieces(table):
    """bytes -> token ids that spell them, for cutting a byte string into tokens at random."""
    data, lengths = table
    out: dict[bytes, list[int]] = {}
    for i in np.flatnonzero((lengths > 0) & (lengths <= MAX_PIECE)):
        out.setdefault(data[i, : lengths[i]].tobytes(), []).append(int(i))
    return out


@pytest.fixture(scope="module")
def bulk(table):
    """run(ids [N, T], lengths [N], think) -> host ParsedReply, ROWS rows per compiled call."""
    data, lengths = table
    fns = {think: jax.jit(lambda i, n, p=build_parser(
        TokenBytes(data, lengths), NAMES, think=think, max_actions=MAX_ACTIONS, max_bytes=WINDOW):
        parse(p, i, n)) for think in (True, False)}

    def call(ids, lens, think):
        count = len(ids)
        pad = -count % ROWS
        ids = np.concatenate([ids, np.zeros((pad, T), np.int32)])
        lens = np.concatenate([lens, np.zeros((pad,), np.int32)])
        outs = [jax.device_get(fns[think](ids[i:i + ROWS], lens[i:i + ROWS]))
                for i in range(0, len(ids), ROWS)]
        return jax.tree.map(lambda *x: np.concatenate(x)[:count], *outs)

    return call


def _decode(table, ids) -> bytes:
    """The reply's text as the original decodes it (special tokens skipped), as UTF-8 bytes."""
    data, lengths = table
    return b"".join(data[i, : lengths[i]].tobytes() for i in ids)


def _tokens(rng: random.Random, reply: bytes, pieces) -> list[int]:
    """`reply` cut into tokens at random places (each cut a token of the vocabulary)."""
    ids, at = [], 0
    while at < len(reply):
        k = rng.randint(1, MAX_PIECE)
        while reply[at:at + k] not in pieces:
            k -= 1
        assert k, f"no token spells {reply[at:at + 1]!r}"
        ids.append(rng.choice(pieces[reply[at:at + k]]))
        at += k
    return ids


SPACES = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u2028",
          "\u3000", "\u200b", "\ufeff", "  ", " \n\t "]  # \u200b, \ufeff: not whitespace
TAGS = ["<think>", "</think>", "<answer>", "</answer>", "<Think>", "<ANSWER>", "</answer",
        "<answer", "</ think>", "<|im_start|>", "<|im_end|>", "<ans", "wer>", "<", ">", "/",
        "<thin\u212a>", "</thin\u212a>"]
SEPARATORS = ["||", "||", "||", " || ", "|", "|||", "||||", ",", "| |"]
INVALID = [b"\x80", b"\xc3", b"\xe2\x80", b"\xed\xa0\x80", b"\xf0\x9f", b"\xbf\xbf", b"\xc3("]


def _case(rng, name: str) -> str:
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name)


def _hostile(rng, alphabet: np.ndarray) -> bytes:
    """A reply near the expected shape with random damage, or pure noise."""

    def pick(options):
        return options[rng.integers(len(options))]

    def space() -> bytes:
        return "".join(pick(SPACES) for _ in range(rng.integers(0, 3))).encode()

    def item() -> bytes:
        kind = rng.integers(10)
        if kind < 5:
            return space() + _case(rng, pick(NAMES)).encode() + space()
        if kind == 5:  # a name with a tag, an invalid byte or a Kelvin sign inside
            name = _case(rng, pick(NAMES))
            cut = rng.integers(len(name) + 1)
            middle = pick([pick(TAGS).encode(), pick(INVALID), "\u212a".encode()])
            return name[:cut].encode() + middle + name[cut:].encode()
        if kind == 6:
            return pick(TAGS).encode()
        if kind == 7:
            return pick(["Jump", "Lef", "Upp", "Lèft", "右", "\u212aip", "S\u212aIP", "",
                         "Le\u200bft"]).encode()
        return space()

    def answer() -> bytes:
        sep = pick(SEPARATORS).encode()
        items = [item() for _ in range(rng.integers(0, 7))]
        ends = [pick([b"", b"", sep, sep + sep]) for _ in range(2)]
        return ends[0] + sep.join(items) + ends[1]

    kind = rng.integers(20)
    if kind == 0:  # random bytes (every byte the vocabulary can spell)
        return bytes(rng.choice(alphabet, rng.integers(0, 300)).astype(np.uint8))
    if kind == 1:  # nested and doubled tags
        depth = rng.integers(1, 4)
        inner = answer()
        for _ in range(depth):
            tag = pick(["think", "answer"])
            inner = f"<{tag}>".encode() + inner + f"</{tag}>".encode()
        return pick([b"", b"<think>"]) + inner
    parts = [
        pick([b"", b"", b"Sure. ", pick(INVALID), b"<answer>Up</answer>"]),
        pick([b"<think>", b"<think>", b"<think><think>", pick(TAGS).encode(), b""]),
        pick([b"", b"I go left", pick(TAGS).encode(), pick(INVALID), b"<answer>Up</answer>"]),
        pick([b"</think>", b"</think>", b"</think></think>", pick(TAGS).encode(), b""]),
        space(),
        pick([b"", b"", b"x", pick(INVALID)]),
        pick([b"<answer>", b"<answer>", b"<answer><answer>", pick(TAGS).encode(), b""]),
        answer(),
        pick([b"</answer>", b"</answer>", b"</answer></answer>", pick(TAGS).encode(), b""]),
        pick([b"", b"", b" extra", b"</answer>", space(), b"!" * int(rng.integers(0, 400))]),
    ]
    return b"".join(parts)


def _check(out, ids, lengths, table, think, names=NAMES, window=WINDOW) -> int:
    """Asserts every row equals the reference on its decoded bytes; returns the row count."""
    assert np.all((out.actions >= 0) & (out.actions < len(names)))
    assert np.all((out.num_actions >= 0) & (out.num_actions <= MAX_ACTIONS))
    assert np.all((out.think_tokens >= 0) & (out.think_tokens <= lengths))
    for row in range(len(ids)):
        reply = _decode(table, ids[row, : lengths[row]])
        want = reference_parse(reply, names, think=think, max_actions=MAX_ACTIONS,
                               max_bytes=window)
        got = (out.actions[row, : out.num_actions[row]].tolist(), bool(out.format_ok[row]))
        assert got == want, (think, reply[:window])
        assert not np.any(out.actions[row, out.num_actions[row]:]), "0 after num_actions"
    return len(ids)


def _rows(seed: int, replies, pieces):
    rng = random.Random(seed)
    ids = np.zeros((len(replies), T), np.int32)
    lengths = np.zeros((len(replies),), np.int32)
    for row, reply in enumerate(replies):
        tokens = _tokens(rng, reply, pieces)[:T]
        ids[row, : len(tokens)] = tokens
        lengths[row] = len(tokens)
    return ids, lengths


@pytest.mark.optimized  # its time is running the parser over COUNT replies (conftest)
@pytest.mark.parametrize("think", [True, False])
def test_hostile_replies_match_the_original(bulk, table, pieces, think):
    rng = np.random.default_rng(14 + think)
    start = time.perf_counter()
    alphabet = np.array(sorted(k[0] for k in pieces if len(k) == 1))  # bytes a token spells
    ids, lengths = _rows(think, [_hostile(rng, alphabet) for _ in range(COUNT)], pieces)
    out = bulk(ids, lengths, think)
    assert _check(out, ids, lengths, table, think) == COUNT
    print(f"{COUNT} hostile replies (think={think}) in {time.perf_counter() - start:.1f}s")


def test_every_name_in_every_case(bulk, table, pieces):
    rng = np.random.default_rng(1)
    variants = [
        "".join(chars) for name in NAMES
        for chars in itertools.product(*[(c.lower(), c.upper()) for c in name])]
    assert len(variants) == 4 + 16 + 16 + 32 + 16
    for think in (True, False):
        head = b"<think>ok</think>\n<answer>" if think else b"<answer>"
        replies = [head + v.encode() + b"</answer>" for v in variants]
        replies += [head + b" || ".join(v.encode() for v in rng.choice(variants, 3))
                    + b"</answer>" for _ in range(100)]
        ids, lengths = _rows(think, replies, pieces)
        out = bulk(ids, lengths, think)
        _check(out, ids, lengths, table, think)
        assert out.format_ok.all(), "every case of every name is a known action"


def test_random_tokens_match_the_original(bulk, table):
    rng = np.random.default_rng(2)
    vocab = len(table[1])
    ids = rng.integers(-3, vocab + 3, (2 * ROWS, T)).astype(np.int32)
    lengths = rng.integers(0, T + 1, (2 * ROWS,)).astype(np.int32)
    for think in (True, False):
        out = bulk(ids, lengths, think)
        # Ids out of the vocabulary read as the nearest valid id (they are clipped).
        _check(out, np.clip(ids, 0, vocab - 1), lengths, table, think)


def test_decode_is_the_tokenizers(table, smollm2_tok):
    """The oracle's text (the parser's token bytes, special tokens skipped) is the text the
    original parses: the tokenizer's decode with skip_special_tokens=True."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        ids = rng.integers(0, len(table[1]), rng.integers(1, 40)).tolist()
        ids += rng.integers(0, 20, 3).tolist()  # the special tokens are ids 0-16
        rng.shuffle(ids)
        text = smollm2_tok.decode(ids, skip_special_tokens=True)
        assert _decode(table, ids).decode("utf-8", "replace") == text, ids


def test_reply_longer_than_the_window(codec, table):
    """10 MB of "!" after, inside or before the tags, through a parser capped at 2048 bytes
    (by default the window is the whole reply, which the rollout bounds by its token budget):
    only the window is read (the rest is ignored), with the same result as the original's
    parsing of that window."""
    window = 2048
    parser = codec.parser.replace(max_bytes=window)
    data, lengths = table
    bang = max((i for i in range(len(lengths))
                if lengths[i] and not np.any(data[i, : lengths[i]] != ord("!"))),
               key=lambda i: lengths[i])
    count = 10 * 2**20 // int(lengths[bang])
    valid = b"<think>x</think><answer>Up || left</answer>"
    pad = window - len(valid)
    rows = [  # (head, "!" tokens, tail, expected (actions, format_ok))
        (valid, count, b"", ([3, 0], True)),
        (b"<think>", count, valid[7:], ([], False)),  # the tags come after the window
        (b"!" * pad + valid, count, b"", ([3, 0], True)),  # `</answer>` ends at the window
        (b"!" * (pad + 1) + valid, count, b"", ([], False)),  # ... one byte past it
        (b"<think>a</think><answer>" + b"Up||" * window, 0, b"</answer>", ([], False)),
    ]
    pieces = {data[i, : lengths[i]].tobytes(): int(i) for i in np.flatnonzero(lengths == 1)}
    encoded = [[pieces[bytes([b])] for b in head] + [bang] * n + [pieces[bytes([b])] for b in tail]
               for head, n, tail, _ in rows]
    ids = np.zeros((len(rows), max(map(len, encoded))), np.int32)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
    lens = np.array([len(t) for t in encoded], np.int32)
    start = time.perf_counter()
    out = jax.device_get(jax.jit(lambda i, n: parse(parser, i, n))(ids, lens))
    seconds = time.perf_counter() - start
    for row, (head, n, tail, expected) in enumerate(rows):
        reply = head + b"!" * (n * int(lengths[bang])) + tail
        assert reference_parse(reply, NAMES[:4], think=True, max_bytes=window) == expected
        got = (out.actions[row, : out.num_actions[row]].tolist(), bool(out.format_ok[row]))
        assert got == expected, row
    assert len(ids[0]) * int(lengths[bang]) >= 10 * 2**20
    print(f"{len(rows)} replies of up to {ids.shape[1]} tokens, window {window} bytes: "
          f"{seconds:.1f}s")
