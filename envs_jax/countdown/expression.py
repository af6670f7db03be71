"""An arithmetic answer, parsed and evaluated inside jit: the bytes of one answer item in, its
numbers and its value out (static shapes, no host round trips).

Grammar (Python's, restricted to what the game asks for): non-negative integer literals, binary
+ - * /, unary + -, parentheses; spaces, tabs and form feeds anywhere, newlines only inside
parentheses (as Python's tokenizer), no leading zeros ("05" is a syntax error in Python, "00"
is not). `/` is true division. Anything else, "**" and "//" included, is not an expression:
`evaluable` is False (the original then scores the answer as unevaluated, like a Python error).

Numbers (`literals`): every maximal run of ASCII digits in the item, as the original's
`re.findall(r"\\d+", answer)`, whether or not the item parses.

Values are exact fractions p / q in int32 while every intermediate stays below 2**30 (always for
four literals up to 100: |p|, q <= 2**adds * the literals' product); past that the float32 value
that runs alongside decides. Division by a zero value sets `divides_by_zero` (Python raises).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

MAX_LITERALS = 8  # literals kept for the numbers check (a valid answer has at most 5)
LITERAL_CAP = 10**6  # literal values saturate here (no given number comes close)
_EXACT_LIMIT = float(2**30)
_FLOAT_LIMIT = 1e30

# Token kinds (END closes every item).
NUM, PLUS, MINUS, TIMES, DIVIDE, OPEN, CLOSE, END, NEG, POS = range(10)
_PRECEDENCE = jnp.array([0, 1, 1, 2, 2, 0, 0, 0, 3, 3], jnp.int32)
_OPERATOR_CHARS = {ord("+"): PLUS, ord("-"): MINUS, ord("*"): TIMES, ord("/"): DIVIDE,
                   ord("("): OPEN, ord(")"): CLOSE}


class Expression(NamedTuple):
    """One parsed answer (leading batch axes as the input's)."""

    literals: jax.Array  # [MAX_LITERALS] int32 the first literals in order, -1 after
    num_literals: jax.Array  # [] int32 all literals (may exceed MAX_LITERALS)
    evaluable: jax.Array  # [] bool parses, no division by zero, not cut off
    numerator: jax.Array  # [] int32 p (exact when `exact`)
    denominator: jax.Array  # [] int32 q > 0
    approx: jax.Array  # [] float32 the value in float32 (clipped to +-1e30)
    exact: jax.Array  # [] bool p / q is the exact value
    cut: jax.Array  # [] bool the item was longer than the bytes read


def _tokens(item: jax.Array, length: jax.Array):
    """Bytes [W] -> compact tokens: kind [W + 1], literal value [W + 1], token count, syntax ok
    of the character level (alphabet, whitespace placement, leading zeros), literals."""
    w = item.shape[0]
    pos = jnp.arange(w)
    inside = pos < jnp.minimum(length, w)
    c = jnp.where(inside, item, -1)
    digit = (c >= ord("0")) & (c <= ord("9"))
    kind = jnp.full((w,), -1, jnp.int32)
    for char, k in _OPERATOR_CHARS.items():
        kind = jnp.where(c == char, k, kind)
    blank = (c == ord(" ")) | (c == ord("\t")) | (c == 0x0C)
    newline = (c == ord("\n")) | (c == ord("\r"))
    depth = jnp.cumsum((kind == OPEN).astype(jnp.int32) - (kind == CLOSE).astype(jnp.int32))
    chars_ok = jnp.all(~inside | digit | (kind >= 0) | blank | (newline & (depth > 0)))

    previous_digit = jnp.concatenate([jnp.zeros((1,), bool), digit[:-1]])
    run_start = digit & ~previous_digit
    run = jnp.cumsum(run_start) - 1  # literal index of each digit
    # Value of each run: Horner over its digits, saturating (a scan: runs have any length).
    def horner(value, x):
        d, starts, is_digit = x
        value = jnp.where(starts, 0, value)
        value = jnp.where(is_digit, jnp.minimum(value * 10 + d, LITERAL_CAP), value)
        return value, value

    _, running = jax.lax.scan(horner, jnp.int32(0), (c - ord("0"), run_start, digit))
    run_end = digit & ~jnp.concatenate([digit[1:], jnp.zeros((1,), bool)])
    count = jnp.sum(run_start).astype(jnp.int32)
    literals = jnp.full((MAX_LITERALS,), -1, jnp.int32).at[
        jnp.where(run_end, run, MAX_LITERALS)
    ].set(running, mode="drop")
    # Python rejects "05" but not "0" or "00": a zero-led run must be all zeros.
    zero_led = run_start & (c == ord("0"))
    led = jax.ops.segment_max(zero_led.astype(jnp.int32), jnp.where(digit, run, w),
                              num_segments=w + 1)[:w]
    leading_zero_ok = jnp.all(~run_end | (led[jnp.clip(run, 0, w - 1)] == 0) | (running == 0))

    token = run_start | (kind >= 0)
    slot = jnp.where(token, jnp.cumsum(token) - 1, w + 1)
    tok_kind = jnp.full((w + 1,), END, jnp.int32).at[slot].set(
        jnp.where(digit, NUM, kind), mode="drop")
    value_at_start = _run_values(running, run, run_end, w)
    tok_value = jnp.zeros((w + 1,), jnp.int32).at[slot].set(value_at_start, mode="drop")
    return tok_kind, tok_value, chars_ok & leading_zero_ok, literals, count


def _run_values(running: jax.Array, run: jax.Array, run_end: jax.Array, w: int) -> jax.Array:
    """[W] the finished value of each position's digit run (read where the run starts)."""
    finished = jnp.zeros((w + 1,), jnp.int32).at[jnp.where(run_end, run, w)].set(running)
    return finished[jnp.clip(run, 0, w)]


def _syntax_ok(kind: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Token-level grammar: (ok, unary [T] bool). After an operand (a number or ")") comes a
    binary operator, ")" or the end; elsewhere a number, "(" or a unary sign."""
    prev = jnp.concatenate([jnp.array([OPEN]), kind[:-1]])  # the start behaves like "("
    operand_before = (prev == NUM) | (prev == CLOSE)
    live = jnp.concatenate([jnp.ones((1,), bool), prev[1:] != END])  # tokens up to the end
    sign = (kind == PLUS) | (kind == MINUS)
    unary = sign & ~operand_before
    binary = (kind >= PLUS) & (kind <= DIVIDE)
    after_operand = binary | (kind == CLOSE) | (kind == END)
    elsewhere = (kind == NUM) | (kind == OPEN) | unary
    depth = jnp.cumsum((kind == OPEN).astype(jnp.int32) - (kind == CLOSE).astype(jnp.int32))
    ok = jnp.where(operand_before, after_operand, elsewhere) | ~live
    balanced = jnp.all(depth >= 0) & (depth[-1] == 0)
    return jnp.all(ok) & balanced, unary


def _apply(op, a, b):
    """Applies operator `op` to values a (left) and b (right; unary ops use b only).
    Values are (p, q, f, overflow); returns (p, q, f, overflow, divides_by_zero)."""
    p1, q1, f1, o1 = a
    p2, q2, f2, o2 = b
    overflow = jnp.where((op == NEG) | (op == POS), o2, o1 | o2)  # a unary op has no left
    big = lambda x: jnp.abs(x) > _EXACT_LIMIT  # noqa: E731  (float32 magnitudes, no wrap)
    fp1, fq1, fp2, fq2 = (x.astype(jnp.float32) for x in (p1, q1, p2, q2))
    zero = jnp.where(overflow, f2 == 0, p2 == 0) & (op == DIVIDE)
    safe_p2 = jnp.where(p2 == 0, 1, p2)
    cases = {
        PLUS: (p1 * q2 + p2 * q1, q1 * q2, f1 + f2, big(fp1 * fq2) | big(fp2 * fq1)
               | big(jnp.abs(fp1 * fq2) + jnp.abs(fp2 * fq1)) | big(fq1 * fq2)),
        MINUS: (p1 * q2 - p2 * q1, q1 * q2, f1 - f2, big(jnp.abs(fp1 * fq2) + jnp.abs(fp2 * fq1))
                | big(fq1 * fq2)),
        TIMES: (p1 * p2, q1 * q2, f1 * f2, big(fp1 * fp2) | big(fq1 * fq2)),
        DIVIDE: (p1 * q2 * jnp.sign(safe_p2), q1 * jnp.abs(safe_p2),
                 f1 / jnp.where(f2 == 0, 1.0, f2), big(fp1 * fq2) | big(fq1 * fp2)),
        NEG: (-p2, q2, -f2, jnp.bool_(False)),
        POS: (p2, q2, f2, jnp.bool_(False)),
    }
    out = [jnp.int32(0), jnp.int32(1), jnp.float32(0), jnp.bool_(False)]
    for k, (p, q, f, o) in cases.items():
        here = op == k
        out = [jnp.where(here, x, y) for x, y in zip((p, q, f, o), out)]
    p, q, f, o = out
    f = jnp.clip(jnp.nan_to_num(f, nan=0.0), -_FLOAT_LIMIT, _FLOAT_LIMIT)
    return p, jnp.where(q == 0, 1, q), f, overflow | o, zero


def _evaluate(kind: jax.Array, value: jax.Array, unary: jax.Array):
    """Shunting-yard over the tokens, one action per step (consume a token or apply the top
    operator), 2 T steps. Returns (p, q, f, overflow, divides_by_zero) of the whole item."""
    t = kind.shape[0]
    ops = jnp.zeros((t,), jnp.int32)
    vals = (jnp.zeros((t,), jnp.int32), jnp.ones((t,), jnp.int32), jnp.zeros((t,), jnp.float32),
            jnp.zeros((t,), bool))
    op_kind = jnp.where(unary, jnp.where(kind == MINUS, NEG, POS), kind)

    def step(carry, _):
        i, ops, n_ops, vals, n_vals, zero = carry
        k = op_kind[i]
        top = jnp.where(n_ops > 0, ops[jnp.maximum(n_ops - 1, 0)], OPEN)
        binary = (k >= PLUS) & (k <= DIVIDE)
        pop = (top != OPEN) & (
            (binary & (_PRECEDENCE[top] >= _PRECEDENCE[k])) | (k == CLOSE) | (k == END))
        # Apply the top operator: pop its operands, push the result.
        is_unary = (top == NEG) | (top == POS)
        right = jax.tree.map(lambda v: v[jnp.maximum(n_vals - 1, 0)], vals)
        left = jax.tree.map(lambda v: v[jnp.maximum(n_vals - 2, 0)], vals)
        p, q, f, o, z = _apply(top, left, right)
        at = jnp.where(is_unary, n_vals - 1, n_vals - 2)
        result_at = jnp.where(pop, at, t)
        vals_popped = tuple(v.at[result_at].set(x, mode="drop") for v, x in zip(vals, (p, q, f, o)))
        # Or consume the token.
        push_value = ~pop & (k == NUM)
        new_value = (value[i], jnp.int32(1), value[i].astype(jnp.float32), jnp.bool_(False))
        vals_pushed = tuple(v.at[jnp.where(push_value, n_vals, t)].set(x, mode="drop")
                            for v, x in zip(vals_popped, new_value))
        push_op = ~pop & ((k == OPEN) | binary | (k == NEG) | (k == POS))
        ops = ops.at[jnp.where(push_op, n_ops, t)].set(k, mode="drop")
        close = ~pop & (k == CLOSE)
        n_ops = n_ops + push_op - pop - close
        n_vals = n_vals + push_value - jnp.where(pop, jnp.where(is_unary, 0, 1), 0)
        i = jnp.where(pop | (k == END), i, jnp.minimum(i + 1, t - 1))
        return (i, ops, n_ops, vals_pushed, n_vals, zero | (pop & z)), None

    init = (jnp.int32(0), ops, jnp.int32(0), vals, jnp.int32(0), jnp.bool_(False))
    (_, _, _, vals, _, zero), _ = jax.lax.scan(step, init, None, length=2 * t)
    p, q, f, o = (v[0] for v in vals)
    return p, q, f, o, zero


def parse_expression(item: jax.Array, length: jax.Array) -> Expression:
    """item [W] int32 UTF-8 bytes (-1 padded), length [] int32 (the item's full length; more
    than W: cut, not evaluable) -> Expression (see the module docstring)."""
    item = jnp.asarray(item, jnp.int32)
    length = jnp.asarray(length, jnp.int32)
    kind, value, chars_ok, literals, count = _tokens(item, length)
    syntax_ok, unary = _syntax_ok(kind)
    p, q, f, overflow, zero = _evaluate(kind, value, unary)
    cut = length > item.shape[0]
    return Expression(
        literals=literals,
        num_literals=count,
        evaluable=chars_ok & syntax_ok & ~zero & ~cut & (length > 0),
        numerator=p,
        denominator=q,
        approx=f,
        exact=~overflow,
        cut=cut,
    )


def equals(expr: Expression, target: jax.Array) -> jax.Array:
    """[] bool: |value - target| < 1e-5 (the original's test), exactly on p / q when exact."""
    target = jnp.asarray(target, jnp.int32)
    q = expr.denominator
    fits = jnp.abs(target.astype(jnp.float32) * q.astype(jnp.float32)) < _EXACT_LIMIT
    diff = expr.numerator - target * q
    exact_close = jnp.abs(diff.astype(jnp.float32)) < 1e-5 * q.astype(jnp.float32)
    float_close = jnp.abs(expr.approx - target.astype(jnp.float32)) < 1e-5
    return expr.evaluable & jnp.where(expr.exact & fits, exact_close, float_close)


def uses_exactly(expr: Expression, nums: jax.Array, count: jax.Array) -> jax.Array:
    """[] bool: the literals are the given numbers as a multiset (the original's format check).
    nums [N] int32 (entries past `count` ignored), count [] int32."""
    n = nums.shape[0]
    if n > MAX_LITERALS:
        raise ValueError(f"at most {MAX_LITERALS} given numbers; got {n}")
    big = jnp.int32(2**31 - 1)
    given = jnp.sort(jnp.where(jnp.arange(n) < count, nums, big))
    seen = jnp.sort(jnp.where(jnp.arange(MAX_LITERALS) < expr.num_literals, expr.literals, big))
    return (expr.num_literals == count) & ~expr.cut & jnp.all(seen[:n] == given)
