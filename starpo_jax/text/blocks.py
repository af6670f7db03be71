"""Text with dynamic slots (a grid, integers, a reward) turned into token ids inside jit.

A block is a list of fixed strings (which may hold special tokens) and slots. Each slot is
tokenised in JAX by a `SymbolBpe` over its alphabet, or, when the slot lists every row it can
hold (`Slot.fillings`: the bandit's few screens of English text, whose alphabet is too large
for the BPE tables), by looking its row up among the host's encodings of them; the fixed text
around it is tokenised once on the host. Where a slot's tokens would merge with its neighbours
(GPT-2 style " 12", Qwen style "#\n"), the slot's region is widened into the neighbouring
fixed text, a character at a time, until its edges are cuts: positions p where
encode(text[:p]) + encode(text[p:]) == encode(text) for every sampled filling. The whole
block is then verified against `tokenizer.encode` on random fillings; any mismatch raises,
naming the slot.

Verification runs every region through one jitted program (`_encode_rows`) whose shapes are
bucketed (rows, slot width, output width), with the region's tables as arguments, so regions
and blocks of other envs reuse its compilations; the fixed runs between regions are the
host's own tokens, concatenated on the host as `concat_pieces` does in JAX.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from starpo_jax.text.symbol_bpe import (
    SymbolBpe,
    build_symbol_bpe,
    encode_region,
    max_tokens,
    stack_tables,
)
from starpo_jax.text.templates import MAX_CENTS, MAX_REWARD, format_reward

DIGITS = tuple("0123456789")
NUMBER_SYMBOLS = (*DIGITS, "-", ".", "")
_MINUS, _POINT, _EMPTY = 10, 11, 12
INT_WIDTH = 3  # turn numbers and action budgets: 0..999
_WHOLE_WIDTH = len(str(int(MAX_REWARD)))


@dataclasses.dataclass(frozen=True)
class Slot:
    """A dynamic part of a block: its alphabet and a sampler of random symbol rows.

    sample(rng) -> [N] int32 ids into `symbols` (N fixed per slot). fillings: optionally every
    row the slot can hold, [K, N]; the region is then encoded by lookup (a row outside them
    encodes as the first), its token width the most tokens any of them takes. max_bytes:
    optionally the most UTF-8 bytes a row's text takes (a bound tighter than N x the longest
    symbol's; the region's token width follows it; verification checks the samples keep it).
    """

    name: str
    symbols: tuple[str, ...]
    sample: Callable[[np.random.Generator], np.ndarray]
    fillings: np.ndarray | None = None
    max_bytes: int | None = None


def int_symbols(value: jax.Array) -> jax.Array:
    """[] int -> [INT_WIDTH] ids into NUMBER_SYMBOLS: decimal digits, leading positions empty."""
    value = jnp.clip(value, 0, 10**INT_WIDTH - 1)
    powers = 10 ** jnp.arange(INT_WIDTH - 1, -1, -1)
    digits = (value // powers) % 10
    shown = (value >= powers) | (powers == 1)
    return jnp.where(shown, digits, _EMPTY).astype(jnp.int32)


def reward_symbols(reward: jax.Array) -> jax.Array:
    """[] float -> [_WHOLE_WIDTH + 4] ids into NUMBER_SYMBOLS spelling `format_reward(reward)`."""
    clipped = jnp.clip(reward.astype(jnp.float32), -2 * MAX_REWARD, 2 * MAX_REWARD)
    cents = jnp.clip(jnp.round(clipped * jnp.float32(100)).astype(jnp.int32), -MAX_CENTS, MAX_CENTS)
    magnitude = jnp.abs(cents)
    powers = 10 ** jnp.arange(_WHOLE_WIDTH - 1, -1, -1)
    whole = magnitude // 100
    whole_digits = jnp.where((whole >= powers) | (powers == 1), (whole // powers) % 10, _EMPTY)
    tenths, hundredths = (magnitude // 10) % 10, magnitude % 10
    has_frac = magnitude % 100 != 0
    return jnp.concatenate(
        [
            jnp.where(cents < 0, _MINUS, _EMPTY)[None],
            whole_digits,
            jnp.stack(
                [
                    jnp.where(has_frac, _POINT, _EMPTY),
                    jnp.where(has_frac, tenths, _EMPTY),
                    jnp.where(hundredths != 0, hundredths, _EMPTY),
                ]
            ),
        ]
    ).astype(jnp.int32)


def _spell(text: str, width: int) -> np.ndarray:
    """Host: the ids of `text` in NUMBER_SYMBOLS, padded with the empty symbol to `width`."""
    return np.array(
        [NUMBER_SYMBOLS.index(c) for c in text] + [_EMPTY] * (width - len(text)), np.int32
    )


def sample_int(rng: np.random.Generator) -> np.ndarray:
    """Random INT_WIDTH-symbol spelling of an integer (small ones more often)."""
    value = int(
        rng.choice([rng.integers(0, 10), rng.integers(10, 100), rng.integers(0, 10**INT_WIDTH)])
    )
    return _spell(str(value), INT_WIDTH)


def sample_reward(rng: np.random.Generator) -> np.ndarray:
    """Random reward spelling: the games' rewards and arbitrary values of several magnitudes."""
    pool = [0.0, 0.1, -0.1, 1.0, 10.0, 9.9, -1.1, 0.9, 10.9]
    value = (
        rng.choice(pool)
        if rng.random() < 0.5
        else rng.uniform(-1000, 1000) / 10.0 ** rng.integers(0, 4)
    )
    return _spell(format_reward(value), _WHOLE_WIDTH + 4)


