"""Checkpoints of the TrainState with orbax's CheckpointManager: every k steps, keep the last n.

    checkpoints = Checkpoints(workdir / "checkpoints", every=10, keep=3)
    checkpoints.maybe_save(state)               # saves when state.step is a multiple of `every`
    checkpoints.maybe_save(state, force=True)   # the end of a run, or on SIGTERM
    state = checkpoints.restore_latest(like=fresh_state)   # None when there is no checkpoint
    checkpoints.close()

A checkpoint is the whole state (actor, optimiser moments, critic, reference, step counter), so
a run resumed from it, stepping with the same key, repeats a run never stopped bit for bit.
Saves are synchronous and atomic (orbax writes to a temporary directory and renames it), so a
killed run leaves only whole checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from starpo_jax.train import TrainState


class Checkpoints:
    """The run's checkpoint directory: save every `every` steps (0: only when forced), keep the
    newest `keep`."""

    def __init__(self, directory: Path, every: int, keep: int):
        if every < 0 or keep < 1:
            raise ValueError(f"checkpoint every = {every}, keep = {keep} are invalid; valid: "
                             f"every >= 0 (0 = only at the end), keep >= 1")
        self.every = every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                               create=True)
        self.manager = ocp.CheckpointManager(Path(directory).absolute(), options=options)

    @property
    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def maybe_save(self, state: TrainState, *, force: bool = False) -> bool:
        """Saves `state` under its step counter if that step is due (or `force`); True if saved."""
        step = int(state.step)
        due = self.every > 0 and step % self.every == 0
        if not (due or force) or step in self.manager.all_steps():
            return False
        return bool(self.manager.save(step, args=ocp.args.StandardSave(state), force=True))

    @property
    def steps(self) -> list[int]:
        """The saved steps, oldest first."""
        return sorted(self.manager.all_steps())

    def restore_latest(self, like: TrainState) -> TrainState | None:
        """The newest checkpoint, with the structure, shapes and dtypes of `like`; None if none."""
        step = self.latest_step
        return None if step is None else self.restore(step, like)

    def restore(self, step: int, like: TrainState) -> TrainState:
        """The checkpoint of `step`, with the structure, shapes and dtypes of `like`."""
        if step not in self.manager.all_steps():
            raise ValueError(f"no checkpoint of step {step}; saved steps: {self.steps}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        # Orbax commits every array to its device; uncommitted leaves of `like` (a fresh
        # single-device state) stay uncommitted so that the compiled step is reused, not redone.
        return jax.tree.map(lambda r, x: r if x.committed else jnp.asarray(np.asarray(r)),
                            restored, like)

    def close(self) -> None:
        self.manager.close()
