"""Byte-level BPE of `left + symbols + right` (short strings from a fixed alphabet), inside jit.

A `SymbolBpe` encodes a fixed left text, any sequence of slot symbols (grid symbols, digits,
a row separator) and a fixed right text into exactly the token ids the tokenizer would give
the concatenated string, in two steps that mirror the tokenizer:

1. Pre-token boundaries. The pre-tokenizer's regex decides where pre-tokens start; for the
   alphabets here that decision depends on a few neighbouring characters only. We tabulate it
   over every window (two symbols back, the symbol, one ahead) that can occur in a
   `left + symbols + right` text, running the tokenizer's own pre-tokenizer: windows of four
   slot symbols are read off one long text holding each of them once (a de Bruijn sequence),
   the others (at an edge, or touching the fixed texts) off their own short text. The table
   holds one start flag per byte of the middle symbol; inside jit a row's boundaries are
   table lookups.
2. BPE merges, restricted to the tokens reachable from the alphabet's bytes: each step every
   pre-token merges all leftmost non-overlapping occurrences of its lowest-ranked pair, which is
   the order `tokenizers` applies merges in.

Whether step 1's window is wide enough is not assumed: `build_symbol_bpe`'s callers verify
against `tokenizer.encode` on many random sequences and raise if any differs.

Cost. Tables are padded to power-of-two sizes (`_bucket`) and carry no static metadata, so
alphabets of similar size share one compiled program when the tables are passed as arguments.
Host work is cached per tokenizer (the tokenizer is assumed not to change, except that adding
tokens, which changes `len(tokenizer)`, drops its cache): the parsed vocabulary and merges, the
start flags of every window text seen, and the finished tables of each alphabet.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.text.pretokens import FIRST_SLOT, LEFT, RIGHT, de_bruijn_flags, start_flags, windows
from starpo_jax.text.token_bytes import gpt2_unicode_to_byte

_NO_MERGE = np.iinfo(np.int32).max
_MAX_BASE = 22  # base**4 window ids must stay a small table (22**4 = 234256 rows)


class SymbolBpe(flax.struct.PyTreeNode):
    """Tables for `encode_region`; every size is padded (`_bucket`), no static fields.

    Ids: 0 = left text, 1 = right text, 2 + i = slot symbol i, base - 1 = the edge sentinel;
    ids from base on are padding. The sentinel, padding and "" have length 0.
    symbol_bytes:  [K, W] uint8, symbol_lengths [K] int32.
    base:          [] int32, the number of ids in use (windows are numbered base-4 digits).
    starts:        [P, W] bool, P >= base**4: pre-token starts at each byte of the middle symbol
                   of a window (ids back2, back1, symbol, ahead; flattened base `base`).
    byte_token:    [256] int32 local id of each byte's single-byte token (-1: byte unused).
    merge_keys:    [M] int32 sorted keys left * R + right of the reachable merges (local ids),
                   padded with a never-matching key; merge_ranks [M] int32, merge_results [M]
                   int32 (local id of the merged token).
    local_to_id:   [R] int32 tokenizer id of each local token.
    """

    symbol_bytes: jax.Array
    symbol_lengths: jax.Array
    base: jax.Array
    starts: jax.Array
    byte_token: jax.Array
    merge_keys: jax.Array
    merge_ranks: jax.Array
    merge_results: jax.Array
    local_to_id: jax.Array


def _bucket(n: int, least: int) -> int:
    """The smallest power of two >= max(n, least): table sizes that many alphabets share."""
    return max(least, 1 << max(0, int(n) - 1).bit_length())


@dataclasses.dataclass
class _TokenizerCache:
    """Host-side facts about one tokenizer, computed once (see module docstring)."""

    size: int
    backend: Any
    spec: dict
    merges_of: dict[int, list[tuple[int, int, int, int]]]  # token -> (rank, left, right, result)
    flags: dict[tuple[str, str, str], tuple[bool, ...]]  # (text before, symbol, after) -> starts
    tables: dict[tuple[str, ...], SymbolBpe]


_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _backend_spec(tokenizer: Any) -> tuple[Any, dict]:
    """(`tokenizers.Tokenizer`, its parsed JSON) behind a transformers fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "to_str"):
        raise TypeError(
            f"need a fast (tokenizers-backed) tokenizer; got {type(tokenizer).__name__}"
        )
    return backend, json.loads(backend.to_str())


