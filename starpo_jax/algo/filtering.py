"""StarPO-S uncertainty filtering: train only on the groups whose N returns disagree most.

A group is the N trajectories rolled out from one initial state. Its uncertainty is the std of
their scores (summed rewards WITHOUT the format penalty; the caller passes those). The groups
are ranked by it, largest first ("std", the original's filter_type "largest") or smallest
first ("std_rev", "smallest": the paper's ablation), and a strategy (RAGEN-2's
`rollout_filter_strategy`, semantics as its `rollout_filter.py`) decides how many of the
ranking to keep. Other group scores may rank instead (`metric`, the original's
rollout_filter_metric): "reward_variance" (the std above, the default), "reward" (the mean
score), "reward_sum" (the summed scores), "entropy" (the mean over the group of each
trajectory's mean token entropy), "entropy_variance" (the std of those), "length" (the mean
count of sampled tokens); the rules below then read that score where they say std.

- "top_k": K = max(1, int(keep_ratio * P)), RAGEN's rule, float rounding included:
  0.25 * 8 -> 2, 0.3 * 8 -> 2, 0.1 * 8 -> 1, 0.29 * 100 -> 28 (the product is 28.999...).
- "top_k_abs": keep_groups of them.
- "top_p", weights "linear": the fewest groups whose summed std reaches top_p * (sum of all
  stds) - top_p_eps, taken while their std is > 0; if that sum is never reached, none.
  Weights "softmax": the fewest whose softmax(std) mass (softmax(-std) for std_rev) reaches
  top_p. top_p = 1 keeps every candidate either way.
- "min_p": "std" keeps the groups with std >= min_p * (largest std); "std_rev" those with
  std <= (smallest std) / min_p.
With include_zero False, groups of zero std are never candidates (a group of one rollout has
std 0); the ratios above still count all P groups, the kept count is at most the candidates'.

Shapes stay static inside jit: `select_groups` returns a static bound Kmax of group indices
(`kept_bound`: K for top_k, keep_groups for top_k_abs, P for top_p and min_p; at most
max_groups when that is set) and a mask of the ones really kept. Ties are broken stably (of
equal stds the lower group index ranks first), where the original's torch sort leaves them
unspecified.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp

# The filter's names and its static bounds live with FilterConfig (no JAX there).
from starpo_jax.config import (FILTER_METRICS, FILTER_MODES, FILTER_STRATEGIES,  # noqa: F401
                               LOSS_SCALINGS, TOP_P_WEIGHTS, VALUE_METRICS, FilterConfig,
                               kept_bound, num_kept_groups)


# The original's zero test (|std| > 1e-10 is "non-zero") and min_p's slack, in float32.
_ZERO = 1e-10

Tree = TypeVar("Tree")


def group_std(scores: jax.Array) -> jax.Array:
    """Per-group std of trajectory scores: [P, N] -> [P] float32.

    Unbiased (ddof 1), as the original's torch `std` logs it as rollout/in_group_std; the
    ranking is the same either way. A group of one (N = 1) has std 0. Computed on the scores
    less each group's first score, so a group of equal scores has std exactly 0 (a float32 mean
    of equal values can miss them by a rounding, which include_zero False would count).
    """
    scores = jnp.asarray(scores, jnp.float32)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [P, N]; got shape {scores.shape}")
    if scores.shape[1] == 1:
        return jnp.zeros(scores.shape[:1], jnp.float32)
    return jnp.std(scores - scores[:, :1], axis=1, ddof=1)


class GroupSelection(NamedTuple):
    """Which groups the filter kept, and the score it ranked them by."""

    indices: jax.Array  # [Kmax] int32 candidate group indices, ascending
    kept: jax.Array  # [Kmax] bool: indices[i] is really kept (variable-count strategies)
    group_std: jax.Array  # [P] float32 std of every group's scores
    group_score: jax.Array  # [P] float32 what the groups were ranked by (config.metric)


def group_scores(scores: jax.Array, metric: str, values: jax.Array | None = None) -> jax.Array:
    """The filter's ranking score of each group: [P, N] -> [P] float32 (module docstring).

    scores: [P, N] trajectory scores; values: [P, N] the per-trajectory entropy (entropy
    metrics) or sampled-token count (length), needed by those metrics only. Stds are unbiased,
    computed as `group_std` (exactly 0 for equal members).
    """
    if metric not in FILTER_METRICS:
        raise ValueError(f"unknown filter metric {metric!r}; valid: {', '.join(FILTER_METRICS)}")
    if metric in VALUE_METRICS:
        if values is None:
            raise ValueError(f"filter metric {metric!r} needs per-trajectory values")
        scores = values
    scores = jnp.asarray(scores, jnp.float32)
    if metric.endswith("variance"):
        return group_std(scores)
    if metric == "reward_sum":
        return scores.sum(axis=1)
    return scores.mean(axis=1)


def kept_share(selection: GroupSelection, config: FilterConfig) -> jax.Array:
    """The factor `filter.loss_scaling` puts on the advantages: the share of the P groups
    really kept (the original's filter_kept_ratio) for "linear", its square root for "sqrt",
    1 for "none". Returns a float32 scalar."""
    share = selection.kept.sum() / jnp.float32(selection.group_std.shape[0])
    if config.loss_scaling == "linear":
        return share
    if config.loss_scaling == "sqrt":
        return jnp.sqrt(share)
    return jnp.float32(1.0)


def _kept_count(ranked: jax.Array, candidates: jax.Array, config: FilterConfig,
                num_groups: int) -> jax.Array:
    """How many of the ranking to keep. ranked: [P] stds in rank order, non-candidates last;
    candidates: [P] bool in the same order. Returns an int32 scalar in [0, #candidates]."""
    n = candidates.sum().astype(jnp.int32)
    largest = config.mode == "std"
    if config.strategy == "top_k":
        return jnp.minimum(num_kept_groups(num_groups, config.keep_ratio), n)
    if config.strategy == "top_k_abs":
        return jnp.minimum(config.keep_groups, n)
    if config.strategy == "min_p":
        if largest:
            threshold = jnp.max(jnp.where(candidates, ranked, -jnp.inf)) * config.min_p
            keep = ranked >= threshold - _ZERO
        else:
            threshold = jnp.min(jnp.where(candidates, ranked, jnp.inf)) / (config.min_p + _ZERO)
            keep = ranked <= threshold + _ZERO
        return (keep & candidates).sum().astype(jnp.int32)
    if config.top_p >= 1.0:
        return n
    if config.top_p_weights == "softmax":
        logits = jnp.where(candidates, ranked if largest else -ranked, -jnp.inf)
        z = jnp.exp(logits - jnp.max(logits))
        probs = jnp.where(candidates, z, 0.0) / jnp.maximum(jnp.sum(jnp.where(candidates, z, 0.0)),
                                                              jnp.finfo(jnp.float32).tiny)
        # The first rank whose cumulative mass reaches top_p is the last one kept.
        reached = (jnp.cumsum(probs) < config.top_p).sum().astype(jnp.int32) + 1
        return jnp.minimum(reached, n)
    # Linear: add stds in rank order until the running sum reaches the threshold, stopping at a
    # std <= 0 or at the end of the candidates; keep them only if it was reached.
    values = jnp.where(candidates, ranked, 0.0)
    threshold = config.top_p * values.sum() - config.top_p_eps
    before = jnp.concatenate([jnp.zeros(1, jnp.float32), jnp.cumsum(values)])  # [P + 1]
    stop = (before[:-1] >= threshold) | (values <= 0) | ~candidates
    count = jnp.argmax(jnp.concatenate([stop, jnp.ones(1, bool)])).astype(jnp.int32)
    return jnp.where(before[count] >= threshold, count, 0)


def select_groups(scores: jax.Array, config: FilterConfig,
                  values: jax.Array | None = None) -> GroupSelection:
    """Picks the groups to train on (strategies and metrics: the module docstring).

    scores: [P, N] trajectory scores without the format penalty; values: [P, N] per-trajectory
    entropy or length for those metrics (`group_scores`).
    config: a FilterConfig (static: metric, strategy, its parameters, include_zero, mode,
    max_groups).
    Returns GroupSelection(indices [Kmax] int32 ascending, kept [Kmax] bool, group_std [P]
    float32, group_score [P] float32), Kmax = kept_bound(P, config): the kept groups are
    indices[kept]; with max_groups below the strategy's count, the highest-ranked max_groups of
    them.
    """
    reward_std = group_std(scores)
    stds = group_scores(scores, config.metric, values)  # the ranked score, "std" below
    num_groups = stds.shape[0]
    bound = kept_bound(num_groups, config)
    candidates = jnp.ones(num_groups, bool) if config.include_zero else jnp.abs(stds) > _ZERO
    key = -stds if config.mode == "std" else stds
    order = jnp.argsort(jnp.where(candidates, key, jnp.inf), stable=True)
    count = _kept_count(stds[order], candidates[order], config, num_groups)
    top = order[:bound]
    kept = jnp.arange(bound) < count
    ascending = jnp.argsort(top)
    return GroupSelection(top[ascending].astype(jnp.int32), kept[ascending], reward_std, stds)


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
