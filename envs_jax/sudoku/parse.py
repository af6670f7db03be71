"""A Sudoku move from the bytes of one answer item, inside jit: the original's `parse_action`.

The original lower-cases the item and tries these patterns in order, taking the leftmost
match of the first that matches anywhere (`re.search`):

    place N at row R col C | place N at (R,C) | place N at R,C | N at R,C | (R,C,N) | R,C,N

with \\s+ / \\s* between words where the original has them. The numbers read as (N, R, C) if
the item contains "place" or "at" anywhere, else as (R, C, N). Here: ASCII lower-casing and
whitespace (as the answer parser), numbers saturate at 10**6 (out of range either way).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

CAP = 10**6
_SPACE = b" \t\n\r\x0b\x0c"

# Pattern elements: a literal (bytes), "+" (\s+), "*" (\s*), or None (a number, (\d+)).
_PATTERNS = (
    (b"place", "+", None, "+", b"at", "+", b"row", "+", None, "+", b"col", "+", None),
    (b"place", "+", None, "+", b"at", "+", b"(", None, b",", "*", None, b")"),
    (b"place", "+", None, "+", b"at", "+", None, b",", "*", None),
    (None, "+", b"at", "+", None, b",", "*", None),
    (b"(", None, b",", "*", None, b",", "*", None, b")"),
    (None, b",", "*", None, b",", "*", None),
)


class Move(NamedTuple):
    """A parsed answer: parsed [] bool; row, col [] int32 as written (1-based); num [] int32."""

    parsed: jax.Array
    row: jax.Array
    col: jax.Array
    num: jax.Array


def _at(chars: jax.Array, pos: jax.Array, literal: bytes) -> jax.Array:
    """[S] bool: `literal` starts at each position pos [S] (chars padded with -1)."""
    n = chars.shape[0]
    ok = jnp.ones(pos.shape, bool)
    for k, b in enumerate(literal):
        ok = ok & (chars[jnp.clip(pos + k, 0, n - 1)] == b) & (pos + k < n)
    return ok


def parse_move(item: jax.Array, length: jax.Array) -> Move:
    """item [W] int32 bytes (-1 padded), length [] int32 -> Move (see the module docstring)."""
    w = item.shape[0]
    chars = jnp.where(jnp.arange(w) < length, item, -1)
    chars = jnp.where((chars >= ord("A")) & (chars <= ord("Z")), chars + 32, chars)
    chars = jnp.concatenate([chars, jnp.full((1,), -1, chars.dtype)])  # position w: the end
    pos = jnp.arange(w + 1)
    space = jnp.isin(chars, jnp.array(list(_SPACE)))
    digit = (chars >= ord("0")) & (chars <= ord("9"))
    next_solid = jax.lax.cummin(jnp.where(space, w, pos), reverse=True)
    run_end = jax.lax.cummin(jnp.where(digit, w, pos), reverse=True)  # first non-digit >= pos

    def suffix(carry, x):  # the value of the digits from each position to its run's end
        value, scale = carry
        d, is_digit = x
        value = jnp.where(is_digit, jnp.minimum(value + d * scale, CAP), 0)
        scale = jnp.where(is_digit, jnp.minimum(scale * 10, 10**7), 1)
        return (value, scale), value

    _, number = jax.lax.scan(suffix, (jnp.int32(0), jnp.int32(1)),
                             (chars - ord("0"), digit), reverse=True)

    found, values = jnp.bool_(False), jnp.zeros((3,), jnp.int32)
    for pattern in _PATTERNS:
        at = pos
        ok = jnp.ones((w + 1,), bool)
        read = []
        for element in pattern:
            if element is None:
                ok = ok & digit[jnp.clip(at, 0, w)]
                read.append(number[jnp.clip(at, 0, w)])
                at = run_end[jnp.clip(at, 0, w)]
            elif element == "+":
                ok = ok & space[jnp.clip(at, 0, w)]
                at = next_solid[jnp.clip(at, 0, w)]
            elif element == "*":
                at = next_solid[jnp.clip(at, 0, w)]
            else:
                ok = ok & _at(chars, at, element)
                at = at + len(element)
        first = jnp.argmax(ok)
        hit = jnp.any(ok) & ~found
        values = jnp.where(hit, jnp.stack([r[first] for r in read]), values)
        found = found | jnp.any(ok)
    text = chars[:w]
    named = jnp.any(_at(text, jnp.arange(w), b"place")) | jnp.any(_at(text, jnp.arange(w), b"at"))
    num = jnp.where(named, values[0], values[2])
    row = jnp.where(named, values[1], values[0])
    col = jnp.where(named, values[2], values[1])
    return Move(parsed=found, row=row, col=col, num=num)