def _cache(tokenizer: Any) -> _TokenizerCache:
    """The tokenizer's host cache, made (or remade, if tokens were added) on first use."""
    cache = _CACHES.get(tokenizer)
    if cache is None or cache.size != len(tokenizer):
        backend, spec = _backend_spec(tokenizer)
        _check_model(spec)
        vocab = spec["model"]["vocab"]
        merges_of: dict[int, list[tuple[int, int, int, int]]] = {}
        for rank, merge in enumerate(spec["model"]["merges"]):
            a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
            if a not in vocab or b not in vocab or a + b not in vocab:
                continue  # a merge the tokenizer cannot apply either
            entry = (rank, vocab[a], vocab[b], vocab[a + b])
            merges_of.setdefault(entry[1], []).append(entry)
            if entry[2] != entry[1]:
                merges_of.setdefault(entry[2], []).append(entry)
        cache = _TokenizerCache(len(tokenizer), backend, spec, merges_of, {}, {})
        _CACHES[tokenizer] = cache
    return cache


def _check_model(spec: dict) -> None:
    model = spec["model"]
    if (
        model.get("type") != "BPE"
        or model.get("ignore_merges")
        or model.get("continuing_subword_prefix")
    ):
        settings = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
        raise ValueError(
            "the text codec supports byte-level BPE tokenizers without ignore_merges or subword "
            f"prefixes; this tokenizer's model is {settings}"
        )
    if "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise ValueError(
            "the text codec supports byte-level BPE tokenizers; no ByteLevel pre-tokenizer found"
        )


def _reachable_merges(cache: _TokenizerCache, byte_ids: set[int]) -> tuple[np.ndarray, ...]:
    """Local token ids and the merges among tokens built only from the given bytes' tokens."""
    reachable = set(byte_ids)
    frontier = list(byte_ids)
    used: dict[int, tuple[int, int, int]] = {}  # rank -> (left, right, result), tokenizer ids
    while frontier:  # a merge is found when the later of its two parts becomes reachable
        for rank, a, b, result in cache.merges_of.get(frontier.pop(), ()):
            if rank not in used and a in reachable and b in reachable:
                used[rank] = (a, b, result)
                if result not in reachable:
                    reachable.add(result)
                    frontier.append(result)
    local_ids = np.array(sorted(reachable), np.int32)
    r = _bucket(len(local_ids), 512)
    if r * r >= 2**31:
        raise ValueError(
            f"{len(local_ids)} reachable tokens: the alphabet is too large for int32 merge keys"
        )
    local = {int(t): i for i, t in enumerate(local_ids)}
    m = _bucket(len(used) + 1, 512)  # + 1: at least one never-matching key
    keys = np.full((m,), _NO_MERGE, np.int64)
    ranks = np.full((m,), _NO_MERGE, np.int32)
    results = np.zeros((m,), np.int32)
    for i, (rank, (a, b, result)) in enumerate(
        sorted(used.items(), key=lambda u: local[u[1][0]] * r + local[u[1][1]])
    ):
        keys[i], ranks[i], results[i] = local[a] * r + local[b], rank, local[result]
    padded_ids = np.concatenate([local_ids, np.full((r - len(local_ids),), local_ids[0], np.int32)])
    return padded_ids, local, keys.astype(np.int32), ranks, results


