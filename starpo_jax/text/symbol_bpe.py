"""Byte-level BPE of a sequence of symbols (short strings), inside jit.

A `SymbolBpe` encodes any sequence drawn from a fixed alphabet of strings (grid symbols, digits,
a row separator, fixed neighbouring text) into exactly the token ids the tokenizer would give
the concatenated string, in two steps that mirror the tokenizer:

1. Pre-token boundaries. The pre-tokenizer's regex decides where pre-tokens start; for the
   alphabets here that decision depends on a few neighbouring characters only. We tabulate it
   over every window (two symbols back, the symbol, one ahead), running the tokenizer's own
   pre-tokenizer on each window's text, so the table holds one start flag per byte of the middle
   symbol. Inside jit a row's boundaries are table lookups.
2. BPE merges, restricted to the tokens reachable from the alphabet's bytes: each step every
   pre-token merges all leftmost non-overlapping occurrences of its lowest-ranked pair, which is
   the order `tokenizers` applies merges in.

Whether step 1's window is wide enough is not assumed: `build_symbol_bpe`'s callers verify
against `tokenizer.encode` on many random sequences and raise if any differs.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.text.token_bytes import gpt2_unicode_to_byte

_NO_MERGE = np.iinfo(np.int32).max
_MAX_WINDOWS = 200_000  # bounds the host-side tabulation: alphabet size <= 21


class SymbolBpe(flax.struct.PyTreeNode):
    """Tables for `encode_symbols`. K = alphabet size + 1 (the last id is the edge sentinel).

    symbol_bytes:  [K, W] uint8, symbol_lengths [K] int32 (the sentinel and "" have length 0).
    starts:        [K**4, W] bool: pre-token starts at each byte of the middle symbol of a window
                   (ids back2, back1, symbol, ahead; flattened base K).
    byte_token:    [256] int32 local id of each byte's single-byte token (-1: byte unused).
    merge_keys:    [M] int32 sorted keys left * R + right of the reachable merges (local ids),
    merge_ranks:   [M] int32, merge_results [M] int32 (local id of the merged token).
    local_to_id:   [R] int32 tokenizer id of each local token.
    """

    symbol_bytes: jax.Array
    symbol_lengths: jax.Array
    starts: jax.Array
    byte_token: jax.Array
    merge_keys: jax.Array
    merge_ranks: jax.Array
    merge_results: jax.Array
    local_to_id: jax.Array
    symbols: tuple[str, ...] = flax.struct.field(pytree_node=False)

    @property
    def sentinel(self) -> int:
        return len(self.symbols)

    def max_bytes(self, slots: int) -> int:
        """Bytes (hence tokens) a sequence of `slots` symbols can take at most."""
        return slots * int(max(len(s.encode("utf-8")) for s in self.symbols))


def backend_spec(tokenizer: Any) -> tuple[Any, dict]:
    """(`tokenizers.Tokenizer`, its parsed JSON) behind a transformers fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "to_str"):
        raise TypeError(f"need a fast (tokenizers-backed) tokenizer; got {type(tokenizer).__name__}")
    return backend, json.loads(backend.to_str())


def _check_supported(backend: Any, spec: dict, symbols: tuple[str, ...]) -> None:
    model = spec["model"]
    if model.get("type") != "BPE" or model.get("ignore_merges") or model.get("continuing_subword_prefix"):
        raise ValueError(
            "the text codec supports byte-level BPE tokenizers without ignore_merges or subword "
            f"prefixes; this tokenizer's model is {({k: v for k, v in model.items() if k not in ('vocab', 'merges')})}")
    if "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise ValueError("the text codec supports byte-level BPE tokenizers; no ByteLevel pre-tokenizer found")
    normalizer = backend.normalizer
    for s in symbols:
        if normalizer is not None and normalizer.normalize_str(s) != s:
            raise ValueError(f"symbol {s!r} changes under the tokenizer's normalizer; cannot render it exactly")


def _reachable_merges(spec: dict, byte_ids: dict[int, int]) -> tuple[np.ndarray, ...]:
    """Local token ids and the merges among tokens built only from the given bytes."""
    vocab = spec["model"]["vocab"]
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in spec["model"]["merges"]]
    reachable = set(byte_ids.values())
    used: list[tuple[int, int, int, int]] = []  # (rank, left, right, result) in tokenizer ids
    seen: set[int] = set()
    changed = True
    while changed:  # merges are rank ordered, so one pass normally reaches the fixed point
        changed = False
        for rank, (a, b) in enumerate(merges):
            if rank in seen:
                continue
            ia, ib = vocab.get(a), vocab.get(b)
            if ia in reachable and ib in reachable:
                result = vocab[a + b]
                used.append((rank, ia, ib, result))
                seen.add(rank)
                if result not in reachable:
                    reachable.add(result)
                    changed = True
    local_ids = np.array(sorted(reachable), np.int32)
    if len(local_ids) ** 2 >= 2**31:
        raise ValueError(f"{len(local_ids)} reachable tokens: the alphabet is too large for int32 merge keys")
    local = {int(t): i for i, t in enumerate(local_ids)}
    r = len(local_ids)
    # A never-matching entry keeps the tables non-empty when the alphabet has no merges.
    used.append((int(_NO_MERGE), 0, 0, int(local_ids[0])))
    keys = np.array([local[a] * r + local[b] for _, a, b, _ in used[:-1]] + [_NO_MERGE], np.int64)
    order = np.argsort(keys, kind="stable")
    ranks = np.array([u[0] for u in used], np.int32)[order]
    results = np.array([local[u[3]] for u in used], np.int32)[order]
    return local_ids, local, keys[order].astype(np.int32), ranks, results


