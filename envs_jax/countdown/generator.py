"""Countdown instances drawn in JAX: numbers, and a target reachable from them.

The original trains on a public dataset (Countdown-Tasks-3to4) made by the Stream-of-Search
generator: 3 or 4 numbers in 1..99, a target in 10..100 reached by combining two numbers at a
time with +, *, the larger minus the smaller, or an exact division of the larger by the
smaller; it then keeps only the instances solvable with + and - (`has_solution`: some signs
s_i in {+1, -1} with sum s_i n_i = target). Here each instance is drawn the same way: random
numbers, then random combinations (restricted to + and - when `plus_minus_only`, which makes
the signed-sum condition hold by construction), rejected unless every step is exact and the
target lands in range. `candidates` draws run side by side and the first accepted one wins:
a draw is accepted with probability about 0.5 with + and - only, 0.18 / 0.09 / 0.045 with all
four operations for 3 / 4 / 5 numbers, so the defaults (64 and 256 draws) leave none accepted
with probability below 1e-5 (then the first draw is kept, its target possibly out of range).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MIN_NUMBER, MAX_NUMBER = 1, 99
MIN_TARGET, MAX_TARGET = 10, 100
_LIMIT = 10**6  # intermediate values beyond this are rejected (int32-safe products)


def _combine(key: jax.Array, values: jax.Array, count: jax.Array, plus_minus_only: bool):
    """One candidate: values [M] int32 (the first `count` used) -> (target [], ok [])."""
    m = values.shape[0]
    active = jnp.arange(m) < count
    ok = jnp.bool_(True)
    for step, step_key in enumerate(jax.random.split(key, m - 1)):
        pick_key, op_key = jax.random.split(step_key)
        scores = jnp.where(active, jax.random.uniform(pick_key, (m,)), -1.0)
        i = jnp.argmax(scores)
        j = jnp.argmax(scores.at[i].set(-1.0))
        a, b = values[i], values[j]
        hi, lo = jnp.maximum(a, b), jnp.minimum(a, b)
        op = jax.random.randint(op_key, (), 0, 2 if plus_minus_only else 4)
        divisible = (lo != 0) & (hi % jnp.where(lo == 0, 1, lo) == 0)
        result = jnp.select(
            [op == 0, op == 1, op == 2],
            [a + b, hi - lo, jnp.minimum(a * b, _LIMIT)],
            hi // jnp.where(lo == 0, 1, lo),
        )
        go = step < count - 1
        ok = ok & ~(go & (((op == 3) & ~divisible) | (result >= _LIMIT)))
        values = jnp.where(go, values.at[i].set(result), values)
        active = jnp.where(go, active.at[j].set(False), active)
    target = jnp.sum(jnp.where(active, values, 0))
    return target, ok & (target >= MIN_TARGET) & (target <= MAX_TARGET)


def generate(
    key: jax.Array,
    *,
    min_numbers: int,
    max_numbers: int,
    plus_minus_only: bool,
    candidates: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One instance: (nums [max_numbers] int32, 0 past `count`; count [] int32; target [])."""
    if candidates is None:
        candidates = 64 if plus_minus_only else 256
    count_key, nums_key, combine_key = jax.random.split(key, 3)
    count = jax.random.randint(count_key, (), min_numbers, max_numbers + 1)
    nums = jax.random.randint(nums_key, (candidates, max_numbers), MIN_NUMBER, MAX_NUMBER + 1)
    nums = jnp.where(jnp.arange(max_numbers) < count, nums, 0)
    targets, ok = jax.vmap(lambda k, v: _combine(k, v, count, plus_minus_only))(
        jax.random.split(combine_key, candidates), nums
    )
    pick = jnp.argmax(ok)
    return nums[pick].astype(jnp.int32), count.astype(jnp.int32), targets[pick].astype(jnp.int32)