def build_symbol_bpe(
    tokenizer: Any, symbols: tuple[str, ...], left: str = "", right: str = ""
) -> SymbolBpe:
    """Host: the tables that encode `left + (symbols sequence) + right` (see module docstring).

    Raises ValueError naming the problem when the tokenizer is not a supported byte-level BPE,
    a symbol has a byte without a token, or the alphabet is too large to tabulate.
    """
    cache = _cache(tokenizer)
    key = (left, right, *symbols)
    if key in cache.tables:
        return cache.tables[key]
    texts = (left, right, *symbols)
    normalizer = cache.backend.normalizer
    for s in texts:
        if normalizer is not None and normalizer.normalize_str(s) != s:
            raise ValueError(
                f"symbol {s!r} changes under the tokenizer's normalizer; cannot render it exactly"
            )
    base = len(texts) + 1
    if base > _MAX_BASE:
        raise ValueError(
            f"alphabet of {len(symbols)} symbols is too large to tabulate "
            f"(max {_MAX_BASE - 3}): {symbols}"
        )
    vocab = cache.spec["model"]["vocab"]
    char_of_byte = {b: c for c, b in gpt2_unicode_to_byte().items()}
    byte_ids: dict[int, int] = {}
    for s in texts:
        for b in s.encode("utf-8"):
            if char_of_byte[b] not in vocab:
                raise ValueError(
                    f"byte {b:#04x} of symbol {s!r} has no single-byte token in the vocabulary"
                )
            byte_ids[b] = vocab[char_of_byte[b]]
    local_ids, local, keys, ranks, results = _reachable_merges(cache, set(byte_ids.values()))

    encoded = [s.encode("utf-8") for s in texts]
    width = _bucket(max(len(e) for e in encoded), 4)
    rows = _bucket(base, 16)
    symbol_bytes = np.zeros((rows, width), np.uint8)
    symbol_lengths = np.zeros((rows,), np.int32)
    for i, e in enumerate(encoded):
        symbol_bytes[i, : len(e)] = np.frombuffer(e, np.uint8)
        symbol_lengths[i] = len(e)

    sentinel = base - 1
    text_of = (*texts, "")  # the sentinel renders as nothing: the text's edge
    slot_ids = [FIRST_SLOT + i for i, s in enumerate(symbols) if s]
    starts = np.zeros((_bucket(base**4, 2**16), width), bool)
    de_bruijn_flags(starts, cache, slot_ids, text_of, base)
    interior = set(slot_ids)
    for b2, b1, c, a in windows(slot_ids, bool(left), bool(right), sentinel):
        if {b2, b1, c, a} <= interior:
            continue
        # A window at the text's edge or touching the fixed texts: tabulated on its own.
        flags = start_flags(cache, text_of[b2] + text_of[b1], text_of[c], text_of[a])
        starts[((b2 * base + b1) * base + c) * base + a, : len(flags)] = flags
    byte_token = np.full((256,), -1, np.int32)
    for b, t in byte_ids.items():
        byte_token[b] = local[t]
    bpe = SymbolBpe(
        symbol_bytes=jnp.asarray(symbol_bytes),
        symbol_lengths=jnp.asarray(symbol_lengths),
        base=jnp.int32(base),
        starts=jnp.asarray(starts),
        byte_token=jnp.asarray(byte_token),
        merge_keys=jnp.asarray(keys),
        merge_ranks=jnp.asarray(ranks),
        merge_results=jnp.asarray(results),
        local_to_id=jnp.asarray(local_ids),
    )
    cache.tables[key] = bpe
    return bpe