def grid_slot(
    symbol_strings: tuple[str, ...], rows: int, cols: int, grids: np.ndarray | None = None
) -> Slot:
    """The observation: rows x cols symbol ids, rows joined by "\\n" (the env contract).

    grids: every [rows, cols] grid the env renders ([K, rows, cols], `TextEnv.symbol_grids`),
    or None when any grid may occur; given, they are the slot's fillings and its samples.
    """
    symbols = (*symbol_strings, "\n")

    def flat(grid: np.ndarray) -> np.ndarray:
        newline = np.full((rows, 1), len(symbol_strings))
        return np.concatenate([grid, newline], axis=1).reshape(-1)[:-1]

    if grids is None:
        return Slot(
            "state", symbols, lambda rng: flat(rng.integers(0, len(symbol_strings), (rows, cols)))
        )
    grids = np.asarray(grids, np.int32)
    if grids.ndim != 3 or grids.shape[1:] != (rows, cols) or not len(grids):
        raise ValueError(f"symbol grids of shape {grids.shape}; expected [K > 0, {rows}, {cols}]")
    if grids.min() < 0 or grids.max() >= len(symbol_strings):
        raise ValueError(f"symbol grids hold ids outside [0, {len(symbol_strings)})")
    fillings = np.stack([flat(g) for g in grids])
    return Slot("state", symbols, lambda rng: fillings[rng.integers(len(fillings))], fillings)


def flatten_grid(grid: jax.Array, newline: int) -> jax.Array:
    """[R, C] symbol ids -> [R * (C + 1) - 1]: the rows with the id `newline` between them."""
    rows = grid.shape[0]
    sep = jnp.full((rows, 1), newline, jnp.int32)
    return jnp.concatenate([grid.astype(jnp.int32), sep], axis=1).reshape(-1)[:-1]


def concat_pieces(pieces: Sequence[tuple[jax.Array, jax.Array]]) -> tuple[jax.Array, jax.Array]:
    """Concatenates variable-length id rows: [(ids [T_i], n_i)] -> (ids [sum T_i] (-1 pad), n)."""
    total = sum(int(ids.shape[0]) for ids, _ in pieces)
    out = jnp.full((total,), -1, jnp.int32)
    offset = jnp.int32(0)
    for ids, n in pieces:
        pos = jnp.where(jnp.arange(ids.shape[0]) < n, offset + jnp.arange(ids.shape[0]), total)
        out = out.at[pos].set(ids.astype(jnp.int32), mode="drop")
        offset = offset + n
    return out, offset


class Lookup(flax.struct.PyTreeNode):
    """A region encoded by table: fillings [K, N] int32 slot rows, ids [K, T] int32 (-1 pad)
    and lengths [K] int32 of left text + filling + right text."""

    fillings: jax.Array
    ids: jax.Array
    lengths: jax.Array

    def encode(self, row: jax.Array) -> tuple[jax.Array, jax.Array]:
        """row [N] int32 -> (ids [T] int32, length [] int32) of the matching filling."""
        k = jnp.argmax(jnp.all(self.fillings == row[None, :], axis=1))
        return self.ids[k], self.lengths[k]


