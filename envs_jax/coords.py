"""RAGEN's coordinate observations of the grid games (`coord`, `grid_coord`), spelled in JAX.

RAGEN (ragen/env/sokoban/utils.py and ragen/env/frozen_lake/utils.py:
collect_entity_coordinates, format_coordinate_render) describes a board by a header and one
line per kind of entity:

    Board size: 6 rows x 6 cols (zero-indexed).
    Targets: (4, 3)
    Boxes: (3, 2)
    Player: (2, 2)

Each line is "Label: (r, c), (r, c), ..." with the kind's cells in row-major order (as
np.argwhere), the kinds in a fixed order, a line left out when its kind has none, lines joined
by "\\n". RAGEN's `grid_coord` is "Coordinates: \\n" + that + "\\nGrid Map: \\n" + the grid.

Here the lines after the header are fixed text around one `TextSlot` (`CoordinateLines`): the
first kind, which is never empty (Sokoban's targets, FrozenLake's start), has its label
("Targets: (") in the text before the slot, and ")" follows the slot. Each entry of the slot
is a separator (none for the first entry; "), (" inside a line; ")\\nLabel: (" where the next
kind's line begins), the row's digits, ", " and the column's digits; entries past the last
cell render as nothing. The slot's alphabet: the ten digits, "", ", ", "), (" and one symbol
per later label. `CoordinateFormats` gives a game the three formats from two methods of its
own: `_grid_symbols(state)` (its [R, C] grid) and `_coordinate_masks(state)` (bool [K, R, C],
kind k's cells).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.base import TextSlot

FORMATS = ("grid", "coord", "grid_coord")
_DIGITS = tuple("0123456789")
_EMPTY, _COMMA, _NEXT, _LABEL = 10, 11, 12, 13  # slot ids after the digits; labels from _LABEL
_POOL = 1024  # random boards spelled once per env: the slot's samples


def check_format(value: Any) -> str:
    """`value` if it is one of FORMATS; else ValueError naming it and the valid ones."""
    if not isinstance(value, str) or value not in FORMATS:
        raise ValueError(f"observation_format={value!r} is invalid; valid: "
                         f"{', '.join(repr(f) for f in FORMATS)}")
    return value


def header(rows: int, cols: int) -> str:
    """RAGEN's first coordinate line (zero-indexed), with its newline."""
    return f"Board size: {rows} rows x {cols} cols (zero-indexed).\n"


class CoordinateLines:
    """The coordinate lines (after the header) of a rows x cols board with kinds `labels`.

    labels: the kinds' line labels in RAGEN's order; the first kind is never empty.
    max_entries: the most cells all kinds list together (the slot's width follows it).
    draw(rng, count) -> bool [count, K, rows, cols]: random boards (host, numpy), whose
      spellings (by `spell` itself) are the slot's samples.
    exclusive: groups of kind indices of which at most one is non-empty (the player's
      kinds), so that their labels count once in the slot's byte bound.
    `parts` = (first label + ": (", the slot, ")"); `spell(masks)` its ids (pure JAX).
    """

    def __init__(self, labels: Sequence[str], rows: int, cols: int, max_entries: int,
                 draw: Callable[[np.random.Generator, int], np.ndarray],
                 exclusive: Sequence[Sequence[int]] = ()) -> None:
        self.labels = tuple(labels)
        self.shape = (rows, cols)
        self.max_entries = max_entries
        self.digits = len(str(max(rows, cols) - 1))
        self._draw = draw
        self._pool: np.ndarray | None = None
        self.symbols = (*_DIGITS, "", ", ", "), (",
                        *(f")\n{label}: (" for label in self.labels[1:]))
        self.width = max_entries * (2 * self.digits + 2) - 1
        # Each entry: its digits and ", "; each separator "), (" or, once per kind at most,
        # the kind's label.
        extra = {k: len(self.symbols[_LABEL + k - 1].encode("utf-8")) - 4
                 for k in range(1, len(self.labels))}
        grouped = {k for group in exclusive for k in group}
        label_bytes = (sum(v for k, v in extra.items() if k not in grouped)
                       + sum(max(extra[k] for k in group) for group in exclusive))
        self.max_bytes = (max_entries * (2 * self.digits + 2) + (max_entries - 1) * 4
                          + label_bytes)
        self.slot = TextSlot("coords", self.symbols, self.width, self.sample, self.max_bytes)
        self.parts: tuple[str | TextSlot, ...] = (f"{self.labels[0]}: (", self.slot, ")")

    def spell(self, masks: jax.Array) -> jax.Array:
        """masks bool [K, rows, cols] (kind k's cells) -> the slot's ids int32 [width]."""
        return _spell(masks, self.max_entries, self.digits)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """A random board's spelling (the pool is spelled once, by `spell`)."""
        if self._pool is None:
            masks = jnp.asarray(self._draw(np.random.default_rng(0), _POOL))
            self._pool = np.asarray(_spell_many(masks, self.max_entries, self.digits))
        return self._pool[rng.integers(len(self._pool))]