def _start_flags(pre_tokenizer: Any, parts: tuple[str, ...], middle: int) -> list[bool]:
    """Pre-token start flag of each byte of parts[middle] in the text "".join(parts)."""
    text = "".join(parts)
    char_starts = {start for _, (start, _) in pre_tokenizer.pre_tokenize_str(text)}
    offset = sum(len(p) for p in parts[:middle])
    flags: list[bool] = []
    for k, ch in enumerate(parts[middle]):
        flags += [offset + k in char_starts] + [False] * (len(ch.encode("utf-8")) - 1)
    return flags


def build_symbol_bpe(tokenizer: Any, symbols: tuple[str, ...]) -> SymbolBpe:
    """Host: the tables that encode sequences over `symbols` (see module docstring).

    Raises ValueError naming the problem when the tokenizer is not a supported byte-level BPE,
    a symbol has a byte without a token, or the alphabet is too large to tabulate.
    """
    symbols = tuple(symbols)
    backend, spec = backend_spec(tokenizer)
    _check_supported(backend, spec, symbols)
    k = len(symbols) + 1
    if k**4 > _MAX_WINDOWS:
        raise ValueError(f"alphabet of {len(symbols)} symbols is too large to tabulate (max 20): {symbols}")
    vocab = spec["model"]["vocab"]
    char_of_byte = {b: c for c, b in gpt2_unicode_to_byte().items()}
    byte_ids: dict[int, int] = {}
    for s in symbols:
        for b in s.encode("utf-8"):
            if char_of_byte[b] not in vocab:
                raise ValueError(f"byte {b:#04x} of symbol {s!r} has no single-byte token in the vocabulary")
            byte_ids[b] = vocab[char_of_byte[b]]
    local_ids, local, keys, ranks, results = _reachable_merges(spec, byte_ids)

    encoded = [s.encode("utf-8") for s in symbols]
    width = max(1, max(len(e) for e in encoded))
    symbol_bytes = np.zeros((k, width), np.uint8)
    symbol_lengths = np.zeros((k,), np.int32)
    for i, e in enumerate(encoded):
        symbol_bytes[i, : len(e)] = np.frombuffer(e, np.uint8)
        symbol_lengths[i] = len(e)

    text_of = (*symbols, "")  # the sentinel renders as nothing: the text's edge
    pre = backend.pre_tokenizer
    starts = np.zeros((k, k, k, k, width), bool)
    for b2, b1, c, a in itertools.product(range(k), range(k), range(k - 1), range(k)):
        parts = (text_of[b2], text_of[b1], text_of[c], text_of[a])
        flags = _start_flags(pre, parts, 2)
        starts[b2, b1, c, a, : len(flags)] = flags
    byte_token = np.full((256,), -1, np.int32)
    for b, t in byte_ids.items():
        byte_token[b] = local[t]
    return SymbolBpe(
        symbol_bytes=jnp.asarray(symbol_bytes), symbol_lengths=jnp.asarray(symbol_lengths),
        starts=jnp.asarray(starts.reshape(k**4, width)), byte_token=jnp.asarray(byte_token),
        merge_keys=jnp.asarray(keys), merge_ranks=jnp.asarray(ranks),
        merge_results=jnp.asarray(results), local_to_id=jnp.asarray(local_ids), symbols=symbols)


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


def encode_symbols(bpe: SymbolBpe, symbols: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Token ids of the concatenated text of a symbol sequence (one row; vmap for batches).

    symbols: [N] int32 ids into `bpe.symbols` (empty-string symbols are allowed anywhere).
    Returns (ids [T] int32 padded with -1, length [] int32), T = `bpe.max_bytes(N)`.
    """
    n = symbols.shape[0]
    k = bpe.sentinel + 1
    lengths = bpe.symbol_lengths[symbols]
    # Drop empty symbols so that windows see the real neighbours.
    order = jnp.argsort(lengths == 0, stable=True)
    seq = jnp.where(lengths[order] > 0, symbols[order], bpe.sentinel)
    pad = jnp.full((2,), bpe.sentinel, seq.dtype)
    ext = jnp.concatenate([pad, seq, pad[:1]])
    window = ((ext[:-3] * k + ext[1:-2]) * k + ext[2:-1]) * k + ext[3:]  # [N]
    seq_len = bpe.symbol_lengths[seq]
    ends = jnp.cumsum(seq_len)
    total = ends[-1]
    t = bpe.max_bytes(n)
    j = jnp.arange(t)
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
