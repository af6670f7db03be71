"""What the update learns from: `Batch` (a rollout's kept rows and what `prepare` computed on
them) and `MiniBatch` (the rows of one mini-batch update). A field the config does not need is
None; the mode is read from which fields are None, not from which keys a dict holds."""

from __future__ import annotations

import flax.struct
import jax

from starpo_jax.algo.filtering import GroupSelection
from starpo_jax.rollout.jax_env import Rollout


class Batch(flax.struct.PyTreeNode):
    """What an update learns from: the kept rows of a rollout (R = K * N) and what `prepare`
    computed on them. Optional fields are None when the config does not need them."""

    rollout: Rollout  # the kept rows, [R, L] / [R, T]
    selection: GroupSelection  # which groups were kept, and every group's reward std
    advantages: jax.Array  # [R, L] float32
    returns: jax.Array | None  # [R, L] float32 (PPO)
    old_values: jax.Array | None  # [R, L] float32 (PPO)
    old_logp: jax.Array | None  # [R, L] float32; None: one update, ratio 1 by construction
    ref_logp: jax.Array | None  # [R, L] float32 (kl_coef > 0)


class MiniBatch(flax.struct.PyTreeNode):
    """The rows of one mini-batch update, M = R / minibatches (or a micro-batch's slice of
    them): a Batch's per-row fields and each row's group. None as in Batch."""

    rollout: Rollout  # [M, L] / [M, T]
    groups: jax.Array  # [M] int32 each row's kept group (the shared-prefix forward's)
    advantages: jax.Array  # [M, L] float32
    old_logp: jax.Array | None  # [M, L] float32; None: this update's own, ratio 1
    ref_logp: jax.Array | None  # [M, L] float32 (kl_coef > 0)
    old_values: jax.Array | None  # [M, L] float32 (PPO)
    returns: jax.Array | None  # [M, L] float32 (PPO)

    @classmethod
    def of(cls, batch: Batch, groups: jax.Array) -> MiniBatch:
        """All of `batch`'s rows as one MiniBatch (`update` cuts it into mini-batches);
        groups: [R] int32."""
        return cls(rollout=batch.rollout, groups=groups, advantages=batch.advantages,
                   old_logp=batch.old_logp, ref_logp=batch.ref_logp,
                   old_values=batch.old_values, returns=batch.returns)
