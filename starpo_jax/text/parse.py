"""Actions from the model's reply, inside jit, on characters (so tokenisation does not matter).

Rules (the original's code, RAGEN's ContextManager._parse_response and
EnvStateManager._extract_map_valid_actions, applied to the UTF-8 bytes of the reply; the reply
includes the forced prefix):
- think mode: the first match of `<think>(.*?)</think>\\s*<answer>(.*?)</answer>` (DOTALL,
  leftmost, lazy); nothink mode: `<answer>(.*?)</answer>`. Text around the match is ignored.
- The tags <think>, </think>, <answer>, </answer>, <|im_start|>, <|im_end|> are removed from the
  answer, one after another, as the original does before splitting it.
- The answer is split on the action separator (leftmost, non-overlapping, as str.split), each
  item trimmed of whitespace; empty items are skipped; the first `max_actions` items are kept.
- Each kept item is compared with the action names (ASCII), case-insensitively as str.lower()
  (the Kelvin sign U+212A reads as "k"); unknown ones are dropped. format_ok = a match, at
  least one kept item, and every kept item known.
- Whitespace, in `\\s` and in trimming, is what str.isspace() calls whitespace (ASCII
  whitespace, \\x1c-\\x1f, U+0085, U+00A0, U+2000-U+200A, U+3000, ...) in the decoded text;
  invalid UTF-8 is never whitespace (it decodes to U+FFFD).
- think_tokens: reply tokens overlapping the think content (0 without a match or in nothink).
- The whole reply is read: the byte window is its token width x the longest token's bytes,
  unless `max_bytes` caps it (then only the first `max_bytes` bytes are read).
- Free-text envs (an `action_parser`): every kept item is an action; its bytes (the first
  `action_bytes`, -1 padded, with its full length) go to the env's parser, which returns the
  action pytree; format_ok = a match and at least one kept item.
`reference_parse` is the original's code on the decoded text, for tests and logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.text.stops import advance_stop_tail
from starpo_jax.text.token_bytes import TokenBytes

# What Python's `\s` and str.strip() treat as whitespace (str.isspace; none above U+3000), as
# UTF-8: the original parses decoded text, so U+00A0 or U+3000 around an action is trimmed too.
SPACES = tuple(c.encode() for c in map(chr, range(0x3001)) if c.isspace())
# The original removes these from the answer before splitting it (ctx_manager.special_token_list).
REMOVED_TAGS = ("<think>", "</think>", "<answer>", "</answer>", "<|im_start|>", "<|im_end|>")
# U+212A KELVIN SIGN is the one non-ASCII char whose str.lower() is ASCII ("k").
_KELVIN = "\u212a".encode()


class ParsedReply(NamedTuple):
    """Per row: actions [max_actions] int32 (0 after num_actions; for free-text envs a pytree
    with that leading axis), num_actions [] int32, format_ok [] bool, think_tokens [] int32
    (leading batch axes as the input's)."""

    actions: jax.Array
    num_actions: jax.Array
    format_ok: jax.Array
    think_tokens: jax.Array


class ReplyParser(flax.struct.PyTreeNode):
    """Tables for `parse`: token bytes and the lower-cased action names."""

    token_bytes: jax.Array  # [V, Lmax] uint8
    token_lengths: jax.Array  # [V] int32
    names: jax.Array  # [A, Mx] int32 lower-cased name bytes, -1 padded
    name_lengths: jax.Array  # [A] int32
    think: bool = flax.struct.field(pytree_node=False)
    separator: bytes = flax.struct.field(pytree_node=False)
    max_actions: int = flax.struct.field(pytree_node=False)
    max_bytes: int | None = flax.struct.field(pytree_node=False)  # None: the whole reply
    #: Free-text envs: item bytes [action_bytes] int32, length [] int32 -> action pytree.
    action_parser: Callable[[jax.Array, jax.Array], Any] | None = flax.struct.field(
        pytree_node=False, default=None
    )
    action_bytes: int = flax.struct.field(pytree_node=False, default=0)


def build_parser(
    table: TokenBytes,
    action_names: Sequence[str],
    *,
    think: bool,
    separator: str = "||",
    max_actions: int = 5,
    max_bytes: int | None = None,
    action_parser: Callable[[jax.Array, jax.Array], Any] | None = None,
    action_bytes: int = 0,
) -> ReplyParser:
    """Host: a ReplyParser; with `action_parser` (free-text envs) items go to it as bytes and
    `action_names` is ignored. Raises ValueError for a separator that overlaps itself
    irregularly, for action names that are not ASCII or not distinct ignoring case, or for no
    action names and no action parser."""
    sep = separator.encode("utf-8")
    borders = [k for k in range(1, len(sep)) if sep[:k] == sep[-k:]]
    if borders and len(set(sep)) != 1:
        raise ValueError(
            f"action separator {separator!r} overlaps itself; use one without a repeated "
            "border (e.g. '||', '|', ';')"
        )
    if action_parser is not None and action_bytes < 1:
        raise ValueError(f"action_bytes must be >= 1 with an action parser; got {action_bytes}")
    if action_parser is None and (not all(n.isascii() and n for n in action_names) or len(
            {n.lower() for n in action_names}) != len(action_names)):
        raise ValueError(
            f"action names {tuple(action_names)} must be non-empty, ASCII and distinct ignoring "
            "case (the parser lower-cases ASCII only)"
        )
    encoded = [] if action_parser is not None else [n.lower().encode("utf-8") for n in action_names]
    if action_parser is None and not encoded:
        raise ValueError("no action names and no action parser: nothing to parse replies into")
    width = max((len(e) for e in encoded), default=1)
    names = np.full((len(encoded), width), -1, np.int32)
    for i, e in enumerate(encoded):
        names[i, : len(e)] = np.frombuffer(e, np.uint8)
    return ReplyParser(
        token_bytes=jnp.asarray(table.bytes),
        token_lengths=jnp.asarray(table.lengths),
        names=jnp.asarray(names),
        name_lengths=jnp.asarray([len(e) for e in encoded], jnp.int32),
        think=think,
        separator=sep,
        max_actions=max_actions,
        max_bytes=max_bytes,
        action_parser=action_parser,
        action_bytes=action_bytes,
    )


def _hits(chars: jax.Array, pattern: bytes) -> jax.Array:
    """[N] bool: pattern starts at each position (chars -1 padded past the text)."""
    n = chars.shape[0]
    padded = jnp.concatenate([chars, jnp.full((len(pattern),), -1, chars.dtype)])
    hit = jnp.ones((n,), bool)
    for k, b in enumerate(pattern):
        hit = hit & (padded[k : k + n] == b)
    return hit


def _first(mask: jax.Array) -> jax.Array:
    """Index of the first True, or len(mask)."""
    return jnp.where(jnp.any(mask), jnp.argmax(mask), mask.shape[0]).astype(jnp.int32)


def byte_window(p: ReplyParser, reply_tokens: int) -> int:
    """Bytes a reply of `reply_tokens` token slots is read over: all it can hold, or max_bytes."""
    whole = reply_tokens * p.token_bytes.shape[1]
    return whole if p.max_bytes is None else min(whole, p.max_bytes)


def _reply_chars(p: ReplyParser, ids: jax.Array, length: jax.Array):
    """Gathers the reply's bytes: chars [N] int32 (-1 past the end), token ends [T]."""
    ids = jnp.clip(ids, 0, p.token_lengths.shape[0] - 1)
    lens = jnp.where(jnp.arange(ids.shape[0]) < length, p.token_lengths[ids], 0)
    ends = jnp.cumsum(lens)
    j = jnp.arange(byte_window(p, ids.shape[0]))
    which = jnp.clip(jnp.searchsorted(ends, j, side="right"), 0, ids.shape[0] - 1)
    inner = jnp.clip(j - (ends[which] - lens[which]), 0, p.token_bytes.shape[1] - 1)
    chars = jnp.where(j < ends[-1], p.token_bytes[ids[which], inner].astype(jnp.int32), -1)
    return chars, ends, lens


def _covered(hit: jax.Array, size: int) -> jax.Array:
    """[N] bool: inside a `size`-byte match starting at a True of `hit`."""
    out = hit
    for k in range(1, size):
        out = out | jnp.concatenate([jnp.zeros((k,), bool), hit[:-k]])
    return out


def _spaces(chars: jax.Array) -> jax.Array:
    """[N] bool: the byte belongs to a whitespace char (SPACES). A lead byte is never a
    continuation byte, so each hit is a char of the decoded text, valid UTF-8 or not."""
    n = chars.shape[0]
    padded = jnp.concatenate([chars, jnp.full((2,), -1, chars.dtype)])
    out = jnp.zeros((n,), bool)
    for size in (1, 2, 3):  # the byte lengths in SPACES; each compared as one big-endian int
        code, whole = jnp.zeros((n,), jnp.int32), jnp.ones((n,), bool)
        for k in range(size):
            code, whole = code * 256 + padded[k : k + n], whole & (padded[k : k + n] >= 0)
        chars_of_size = [int.from_bytes(c, "big") for c in SPACES if len(c) == size]
        out = out | _covered(whole & jnp.isin(code, jnp.array(chars_of_size)), size)
    return out


def _compact(chars: jax.Array, marks: tuple[jax.Array, ...], drop: jax.Array):
    """Removes the `drop` bytes (and their bool `marks`), closing the gaps; -1 after the rest."""
    keep = ~drop & (chars >= 0)
    to = jnp.where(keep, jnp.cumsum(keep) - 1, chars.shape[0])
    return (jnp.full_like(chars, -1).at[to].set(chars, mode="drop"),
            tuple(jnp.zeros_like(m).at[to].set(m, mode="drop") for m in marks))


def _answer_text(chars: jax.Array, space: jax.Array, begin: jax.Array, end: jax.Array):
    """The answer's bytes [begin, end) moved to the front, after the original's clean-up:
    REMOVED_TAGS taken out one after another (a removal may join a later tag; none of them
    overlaps itself, so removing every hit is str.replace), then U+212A read as "k". Whitespace
    and U+212A are found in the reply as it was: a removal does not join bytes into a char."""
    n = chars.shape[0]
    pos = jnp.arange(n)
    src = jnp.clip(begin + pos, 0, n - 1)
    inside = pos < end - begin
    text = jnp.where(inside, chars[src], -1)
    kelvin = _hits(text, _KELVIN)
    marks = (inside & space[src], kelvin, _covered(kelvin, len(_KELVIN)) & ~kelvin)
    for tag in REMOVED_TAGS:
        text, marks = _compact(text, marks, _covered(_hits(text, tag.encode()), len(tag)))
    space, kelvin, kelvin_tail = marks
    text, (space,) = _compact(jnp.where(kelvin, ord("k"), text), (space,), kelvin_tail)
    return text, space


def parse_row(p: ReplyParser, ids: jax.Array, length: jax.Array) -> ParsedReply:
    """One reply: ids [T] int32, length [] int32 -> ParsedReply of scalars / [max_actions]."""
    chars, ends, lens = _reply_chars(p, ids, length)
    n = chars.shape[0]
    pos = jnp.arange(n)
    space = _spaces(chars)
    # next_solid[i]: first non-whitespace position >= i (n if none); index n is allowed.
    solid = jnp.where(space, n, pos)
    next_solid = jnp.concatenate([jax.lax.cummin(solid, reverse=True), jnp.array([n])])
    open_answer = jnp.concatenate([_hits(chars, b"<answer>"), jnp.array([False])])
    if p.think:
        t0 = _first(_hits(chars, b"<think>"))
        after_close = next_solid[jnp.minimum(pos + 8, n)]
        close_think = _hits(chars, b"</think>") & (pos >= t0 + 7) & open_answer[after_close]
        e = _first(close_think)
        begin = next_solid[jnp.minimum(e + 8, n)] + 8
        opened = (t0 < n) & (e < n)
    else:
        begin = _first(open_answer[:n]) + 8
        opened = begin < n + 8
    end = _first(_hits(chars, b"</answer>") & (pos >= begin))
    matched = opened & (end < n)
    text, space = _answer_text(chars, space, begin, jnp.where(matched, end, begin))

    sep = p.separator
    hit = _hits(text, sep)
    if len(sep) > 1 and len(set(sep)) == 1:  # "||": every len(sep)-th position of a run
        run_start = jax.lax.cummax(jnp.where(text == sep[0], -1, pos)) + 1
        hit = hit & ((pos - run_start) % len(sep) == 0)
    item = jnp.cumsum(hit)  # content chars: the number of separators before them
    content = (text >= 0) & ~_covered(hit, len(sep)) & ~space
    items = n // max(1, len(sep)) + 1
    first = jax.ops.segment_min(jnp.where(content, pos, n), item, num_segments=items)
    last = jax.ops.segment_max(jnp.where(content, pos, -1), item, num_segments=items)
    present = last >= 0
    rank = jnp.cumsum(present) - 1
    kept = present & (rank < p.max_actions)
    if p.action_parser is not None:
        actions, num_actions = _free_items(p, text, first, last, kept, rank)
        format_ok = matched & (num_actions > 0)
    else:
        actions, num_actions, format_ok = _named_items(p, text, first, last, kept, matched)

    if p.think:
        starts = ends - lens
        overlap = (lens > 0) & (starts < e) & (ends > t0 + 7)
        think_tokens = jnp.where(matched, jnp.sum(overlap), 0).astype(jnp.int32)
    else:
        think_tokens = jnp.int32(0)
    return ParsedReply(actions, num_actions, format_ok, think_tokens)


def _named_items(p: ReplyParser, text, first, last, kept, matched):
    """Kept items of the answer text [N] (positions first/last [items]) matched against the
    action names: (actions [A], count, format_ok)."""
    n = text.shape[0]
    width = p.names.shape[1]
    word = text[jnp.clip(first[:, None] + jnp.arange(width), 0, n - 1)]  # [items, Mx]
    word = jnp.where((word >= ord("A")) & (word <= ord("Z")), word + 32, word)
    size = last - first + 1
    same = (word[:, None, :] == p.names[None]) | (jnp.arange(width) >= p.name_lengths[:, None])[
        None
    ]
    known = jnp.all(same, axis=-1) & (size[:, None] == p.name_lengths[None])  # [items, A]
    valid = kept & jnp.any(known, axis=-1)
    action = jnp.argmax(known, axis=-1).astype(jnp.int32)
    slot = jnp.where(valid, jnp.cumsum(valid) - 1, p.max_actions)
    actions = jnp.zeros((p.max_actions,), jnp.int32).at[slot].set(action, mode="drop")
    num_actions = jnp.sum(valid).astype(jnp.int32)
    format_ok = matched & (num_actions > 0) & (num_actions == jnp.sum(kept))
    return actions, num_actions, format_ok


def _free_items(p: ReplyParser, text, first, last, kept, rank):
    """Kept items of the answer text [N] as bytes through the env's parser: (actions pytree
    [A, ...], count)."""
    n, width = text.shape[0], p.action_bytes
    item = jnp.zeros((p.max_actions,), jnp.int32).at[jnp.where(kept, rank, p.max_actions)].set(
        jnp.arange(first.shape[0], dtype=jnp.int32), mode="drop"
    )
    count = jnp.sum(kept).astype(jnp.int32)
    used = jnp.arange(p.max_actions) < count
    length = jnp.where(used, last[item] - first[item] + 1, 0).astype(jnp.int32)
    j = jnp.arange(width)
    item_bytes = text[jnp.clip(first[item][:, None] + j, 0, n - 1)]
    item_bytes = jnp.where(j < length[:, None], item_bytes, -1)
    return jax.vmap(p.action_parser)(item_bytes, length), count


def parse(p: ReplyParser, ids: jax.Array, length: jax.Array) -> ParsedReply:
    """ids [..., T] int32, length [...] int32 -> ParsedReply with the same leading axes."""
    fn = lambda i, n: parse_row(p, i, n)  # noqa: E731
    for _ in range(ids.ndim - 1):
        fn = jax.vmap(fn)
    return fn(ids, length)


def reference_match(reply: bytes, *, think: bool, max_bytes: int | None = None,
                    ) -> re.Match | None:
    """The format's match in the decoded reply (invalid UTF-8 as U+FFFD, as the tokenizer's
    decode; the first max_bytes bytes when capped), or None; its last group is the answer, and
    in think mode group 1 the thoughts."""
    text = (reply if max_bytes is None else reply[:max_bytes]).decode("utf-8", "replace")
    answer = r"<answer>(.*?)</answer>"
    return re.search(r"<think>(.*?)</think>\s*" + answer if think else answer, text, re.DOTALL)


def reference_items(match: re.Match, *, separator: str = "||", max_actions: int = 5,
                    ) -> list[str]:
    """The answer's items as the original takes them: REMOVED_TAGS taken out, split on the
    separator, stripped, empty ones dropped, at most max_actions."""
    content = match.group(match.lastindex)
    for tag in REMOVED_TAGS:
        content = content.replace(tag, "").strip()
    return [a.strip() for a in content.split(separator) if a.strip()][:max_actions]


def reference_parse(
    reply: bytes,
    action_names: Sequence[str],
    *,
    think: bool,
    separator: str = "||",
    max_actions: int = 5,
    max_bytes: int | None = None,
) -> tuple[list[int], bool]:
    """The original's parsing, step for step on the decoded text: (action ids, format_ok).

    RAGEN's ContextManager._parse_response (regex on str, tags removed from the answer, split,
    str.strip) and EnvStateManager._extract_map_valid_actions (lower-cased lookup); format_ok is
    the opposite of its format-penalty condition.
    """
    match = reference_match(reply, think=think, max_bytes=max_bytes)
    if match is None:
        return [], False
    kept = reference_items(match, separator=separator, max_actions=max_actions)
    lookup = {name.lower(): i for i, name in enumerate(action_names)}
    actions = [lookup[a.lower()] for a in kept if a.lower() in lookup]
    return actions, bool(actions) and len(actions) == len(kept)


def stop_strings(think: bool = True) -> tuple[str, ...]:
    """The sampler's stop strings for a reply: generation ends once `</answer>` is written."""
    del think  # both modes end at the closing answer tag
    return ("</answer>",)


def answer_closed(
    tail: jax.Array,
    tokens: jax.Array,
    table: jax.Array,
    table_lengths: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Per decode step: has the reply text so far reached `</answer>`? (the sampler's matcher)

    tail [B, W] int32 (W = `stop_tail_width(stop_strings())`, -1 initially), tokens [B] int32.
    Returns (hit [B] bool, new tail [B, W]).
    """
    return advance_stop_tail(tail, tokens, table, table_lengths, stop_strings())


# The byte-level readers other readers of replies share (rollout/world_model.py's probe).
reply_chars = _reply_chars  # (parser, ids [T], length) -> (chars [N] int32, -1 padded, ...)
pattern_hits = _hits  # (chars [N], pattern bytes) -> [N] bool: the pattern starts here
first_true = _first  # [N] bool -> index of the first True, or N
whitespace = _spaces  # chars [N] -> [N] bool: the byte belongs to a str.isspace() char
