"""Actions from the model's reply, inside jit, on characters (so tokenisation does not matter).

Rules (the original's, on the UTF-8 bytes of the reply; the reply includes the forced prefix):
- think mode: the first match of `<think>(.*?)</think>\\s*<answer>(.*?)</answer>` (DOTALL,
  leftmost, lazy); nothink mode: `<answer>(.*?)</answer>`. Text around the match is ignored.
- The answer is split on the action separator (leftmost, non-overlapping, as str.split), each
  item trimmed of whitespace; empty items are skipped; the first `max_actions` items are kept.
- Each kept item is compared with the action names, ASCII case-insensitively; unknown ones are
  dropped. format_ok = a match, at least one kept item, and every kept item known.
- Whitespace is ASCII whitespace (space, \\t, \\n, \\r, \\v, \\f) both in `\\s` and in trimming.
- think_tokens: reply tokens overlapping the think content (0 without a match or in nothink).
- Only the first `max_bytes` bytes of the reply are read.
- Free-text envs (an `action_parser`): every kept item is an action; its bytes (the first
  `action_bytes`, -1 padded, with its full length) go to the env's parser, which returns the
  action pytree; format_ok = a match and at least one kept item.
`reference_parse` is the same rules with Python's `re`, for tests and logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.sampling import advance_stop_tail
from starpo_jax.text.token_bytes import TokenBytes

WHITESPACE = b" \t\n\r\x0b\x0c"
_WS = "[" + re.escape(WHITESPACE.decode()) + "]*"


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
    max_bytes: int = flax.struct.field(pytree_node=False)
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
    max_bytes: int = 2048,
    action_parser: Callable[[jax.Array, jax.Array], Any] | None = None,
    action_bytes: int = 0,
) -> ReplyParser:
    """Host: a ReplyParser; with `action_parser` (free-text envs) items go to it as bytes and
    `action_names` is ignored. Raises ValueError for a separator that overlaps itself
    irregularly, or for no action names and no action parser."""
    sep = separator.encode("utf-8")
    borders = [k for k in range(1, len(sep)) if sep[:k] == sep[-k:]]
    if borders and len(set(sep)) != 1:
        raise ValueError(
            f"action separator {separator!r} overlaps itself; use one without a repeated "
            "border (e.g. '||', '|', ';')"
        )
    if action_parser is not None and action_bytes < 1:
        raise ValueError(f"action_bytes must be >= 1 with an action parser; got {action_bytes}")
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


def _reply_chars(p: ReplyParser, ids: jax.Array, length: jax.Array):
    """Gathers the reply's bytes: chars [N] int32 (-1 past the end), token ends [T]."""
    ids = jnp.clip(ids, 0, p.token_lengths.shape[0] - 1)
    lens = jnp.where(jnp.arange(ids.shape[0]) < length, p.token_lengths[ids], 0)
    ends = jnp.cumsum(lens)
    j = jnp.arange(p.max_bytes)
    which = jnp.clip(jnp.searchsorted(ends, j, side="right"), 0, ids.shape[0] - 1)
    inner = jnp.clip(j - (ends[which] - lens[which]), 0, p.token_bytes.shape[1] - 1)
    chars = jnp.where(j < ends[-1], p.token_bytes[ids[which], inner].astype(jnp.int32), -1)
    return chars, ends, lens