def stack_tables(tables: list[SymbolBpe]) -> SymbolBpe:
    """Host: tables padded to common sizes and stacked on a leading [G] axis, so that one
    vmapped `encode_region` serves G regions (one loop in the compiled program, not G)."""
    host = [jax.tree.map(np.asarray, t) for t in tables]
    rows = max(t.symbol_bytes.shape[0] for t in host)
    width = max(t.symbol_bytes.shape[1] for t in host)
    windows = max(t.starts.shape[0] for t in host)
    m = max(t.merge_keys.shape[0] for t in host)
    r = max(t.local_to_id.shape[0] for t in host)

    def pad(x: np.ndarray, shape: tuple[int, ...], fill: Any) -> np.ndarray:
        out = np.full(shape, fill, x.dtype)
        out[tuple(slice(0, n) for n in x.shape)] = x
        return out

    def regrid(t: SymbolBpe) -> np.ndarray:  # keys left * R + right, for the common R
        old = t.local_to_id.shape[0]
        real = t.merge_keys != _NO_MERGE
        keys = np.where(real, t.merge_keys // old * r + t.merge_keys % old, _NO_MERGE)  # order kept
        return pad(keys.astype(np.int32), (m,), _NO_MERGE)

    return SymbolBpe(
        symbol_bytes=jnp.asarray(np.stack([pad(t.symbol_bytes, (rows, width), 0) for t in host])),
        symbol_lengths=jnp.asarray(np.stack([pad(t.symbol_lengths, (rows,), 0) for t in host])),
        base=jnp.asarray(np.stack([t.base for t in host])),
        starts=jnp.asarray(np.stack([pad(t.starts, (windows, width), False) for t in host])),
        byte_token=jnp.asarray(np.stack([t.byte_token for t in host])),
        merge_keys=jnp.asarray(np.stack([regrid(t) for t in host])),
        merge_ranks=jnp.asarray(np.stack([pad(t.merge_ranks, (m,), _NO_MERGE) for t in host])),
        merge_results=jnp.asarray(np.stack([pad(t.merge_results, (m,), 0) for t in host])),
        local_to_id=jnp.asarray(
            np.stack([pad(t.local_to_id, (r,), t.local_to_id[0]) for t in host])
        ),
    )


def max_tokens(symbols: tuple[str, ...], left: str, right: str, width: int) -> int:
    """Host: bytes (hence tokens) that left + `width` symbols + right can take at most."""
    longest = max(len(s.encode("utf-8")) for s in symbols)
    return len(left.encode("utf-8")) + len(right.encode("utf-8")) + width * longest


def _bpe_step(bpe: SymbolBpe, tok: jax.Array, start: jax.Array, valid: jax.Array):
    """One merge round: every pre-token merges its lowest-ranked pair (all leftmost occurrences)."""
    n = tok.shape[0]
    r = bpe.local_to_id.shape[0]
    pairable = valid[:-1] & valid[1:] & ~start[1:]
    key = tok[:-1] * r + tok[1:]
    idx = jnp.clip(jnp.searchsorted(bpe.merge_keys, key), 0, bpe.merge_keys.shape[0] - 1)
    found = pairable & (bpe.merge_keys[idx] == key)
    rank = jnp.where(found, bpe.merge_ranks[idx], _NO_MERGE)
    segment = jnp.cumsum(start) - 1  # pre-token index of each position
    best = jax.ops.segment_min(rank, segment[:-1], num_segments=n)
    chosen = found & (rank == best[segment[:-1]])
    # Runs of chosen positions are one pair repeated (a a a ...): take every other, leftmost first.
    pos = jnp.arange(n - 1)
    last_gap = jax.lax.cummax(jnp.where(chosen, -1, pos))
    merge = chosen & ((pos - last_gap) % 2 == 1)
    tok = tok.at[:-1].set(jnp.where(merge, bpe.merge_results[idx], tok[:-1]))
    keep = valid & ~jnp.concatenate([jnp.zeros((1,), bool), merge])
    dest = jnp.where(keep, jnp.cumsum(keep) - 1, n)
    pack = lambda x, fill: jnp.full_like(x, fill).at[dest].set(x, mode="drop")  # noqa: E731
    return pack(tok, -1), pack(start, False), pack(valid, False), jnp.any(merge)


def encode_region(
    bpe: SymbolBpe, slot_ids: jax.Array, max_tokens: int
) -> tuple[jax.Array, jax.Array]:
    """Token ids of left + the slot symbols' texts + right (one row; vmap for batches).

    slot_ids: [N] int32 ids into the alphabet `build_symbol_bpe` got (empty-string symbols are
    allowed anywhere, and so is the id len(symbols), which stands for nothing).
    max_tokens: static output width, at least `max_tokens(symbols, left, right, N)`.
    Returns (ids [max_tokens] int32 padded with -1, length [] int32).
    """
    n = slot_ids.shape[0] + 2
    symbols = jnp.concatenate(
        [
            jnp.array([LEFT], jnp.int32),
            slot_ids.astype(jnp.int32) + FIRST_SLOT,
            jnp.array([RIGHT], jnp.int32),
        ]
    )
    base = bpe.base
    sentinel = base - 1
    lengths = bpe.symbol_lengths[symbols]
    # Drop empty symbols so that windows see the real neighbours.
    order = jnp.argsort(lengths == 0, stable=True)
    seq = jnp.where(lengths[order] > 0, symbols[order], sentinel)
    pad = jnp.full((2,), sentinel, seq.dtype)
    ext = jnp.concatenate([pad, seq, pad[:1]])
    window = ((ext[:-3] * base + ext[1:-2]) * base + ext[2:-1]) * base + ext[3:]  # [n]
    seq_len = bpe.symbol_lengths[seq]
    ends = jnp.cumsum(seq_len)
    total = ends[-1]
    j = jnp.arange(max_tokens)
    which = jnp.clip(jnp.searchsorted(ends, j, side="right"), 0, n - 1)
    inner = j - (ends[which] - seq_len[which])
    valid = j < total
    byte = bpe.symbol_bytes[seq[which], jnp.clip(inner, 0, bpe.symbol_bytes.shape[1] - 1)]
    start = valid & bpe.starts[window[which], jnp.clip(inner, 0, bpe.starts.shape[1] - 1)]
    start = start | (j == 0)
    tok = jnp.where(valid, bpe.byte_token[byte], -1)

    def cond(carry):
        return carry[3]

    def body(carry):
        return _bpe_step(bpe, *carry[:3])

    tok, start, valid, _ = jax.lax.while_loop(cond, body, (tok, start, valid, jnp.bool_(True)))
    count = jnp.sum(valid).astype(jnp.int32)
    ids = jnp.where(valid, bpe.local_to_id[jnp.clip(tok, 0, None)], -1)
    return ids, count