class Block(flax.struct.PyTreeNode):
    """Fixed token runs alternating with slot regions: static[0] region[0] static[1] ... static[-1].

    Region g is left text + slot g's symbols + right text (the slot widened to cuts), encoded
    by lookups[g] when that is set, else with tables[bpe_index[g]]; tables is a SymbolBpe
    stacked over the BPE regions (`stack_tables`), None when there are none.
    """

    tables: SymbolBpe | None
    lookups: tuple[Lookup | None, ...]
    static: tuple[tuple[int, ...], ...] = flax.struct.field(pytree_node=False)
    slot_names: tuple[str, ...] = flax.struct.field(pytree_node=False)
    slot_widths: tuple[int, ...] = flax.struct.field(pytree_node=False)
    max_tokens: tuple[int, ...] = flax.struct.field(pytree_node=False)  # output width per region
    region_bytes: tuple[int, ...] = flax.struct.field(pytree_node=False)  # BPE work width
    bpe_index: tuple[int, ...] = flax.struct.field(pytree_node=False)  # -1: a lookup region

    def encode(self, slots: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """{slot name: [width] int32 symbol ids} -> (ids [T] int32 (-1 pad), length [] int32)."""
        bpe = [g for g, i in enumerate(self.bpe_index) if i >= 0]
        if bpe:
            n = max(self.slot_widths[g] for g in bpe)
            nothing = self.tables.base - 3  # [G]: the slot id that stands for no text (the edge)
            rows = jnp.stack(
                [
                    jnp.concatenate(
                        [
                            slots[self.slot_names[g]].astype(jnp.int32),
                            jnp.full((n - self.slot_widths[g],), nothing[i]),
                        ]
                    )
                    for i, g in enumerate(bpe)
                ]
            )
            ids, lengths = jax.vmap(encode_region, in_axes=(0, 0, None))(
                self.tables, rows, max(self.region_bytes[g] for g in bpe)
            )
        pieces = []
        for g, static in enumerate(self.static):
            if static:
                pieces.append((jnp.array(static, jnp.int32), jnp.int32(len(static))))
            if g == len(self.slot_names):
                break
            if self.lookups[g] is not None:
                pieces.append(self.lookups[g].encode(slots[self.slot_names[g]].astype(jnp.int32)))
            else:
                i = self.bpe_index[g]
                pieces.append((ids[i, : self.max_tokens[g]], lengths[i]))
        return concat_pieces(pieces)


def _encode_many(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def _fill(parts: Sequence[str | Slot], fills: dict[str, np.ndarray]) -> str:
    return "".join(
        p if isinstance(p, str) else "".join(p.symbols[i] for i in fills[p.name]) for p in parts
    )


def _is_cut(tokenizer: Any, texts: list[str], whole: list[list[int]], positions: list[int]) -> bool:
    lefts = _encode_many(tokenizer, [t[:p] for t, p in zip(texts, positions)])
    rights = _encode_many(tokenizer, [t[p:] for t, p in zip(texts, positions)])
    return all(a + b == w for a, b, w in zip(lefts, rights, whole))


def build_block(
    tokenizer: Any,
    parts: Sequence[str | Slot],
    *,
    samples: int = 64,
    verify: int = 300,
    seed: int = 0,
) -> Block:
    """Host: a Block for `parts` (strings and Slots, never two Slots adjacent).

    Raises ValueError naming the slot when no cut isolates it, or when the block's JAX encoding
    differs from `tokenizer.encode` on one of `verify` random fillings (rounded up to a
    multiple of VERIFY_ROWS: the verification batch).
    """
    merged: list[str | Slot] = [""]  # alternate text, slot, text, ...: join adjacent texts
    for part in parts:
        if isinstance(part, str):
            merged[-1] = merged[-1] + part if isinstance(merged[-1], str) else part
            continue
        if isinstance(merged[-1], Slot):
            raise ValueError(
                f"slots {merged[-1].name!r} and {part.name!r} are adjacent; put fixed text between"
            )
        merged.append(part)
        merged.append("")
    parts = merged
    rng = np.random.default_rng(seed)
    slots = [p for p in parts if isinstance(p, Slot)]
    if not slots:
        raise ValueError("a block needs at least one slot; tokenise fixed text on the host")
    fills = [{s.name: s.sample(rng) for s in slots} for _ in range(samples)]
    texts = [_fill(parts, f) for f in fills]
    whole = _encode_many(tokenizer, texts)
    widen: list[list[int]] = [[0, 0] for _ in slots]  # chars taken from the left / right text
    for i, slot in enumerate(slots):
        at = parts.index(slot)
        left, right = parts[at - 1], parts[at + 1]
        begin = [len(_fill(parts[:at], f)) for f in fills]
        end = [len(_fill(parts[: at + 1], f)) for f in fills]
        for side, text, base, sign in ((0, left, begin, -1), (1, right, end, 1)):
            for k in range(len(text) + 1):
                if _is_cut(tokenizer, texts, whole, [b + sign * k for b in base]):
                    widen[i][side] = k
                    break
            else:
                raise ValueError(
                    f"slot {slot.name!r}: no cut separates it from the fixed text "
                    f"{text!r}; this tokenizer cannot render it exactly"
                )
    statics: list[str] = [p for p in parts if isinstance(p, str)]
    tables, lookups, bpe_index, widths, most, region_bytes = [], [], [], [], [], []
    for i, slot in enumerate(slots):
        lw, rw = widen[i]
        if lw + (widen[i - 1][1] if i else 0) > len(statics[i]) or rw > len(statics[i + 1]):
            raise ValueError(f"slot {slot.name!r}: its widened region overlaps the previous slot's")
        left_text = statics[i][len(statics[i]) - lw :]
        right_text = statics[i + 1][:rw]
        widths.append(len(slot.sample(rng)))
        if slot.fillings is None:
            bpe_index.append(len(tables))
            tables.append(build_symbol_bpe(tokenizer, slot.symbols, left_text, right_text))
            region_bytes.append(max_tokens(slot.symbols, left_text, right_text, widths[-1]))
            if slot.max_bytes is not None:  # the slot's own bound, when tighter
                region_bytes[-1] = min(region_bytes[-1], slot.max_bytes + len(
                    (left_text + right_text).encode("utf-8")))
            most.append(region_bytes[-1])
            lookups.append(None)
        else:  # the region's edges are cuts: its tokens are encode(region text), verified below
            texts = [
                left_text + "".join(slot.symbols[i] for i in f) + right_text for f in slot.fillings
            ]
            encoded = _encode_many(tokenizer, texts)
            bpe_index.append(-1)
            region_bytes.append(0)
            most.append(max(map(len, encoded)))
            ids = np.full((len(encoded), most[-1]), -1, np.int32)
            for k, row in enumerate(encoded):
                ids[k, : len(row)] = row
            lookups.append(
                Lookup(
                    fillings=jnp.asarray(slot.fillings, jnp.int32),
                    ids=jnp.asarray(ids),
                    lengths=jnp.asarray([len(row) for row in encoded], jnp.int32),
                )
            )
    trimmed = []
    for i, text in enumerate(statics):
        start = widen[i - 1][1] if i else 0
        stop = len(text) - (widen[i][0] if i < len(slots) else 0)
        trimmed.append(
            tuple(_encode_many(tokenizer, [text[start:stop]])[0]) if stop > start else ()
        )
    block = Block(
        tables=stack_tables(tables) if tables else None,
        lookups=tuple(lookups),
        static=tuple(trimmed),
        slot_names=tuple(s.name for s in slots),
        slot_widths=tuple(widths),
        max_tokens=tuple(most),
        region_bytes=tuple(region_bytes),
        bpe_index=tuple(bpe_index),
    )
    _verify(tokenizer, block, parts, slots, rng, verify)
    return block


VERIFY_ROWS = 256  # fillings per verification call: one compiled batch shape
# Slot widths verification pads to: numbers and one-row menus, grids up to 8x8 (71 symbols),
# then multiples of the largest. Few classes, so few compiles; padding costs little to run.
_VERIFY_WIDTHS = (16, 128)


def _verify_width(width: int) -> int:
    return next(
        (w for w in _VERIFY_WIDTHS if width <= w),
        -(-width // _VERIFY_WIDTHS[-1]) * _VERIFY_WIDTHS[-1],
    )


@functools.partial(jax.jit, static_argnames="width")
def _encode_rows(bpe: SymbolBpe, slot_ids: jax.Array, width: int) -> tuple[jax.Array, jax.Array]:
    """The verification program: slot_ids [VERIFY_ROWS, N] -> (ids [VERIFY_ROWS, width],
    lengths)."""
    return jax.vmap(lambda row: encode_region(bpe, row, width))(slot_ids)


def _region_tokens(block: Block, g: int, slot_ids: np.ndarray) -> list[list[int]]:
    """Host: region g's tokens for each row of slot_ids [S, width], S % VERIFY_ROWS == 0.

    A lookup region is looked up on the host. BPE rows are padded with the id that stands for
    nothing to a bucketed width, so that every region of about that width and table size runs
    the same compiled `_encode_rows`.
    """
    lookup = block.lookups[g]
    if lookup is not None:
        fillings, ids, lengths = map(np.asarray, (lookup.fillings, lookup.ids, lookup.lengths))
        ks = [int(np.argmax(np.all(fillings == row, axis=1))) for row in slot_ids]
        return [ids[k, : lengths[k]].tolist() for k in ks]
    # host slicing: no compile
    tables = jax.tree.map(lambda x: np.asarray(x)[block.bpe_index[g]], block.tables)
    n = _verify_width(block.slot_widths[g])
    padded = np.full((slot_ids.shape[0], n), int(tables.base) - 3, np.int32)
    padded[:, : block.slot_widths[g]] = slot_ids
    # >= the region's bytes: from the shapes only, or the region's own bound (a slot's max_bytes,
    # checked on the samples) rounded up to a power of two, where that is less work
    width = min((n + 2) * tables.symbol_bytes.shape[1],
                1 << (max(block.region_bytes[g], 1) - 1).bit_length())
    out: list[list[int]] = []
    for chunk in range(0, len(padded), VERIFY_ROWS):
        ids, lengths = jax.device_get(
            _encode_rows(tables, padded[chunk : chunk + VERIFY_ROWS], width)
        )
        out += [row[:length].tolist() for row, length in zip(ids, lengths)]
    return out


def _verify(
    tokenizer: Any,
    block: Block,
    parts: list,
    slots: list[Slot],
    rng: np.random.Generator,
    count: int,
) -> None:
    """Checks the block on `count` (rounded up to VERIFY_ROWS) random fillings; raises on a
    mismatch."""
    count = -(-max(count, 1) // VERIFY_ROWS) * VERIFY_ROWS
    fills = [
        {
            s.name: s.sample(rng) if s.fillings is None else s.fillings[row % len(s.fillings)]
            for s in slots
        }
        for row in range(count)
    ]  # every filling of a slot that lists them (up to `count`), random rows otherwise
    for s in slots:
        longest = max((len("".join(s.symbols[i] for i in f[s.name]).encode("utf-8"))
                       for f in fills), default=0)
        if s.max_bytes is not None and longest > s.max_bytes:
            raise ValueError(f"slot {s.name!r}: a sample takes {longest} bytes, over its "
                             f"max_bytes = {s.max_bytes}")
    regions = [
        _region_tokens(block, g, np.stack([f[s.name] for f in fills])) for g, s in enumerate(slots)
    ]
    expected = _encode_many(tokenizer, [_fill(parts, f) for f in fills])
    for row, want in enumerate(expected):
        got = list(block.static[0])
        for region, static in zip(regions, block.static[1:]):
            got += region[row] + list(static)
        if got != want:
            text = _fill(parts, fills[row])
            same = next(
                (i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))
            )
            at = len(tokenizer.decode(want[:same]))
            raise ValueError(
                f"cannot render {block.slot_names} exactly with this tokenizer: the "
                f"tokenizations of {text!r} differ from character {at} "
                f"({text[at : at + 3]!r}...): codec {got[same : same + 4]}, tokenizer "
                f"{want[same : same + 4]}; symbols there: {_symbols_at(parts, fills[row], at)}"
            )


def _symbols_at(parts: list, fill: dict[str, np.ndarray], at: int) -> list[str]:
    """The slot symbols whose text lies within two characters of position `at`."""
    found, offset = [], 0
    for p in parts:
        pieces = [p] if isinstance(p, str) else [p.symbols[i] for i in fill[p.name]]
        for piece in pieces:
            if not isinstance(p, str) and piece and offset - 2 <= at <= offset + len(piece) + 1:
                found.append(piece)
            offset += len(piece)
    return found