def parse_row(p: ReplyParser, ids: jax.Array, length: jax.Array) -> ParsedReply:
    """One reply: ids [T] int32, length [] int32 -> ParsedReply of scalars / [max_actions]."""
    chars, ends, lens = _reply_chars(p, ids, length)
    n = p.max_bytes
    pos = jnp.arange(n)
    space = jnp.isin(chars, jnp.array(list(WHITESPACE)))
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

    sep = p.separator
    hit = _hits(chars, sep) & (pos >= begin) & (pos + len(sep) <= end)
    if len(sep) > 1 and len(set(sep)) == 1:  # "||": every len(sep)-th position of a run
        run_start = jax.lax.cummax(jnp.where(chars == sep[0], -1, pos)) + 1
        hit = hit & ((pos - jnp.maximum(run_start, begin)) % len(sep) == 0)
    in_sep = jnp.zeros((n,), bool)
    for k in range(len(sep)):
        in_sep = in_sep | jnp.concatenate([jnp.zeros((k,), bool), hit[: n - k]])
    item = jnp.cumsum(hit)  # content chars: the number of separators before them
    content = matched & (pos >= begin) & (pos < end) & ~in_sep & ~space
    items = n // max(1, len(sep)) + 1
    first = jax.ops.segment_min(jnp.where(content, pos, n), item, num_segments=items)
    last = jax.ops.segment_max(jnp.where(content, pos, -1), item, num_segments=items)
    present = last >= 0
    rank = jnp.cumsum(present) - 1
    kept = present & (rank < p.max_actions)
    if p.action_parser is not None:
        actions, num_actions = _free_items(p, chars, first, last, kept, rank)
        format_ok = matched & (num_actions > 0)
    else:
        actions, num_actions, format_ok = _named_items(p, chars, first, last, kept, matched)

    if p.think:
        starts = ends - lens
        overlap = (lens > 0) & (starts < e) & (ends > t0 + 7)
        think_tokens = jnp.where(matched, jnp.sum(overlap), 0).astype(jnp.int32)
    else:
        think_tokens = jnp.int32(0)
    return ParsedReply(actions, num_actions, format_ok, think_tokens)


def _named_items(p: ReplyParser, chars, first, last, kept, matched):
    """Kept items matched against the action names: (actions [A], count, format_ok)."""
    n = p.max_bytes
    width = p.names.shape[1]
    text = chars[jnp.clip(first[:, None] + jnp.arange(width), 0, n - 1)]  # [items, Mx]
    text = jnp.where((text >= ord("A")) & (text <= ord("Z")), text + 32, text)
    size = last - first + 1
    same = (text[:, None, :] == p.names[None]) | (jnp.arange(width) >= p.name_lengths[:, None])[
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


def _free_items(p: ReplyParser, chars, first, last, kept, rank):
    """Kept items as bytes through the env's parser: (actions pytree [A, ...], count)."""
    n, width = p.max_bytes, p.action_bytes
    item = jnp.zeros((p.max_actions,), jnp.int32).at[jnp.where(kept, rank, p.max_actions)].set(
        jnp.arange(first.shape[0], dtype=jnp.int32), mode="drop"
    )
    count = jnp.sum(kept).astype(jnp.int32)
    used = jnp.arange(p.max_actions) < count
    length = jnp.where(used, last[item] - first[item] + 1, 0).astype(jnp.int32)
    j = jnp.arange(width)
    text = chars[jnp.clip(first[item][:, None] + j, 0, n - 1)]
    text = jnp.where(j < length[:, None], text, -1)
    return jax.vmap(p.action_parser)(text, length), count


def parse(p: ReplyParser, ids: jax.Array, length: jax.Array) -> ParsedReply:
    """ids [..., T] int32, length [...] int32 -> ParsedReply with the same leading axes."""
    fn = lambda i, n: parse_row(p, i, n)  # noqa: E731
    for _ in range(ids.ndim - 1):
        fn = jax.vmap(fn)
    return fn(ids, length)


def reference_parse(
    reply: bytes,
    action_names: Sequence[str],
    *,
    think: bool,
    separator: str = "||",
    max_actions: int = 5,
    max_bytes: int = 2048,
) -> tuple[list[int], bool]:
    """The same rules with Python's `re` on bytes: (action ids, format_ok)."""
    kept = reference_items(
        reply, think=think, separator=separator, max_actions=max_actions, max_bytes=max_bytes
    )
    if kept is None:
        return [], False
    names = [n.lower().encode() for n in action_names]
    actions = [names.index(s.lower()) for s in kept if s.lower() in names]
    return actions, bool(kept) and len(actions) == len(kept)


def reference_items(
    reply: bytes, *, think: bool, separator: str = "||", max_actions: int = 5,
    max_bytes: int = 2048,
) -> list[bytes] | None:
    """The kept answer items (stripped, non-empty, at most max_actions) with Python's `re`, or
    None without a match: what a free-text env's parser receives (format_ok = a non-empty list).
    """
    pattern = (
        rb"<think>(.*?)</think>" + _WS.encode() if think else b""
    ) + rb"<answer>(.*?)</answer>"
    match = re.search(pattern, reply[:max_bytes], re.DOTALL)
    if match is None:
        return None
    items = [s.strip(WHITESPACE) for s in match.group(match.lastindex).split(separator.encode())]
    return [s for s in items if s][:max_actions]


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
