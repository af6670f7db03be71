"""StarPO-S uncertainty filtering: train only on the groups whose N returns disagree most.

A group is the N trajectories rolled out from one initial state. Its uncertainty is the std of
their scores (summed rewards WITHOUT the format penalty; the caller passes those). StarPO-S keeps
the top `keep_ratio` of groups by that std ("std"); "std_rev" keeps the lowest instead (the
paper's ablation). The kept count is static, so the filtered batch has a static shape inside jit.

Count: K = max(1, int(keep_ratio * P)), RAGEN's rule (`int(value * num_groups)`, at least 1, in
its rollout filter), float rounding included: 0.25 * 8 -> 2, 0.3 * 8 -> 2, 0.1 * 8 -> 1, and
0.29 * 100 -> 28 (the product is 28.999...).
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp

FILTER_MODES = ("std", "std_rev")

Tree = TypeVar("Tree")


def num_kept_groups(num_groups: int, keep_ratio: float) -> int:
    """K = max(1, int(keep_ratio * num_groups)), for num_groups >= 1 and keep_ratio in (0, 1]."""
    if not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"num_groups must be a positive int; got {num_groups!r}")
    if not isinstance(keep_ratio, (int, float)) or not 0.0 < keep_ratio <= 1.0:
        raise ValueError(f"keep_ratio must be a number in (0, 1]; got {keep_ratio!r}")
    return max(1, int(keep_ratio * num_groups))


def group_std(scores: jax.Array) -> jax.Array:
    """Per-group std of trajectory scores: [P, N] -> [P] float32.

    Unbiased (ddof 1), as the original's torch `std` logs it as rollout/in_group_std; the
    ranking is the same either way. A group of one (N = 1) has std 0.
    """
    scores = jnp.asarray(scores, jnp.float32)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [P, N]; got shape {scores.shape}")
    if scores.shape[1] == 1:
        return jnp.zeros(scores.shape[:1], jnp.float32)
    return jnp.std(scores, axis=1, ddof=1)


class GroupSelection(NamedTuple):
    """Which groups the filter kept, and the uncertainty it ranked them by."""

    indices: jax.Array  # [K] int32 kept group indices, ascending
    group_std: jax.Array  # [P] float32 std of every group's scores


def select_groups(scores: jax.Array, keep_ratio: float = 0.25, mode: str = "std") -> GroupSelection:
    """Picks the K = max(1, int(keep_ratio * P)) groups to train on.

    scores: [P, N] trajectory scores without the format penalty.
    keep_ratio: Python float in (0, 1]; 1.0 keeps every group (the filter is off).
    mode: "std" keeps the K largest in-group stds, "std_rev" the K smallest.
    Ties are broken stably: of equal stds the lower group index is kept. The kept indices are
    returned ascending, so the filtered batch keeps the original group order.
    Returns GroupSelection(indices [K] int32, group_std [P] float32).
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; valid: {', '.join(FILTER_MODES)}")
    stds = group_std(scores)
    k = num_kept_groups(stds.shape[0], keep_ratio)
    ranking = jnp.argsort(-stds if mode == "std" else stds, stable=True)
    return GroupSelection(jnp.sort(ranking[:k]).astype(jnp.int32), stds)


def gather_groups(tree: Tree, indices: jax.Array) -> Tree:
    """Keeps the given groups of every leaf: [P, N, ...] -> [K, N, ...] (K = len(indices))."""
    return jax.tree.map(lambda x: jnp.take(x, indices, axis=0), tree)


def gather_group_rows(tree: Tree, indices: jax.Array, group_size: int) -> Tree:
    """Same on group-major flat batches: [P * N, ...] -> [K * N, ...] (row b = p * N + n)."""

    def gather(x: jax.Array) -> jax.Array:
        if x.shape[0] % group_size:
            raise ValueError(
                f"leading dim {x.shape[0]} is not a multiple of group_size {group_size}"
            )
        grouped = x.reshape(x.shape[0] // group_size, group_size, *x.shape[1:])
        kept = jnp.take(grouped, indices, axis=0)
        return kept.reshape(-1, *x.shape[1:])

    return jax.tree.map(gather, tree)
