"""The uncertainty filter keeps exactly the right groups, in a static count, under jit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax.filtering import (
    gather_group_rows,
    gather_groups,
    group_std,
    num_kept_groups,
    select_groups,
)

# Five groups of four; unbiased stds (in order): 0.577, 0, 1.155, 0.577, 0.
SCORES = np.array(
    [
        [0.0, 1.0, 1.0, 1.0],
        [2.0, 2.0, 2.0, 2.0],
        [0.0, 2.0, 2.0, 2.0],
        [1.0, 0.0, 0.0, 0.0],
        [5.0, 5.0, 5.0, 5.0],
    ],
    np.float32,
)


@pytest.mark.parametrize(
    "num_groups,keep_ratio,want",
    [
        (8, 0.25, 2),
        (8, 0.3, 2),
        (8, 0.1, 1),
        (8, 1.0, 8),
        (1, 0.25, 1),
        (100, 0.29, 28),
        (5, 0.6, 3),
    ],
)
def test_num_kept_groups_follows_ragen_rounding(num_groups, keep_ratio, want):
    assert num_kept_groups(num_groups, keep_ratio) == want


@pytest.mark.parametrize(
    "scores,keep_ratio,mode,want",
    [
        (SCORES, 0.2, "std", [2]),
        (SCORES, 0.4, "std", [0, 2]),  # groups 0 and 3 tie; the lower index wins
        (SCORES, 0.6, "std", [0, 2, 3]),
        (SCORES, 0.2, "std_rev", [1]),  # groups 1 and 4 tie at 0
        (SCORES, 0.4, "std_rev", [1, 4]),
        (SCORES, 0.6, "std_rev", [0, 1, 4]),
        (SCORES, 1.0, "std", [0, 1, 2, 3, 4]),
        (SCORES, 1.0, "std_rev", [0, 1, 2, 3, 4]),
        (SCORES, 0.1, "std", [2]),  # int(0.5) = 0 -> at least one group
        (SCORES[3:4], 0.25, "std", [0]),  # P = 1
        (np.zeros((4, 3), np.float32), 0.5, "std", [0, 1]),  # all tied
        (np.array([[0, 0], [3, 1], [1, 0], [0, 4]], np.float32), 0.5, "std", [1, 3]),
    ],
)
def test_select_groups_keeps_the_right_groups(scores, keep_ratio, mode, want):
    select = jax.jit(functools.partial(select_groups, keep_ratio=keep_ratio, mode=mode))
    kept, stds = select(scores)
    assert kept.dtype == jnp.int32 and kept.shape == (len(want),)
    np.testing.assert_array_equal(kept, want)
    np.testing.assert_allclose(stds, np.std(scores, axis=1, ddof=1), rtol=1e-6)


def test_group_std_of_single_rollout_groups_is_zero():
    np.testing.assert_array_equal(group_std(np.array([[1.0], [3.0]])), [0.0, 0.0])
    kept, _ = select_groups(np.array([[1.0], [3.0], [2.0]]), 0.5)
    np.testing.assert_array_equal(kept, [0])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"keep_ratio": 0.0}, r"keep_ratio must be a number in \(0, 1\]; got 0.0"),
        ({"keep_ratio": 1.5}, "got 1.5"),
        ({"keep_ratio": -0.25}, "got -0.25"),
        ({"mode": "var"}, "unknown filter mode 'var'; valid: std, std_rev"),
        ({"scores": np.zeros(4)}, r"\[P, N\]"),
    ],
)
def test_select_groups_rejects_bad_arguments(kwargs, match):
    args = {"scores": SCORES, "keep_ratio": 0.5, "mode": "std"} | kwargs
    with pytest.raises(ValueError, match=match):
        select_groups(**args)


def test_gather_groups_and_rows():
    num_groups, group_size = 5, 4
    tree = {
        "tokens": np.arange(num_groups * group_size * 3).reshape(num_groups, group_size, 3),
        "scores": SCORES,
    }
    kept = jnp.array([0, 2], jnp.int32)
    got = jax.jit(gather_groups)(tree, kept)
    np.testing.assert_array_equal(got["tokens"], tree["tokens"][[0, 2]])
    np.testing.assert_array_equal(got["scores"], SCORES[[0, 2]])

    flat = {k: v.reshape(num_groups * group_size, *v.shape[2:]) for k, v in tree.items()}
    got_rows = jax.jit(gather_group_rows, static_argnums=2)(flat, kept, group_size)
    np.testing.assert_array_equal(got_rows["tokens"], got["tokens"].reshape(8, 3))
    np.testing.assert_array_equal(got_rows["scores"], np.concatenate([SCORES[0], SCORES[2]]))
    with pytest.raises(ValueError, match="not a multiple of group_size 3"):
        gather_group_rows(flat, kept, 3)