def _spell(masks: jax.Array, max_entries: int, digits: int) -> jax.Array:
    """CoordinateLines.spell for boards of up to max_entries cells and numbers of `digits`."""
    _, rows, cols = masks.shape
    cells = rows * cols
    flat = jnp.asarray(masks, bool).reshape(-1)  # kind-major, each kind row-major
    (found,) = jnp.nonzero(flat, size=max_entries, fill_value=flat.shape[0])
    valid = found < flat.shape[0]
    kind = found // cells
    row, col = (found % cells) // cols, (found % cells) % cols
    same = kind == jnp.concatenate([kind[:1], kind[:-1]])
    sep = jnp.where(valid, jnp.where(same, _NEXT, _LABEL + kind - 1), _EMPTY)
    comma = jnp.where(valid, _COMMA, _EMPTY)
    powers = 10 ** jnp.arange(digits - 1, -1, -1)

    def number(value: jax.Array) -> jax.Array:  # [E] -> [E, digits]: no leading zeros
        shown = ((value[:, None] >= powers) | (powers == 1)) & valid[:, None]
        return jnp.where(shown, (value[:, None] // powers) % 10, _EMPTY)

    entries = jnp.concatenate([sep[:, None], number(row), comma[:, None], number(col)], axis=1)
    return entries.reshape(-1)[1:].astype(jnp.int32)  # the first entry has no separator


# The samples' pool, one compile per board shape shared by every env of it.
_spell_many = jax.jit(jax.vmap(_spell, in_axes=(0, None, None)), static_argnums=(1, 2))


def grid_slot(symbol_strings: tuple[str, ...], rows: int, cols: int,
              wide_cells: int | None = None) -> TextSlot:
    """The grid as a slot "grid": the symbols and "\\n" between rows (`flat_grid`'s ids).
    wide_cells: the most cells a board shows a symbol of more than one UTF-8 byte in (Sokoban's
    box on a target "√": one per box), which bounds the slot's bytes (and so the tokens its
    region reserves); None: any cell may. Samples are uniformly random grids within it."""
    newline = len(symbol_strings)
    wide = [i for i, s in enumerate(symbol_strings) if len(s.encode("utf-8")) > 1]
    narrow = [i for i in range(newline) if i not in wide]
    bounded = wide_cells is not None and wide and narrow

    def sample(rng: np.random.Generator) -> np.ndarray:
        if not bounded:
            return flat_grid(rng.integers(0, newline, (rows, cols)), newline, np)
        grid = rng.choice(narrow, rows * cols)
        cells = rng.choice(rows * cols, rng.integers(0, wide_cells + 1), replace=False)
        grid[cells] = rng.choice(wide, len(cells))
        return flat_grid(grid.reshape(rows, cols), newline, np)

    max_bytes = None
    if bounded:
        longest = max(len(symbol_strings[i].encode("utf-8")) for i in wide)
        count = min(wide_cells, rows * cols)
        max_bytes = (rows * cols - count) * max(len(symbol_strings[i].encode("utf-8"))
                                                for i in narrow) + count * longest + rows - 1
    return TextSlot("grid", (*symbol_strings, "\n"), rows * (cols + 1) - 1, sample, max_bytes)


def flat_grid(grid: Any, newline: int, xp: Any = jnp) -> Any:
    """[R, C] ids -> [R * (C + 1) - 1]: the rows with the id `newline` between them."""
    sep = xp.full((grid.shape[0], 1), newline, xp.int32)
    return xp.concatenate([xp.asarray(grid, xp.int32), sep], axis=1).reshape(-1)[:-1]


class CoordinateFormats:
    """The three observation formats of a grid game (a TextEnv mixin; see module docstring).

    The game calls `_setup_formats` in its constructor (after `symbol_strings` is set) and
    returns `_format_symbols(state)` from `render_symbols`.
    """

    observation_format: str = "grid"
    coordinate_lines: CoordinateLines

    def _setup_formats(self, observation_format: Any, lines: CoordinateLines,
                       wide_cells: int | None = None) -> None:
        self.observation_format = check_format(observation_format)
        self.coordinate_lines = lines
        rows, cols = lines.shape
        head = header(rows, cols)
        first, slot, last = lines.parts
        if self.observation_format == "coord":
            self.observation_parts = (head + first, slot, last)
        elif self.observation_format == "grid_coord":
            grid = grid_slot(tuple(self.symbol_strings), rows, cols, wide_cells)
            self.observation_parts = ("Coordinates: \n" + head + first, slot,
                                      last + "\nGrid Map: \n", grid)

    @property
    def coordinate_parts(self) -> tuple[str | TextSlot, ...]:
        """The coordinate lines without the "Board size" header, as fixed text and slots
        (envs_jax.base.slot_text(env.coordinate_parts, env.render_coordinates(state)) is their
        text), whatever the observation format."""
        return self.coordinate_lines.parts

    def render_coordinates(self, state: Any) -> dict[str, jax.Array]:
        """{slot name: int32 [width]} of `coordinate_parts` (pure JAX, jit/vmap-able). A board
        with more cells than the lines hold (in the grid format, a Sokoban level of
        reset_from_text with more boxes than num_boxes) lists the first max_entries."""
        return {"coords": self.coordinate_lines.spell(self._coordinate_masks(state))}

    def _format_symbols(self, state: Any) -> Any:
        grid = self._grid_symbols(state)
        if self.observation_format == "grid":
            return grid
        symbols = self.render_coordinates(state)
        if self.observation_format == "grid_coord":
            symbols["grid"] = flat_grid(grid, len(self.symbol_strings))
        return symbols

    def _grid_symbols(self, state: Any) -> jax.Array:
        raise NotImplementedError

    def _coordinate_masks(self, state: Any) -> jax.Array:
        raise NotImplementedError

    @staticmethod
    def _grid_text(text: str) -> str:
        """The grid of a `grid_coord` text (the text after "Grid Map: \\n"), else the text;
        ValueError for a `coord` text (it does not list walls or ice)."""
        marker = "Grid Map: \n"
        if marker in text:
            return text.split(marker, 1)[1]
        if text.startswith("Board size: "):
            raise ValueError("a coord observation does not list every cell; reset_from_text "
                             "takes the grid (or a grid_coord observation)")
        return text
