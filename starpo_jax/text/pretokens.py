"""Pre-token boundaries of `left + symbols + right` texts, tabulated on the host.

The tokenizer's pre-tokenizer regex decides where pre-tokens start; for the alphabets of the
games that decision depends on a few neighbouring characters only. `symbol_bpe` tabulates it
over every window (two symbols back, the symbol, one ahead) that can occur, running the
tokenizer's own pre-tokenizer: windows of four slot symbols are read off one long text holding
each of them once (a de Bruijn sequence, `de_bruijn_flags`), the others (at an edge, or touching
the fixed texts) off their own short text (`start_flags`, cached per tokenizer).

Symbol ids: LEFT and RIGHT are the fixed texts, slot symbols start at FIRST_SLOT.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LEFT, RIGHT, FIRST_SLOT = 0, 1, 2  # ids of the fixed texts and of the first slot symbol


def windows(
    slot_ids: list[int], left: bool, right: bool, sentinel: int
) -> list[tuple[int, int, int, int]]:
    """Every (back2, back1, symbol, ahead) in `sentinel sentinel [left] slot* [right] sentinel`.

    Empty texts are dropped before windowing (so never appear), slot_ids are the non-empty ones.
    """
    head = [LEFT] if left else [sentinel]  # what precedes the first slot symbol or the right text
    tail = [RIGHT] if right else [sentinel]
    pred = {LEFT: [sentinel], RIGHT: head + slot_ids, sentinel: [sentinel]}
    succ = {LEFT: slot_ids + tail, RIGHT: [sentinel]}
    for s in slot_ids:
        pred[s], succ[s] = head + slot_ids, slot_ids + tail
    middles = ([LEFT] if left else []) + slot_ids + ([RIGHT] if right else [])
    return [(b2, b1, c, a) for c in middles for b1 in pred[c] for b2 in pred[b1] for a in succ[c]]


def char_flags(starts: set[int], at: int, middle: str) -> tuple[bool, ...]:
    """Start flag of each byte of `middle`, found at char offset `at` (continuation bytes:
    False)."""
    out: list[bool] = []
    for k, ch in enumerate(middle):
        out += [at + k in starts] + [False] * (len(ch.encode("utf-8")) - 1)
    return tuple(out)


def start_flags(cache: Any, before: str, middle: str, after: str) -> tuple[bool, ...]:
    """Pre-token start flag of each byte of `middle` in the text before + middle + after."""
    key = (before, middle, after)
    flags = cache.flags.get(key)
    if flags is None:
        starts = {
            s for _, (s, _) in cache.backend.pre_tokenizer.pre_tokenize_str(before + middle + after)
        }
        flags = cache.flags[key] = char_flags(starts, len(before), middle)
    return flags


def de_bruijn(k: int, n: int) -> list[int]:
    """A sequence over range(k) holding every length-n word exactly once when read cyclically:
    the Lyndon words whose length divides n, concatenated in lexicographic order."""
    word = [0] * (n + 1)
    out: list[int] = []

    def extend(t: int, p: int) -> None:
        if t > n:
            if n % p == 0:
                out.extend(word[1 : p + 1])
            return
        word[t] = word[t - p]
        extend(t + 1, p)
        for j in range(word[t - p] + 1, k):
            word[t] = j
            extend(t + 1, t)

    extend(1, 1)
    return out


def de_bruijn_flags(
    starts: np.ndarray,
    cache: Any,
    slot_ids: list[int],
    text_of: tuple[str, ...],
    base: int,
) -> None:
    """Writes the start flags of every window of four slot symbols into `starts`, reading them
    off one text that holds each such window once (a de Bruijn sequence): one pre-tokenizer
    call instead of len(slot_ids)**4."""
    if not slot_ids:
        return
    seq = np.array([slot_ids[i] for i in de_bruijn(len(slot_ids), 4)])
    seq = np.concatenate([seq, seq[:3]])  # read linearly, every window occurs
    chars = np.array([len(t) for t in text_of])
    offsets = np.concatenate([[0], np.cumsum(chars[seq])])
    is_start = np.zeros(offsets[-1] + 1, bool)
    pieces = cache.backend.pre_tokenizer.pre_tokenize_str("".join(text_of[s] for s in seq))
    is_start[[s for _, (s, _) in pieces]] = True
    b2, b1, c, a = seq[:-3], seq[1:-2], seq[2:-1], seq[3:]
    rows = ((b2 * base + b1) * base + c) * base + a
    at = offsets[2:-2]  # char offset of each window's middle symbol
    for symbol in slot_ids:
        char_of_byte = [k for k, ch in enumerate(text_of[symbol]) for _ in ch.encode("utf-8")]
        first_byte = [j == 0 for ch in text_of[symbol] for j in range(len(ch.encode("utf-8")))]
        here = c == symbol
        starts[rows[here], : len(first_byte)] = (
            is_start[at[here][:, None] + char_of_byte] & first_byte
        )
