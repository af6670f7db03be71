"""Failure modes: every trajectory gets exactly one class, from its env states, inside jit.

    kinds = classify(success, dead_end, looped, format_ok, turn_taken, effective_actions)  # [B]
    fractions = failure_fractions(kinds)     # {"success": [], "dead_end": [], ...}, sum 1

Classes (FAILURE_KINDS, class id = index), the first that applies:
  success        the trajectory succeeded;
  dead_end       its final state can no longer succeed (`TextEnv.dead_end`: a Sokoban box stuck
                 off target, a FrozenLake hole);
  loop           it returned to a state it had been in before (`TextEnv.fingerprint` equal to
                 an earlier one's, the step itself having changed the state);
  format         some turn had no parsable answer;
  invalid        no step changed the state (no valid action, or only blocked ones);
  out_of_budget  none of the above: the turns, the action budget or the env's step limit ran out.
The order puts what decided the outcome first: a dead end or a loop explains a failure better
than one badly formatted turn among good ones, and a trajectory whose every turn was
unparsable also took no effective step, so format comes before invalid.

The rollout keeps a [B, max_actions_per_traj + 1] history of state fingerprints (`LoopHistory`)
and asks `dead_end` of the final states: env-state bookkeeping only, no model work.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

FAILURE_KINDS = ("success", "dead_end", "loop", "format", "invalid", "out_of_budget")
SUCCESS, DEAD_END, LOOP, FORMAT, INVALID, OUT_OF_BUDGET = range(len(FAILURE_KINDS))


def classify(success: jax.Array, dead_end: jax.Array, looped: jax.Array, format_ok: jax.Array,
             turn_taken: jax.Array, effective_actions: jax.Array) -> jax.Array:
    """Class id of each trajectory (see the module docstring).

    success, dead_end, looped [B] bool; format_ok, turn_taken [B, T] bool;
    effective_actions [B] int32 -> [B] int32 in 0..5 (index into FAILURE_KINDS).
    """
    bad_format = jnp.any(turn_taken & ~format_ok, axis=-1)
    checks = (success, dead_end, looped, bad_format, effective_actions == 0)
    kind = jnp.full(success.shape, OUT_OF_BUDGET, jnp.int32)
    for kind_id in reversed(range(len(checks))):  # the earliest class that applies wins
        kind = jnp.where(checks[kind_id], kind_id, kind)
    return kind


def failure_fractions(kinds: jax.Array) -> dict[str, jax.Array]:
    """{kind: fraction of the rows in that class} of [B] int32 class ids; [] float32 each."""
    return {name: jnp.mean((kinds == i).astype(jnp.float32))
            for i, name in enumerate(FAILURE_KINDS)}


class LoopHistory(flax.struct.PyTreeNode):
    """The fingerprints of the states a row has been in, for loop detection.

    seen: [B, H] uint32, H = max_actions_per_traj + 1 (the initial state, then one per step);
    count: [B] int32 valid entries; looped: [B] bool some step returned to an earlier state.
    """

    seen: jax.Array
    count: jax.Array
    looped: jax.Array

    @classmethod
    def start(cls, fingerprints: jax.Array, max_actions: int) -> LoopHistory:
        """The history of rows in their initial states: fingerprints [B] uint32."""
        b = fingerprints.shape[0]
        seen = jnp.zeros((b, max_actions + 1), jnp.uint32).at[:, 0].set(fingerprints)
        return cls(seen=seen, count=jnp.ones((b,), jnp.int32), looped=jnp.zeros((b,), bool))

    def record(self, fingerprints: jax.Array, stepped: jax.Array) -> LoopHistory:
        """Adds the state after a step for rows where `stepped` [B] bool; fingerprints [B].

        A step that left the state as it was (a blocked move) is not a loop; one that changed
        it into any earlier state is."""
        b, width = self.seen.shape
        cols = jnp.arange(width)
        last = jnp.take_along_axis(self.seen, (self.count - 1)[:, None], 1)[:, 0]
        earlier = jnp.any((self.seen == fingerprints[:, None]) & (cols < self.count[:, None]),
                          axis=1)
        looped = self.looped | (stepped & (fingerprints != last) & earlier)
        at = jnp.where(stepped & (self.count < width), self.count, width)  # width: dropped
        seen = self.seen.at[jnp.arange(b), at].set(fingerprints, mode="drop")
        return LoopHistory(seen=seen, count=jnp.minimum(self.count + stepped, width),
                           looped=looped)

