"""Checkpoints of the TrainState with orbax's CheckpointManager: every k steps, keep the last n.

    checkpoints = Checkpoints(workdir / "checkpoints", every=10, keep=3)
    checkpoints.maybe_save(state)               # saves when state.step is a multiple of `every`
    checkpoints.maybe_save(state, force=True)   # the end of a run, or on SIGTERM
    state = checkpoints.restore_latest(like=fresh_state)   # None when there is no checkpoint
    checkpoints.close()

A checkpoint is the whole state (actor, optimiser moments, critic, reference, step counter), so
a run resumed from it, stepping with the same key, repeats a run never stopped bit for bit.
Saves are synchronous and atomic: orbax writes <step>.orbax-checkpoint-tmp/ and renames it to
<step>/ when complete, and lists only renamed directories, so a run killed mid-save leaves the
previous checkpoints as they were; the leftover temporary directory is removed when the
checkpoints are next opened. A failed save (disk full, unwritable) or a checkpoint that cannot
be restored (cut short, made by another config) raises RunFault: one line naming the step and
directory, what is kept and how to go on, never orbax's traceback.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import sys
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from starpo_jax.models.lora import adapted_config, merged_params
from starpo_jax.run.schema import train_config
from starpo_jax.run.workdir import RunFault
from starpo_jax.train.state import TrainState, init_train_state


class Checkpoints:
    """The run's checkpoint directory: save every `every` steps (0: only when forced), keep the
    newest `keep`."""

    def __init__(self, directory: Path, every: int, keep: int):
        if every < 0 or keep < 1:
            raise ValueError(f"checkpoint every = {every}, keep = {keep} are invalid; valid: "
                             f"every >= 0 (0 = only at the end), keep >= 1")
        self.every = every
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                               create=True, cleanup_tmp_directories=True)
        try:
            self.manager = ocp.CheckpointManager(self.directory, options=options,
                                                 item_handlers=ocp.StandardCheckpointHandler())
        except OSError as error:
            raise RunFault(f"cannot open the checkpoint directory {self.directory} ({error}): "
                           "pass another --workdir") from None

    @property
    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def maybe_save(self, state: TrainState, *, force: bool = False) -> bool:
        """Saves `state` under its step counter if that step is due (or `force`); True if saved."""
        step = int(state.step)
        due = self.every > 0 and step % self.every == 0
        if not (due or force) or step in self.manager.all_steps():
            return False
        try:
            with _quiet_orbax():
                return bool(self.manager.save(step, args=ocp.args.StandardSave(state),
                                              force=True))
        except Exception as error:  # orbax and tensorstore raise ValueError or bare Exception
            kept = (f"the newest checkpoint, step {self.latest_step}, is kept"
                    if self.latest_step is not None else "there is no earlier checkpoint")
            raise RunFault(f"saving the checkpoint of step {step} in {self.directory} failed "
                           f"({_first_line(error)}); {kept}. Free space or fix the workdir, then "
                           "--resume") from error

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
        where = self.directory / str(step)
        older = [s for s in self.steps if s < step]
        instead = (f"delete {where} to resume from step {older[-1]}" if older else
                   "delete it")
        try:
            with _quiet_orbax():
                mismatch = _mismatch(self.manager.item_metadata(step).tree, abstract)
                if mismatch is None:
                    restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as error:  # a file cut short or missing: JSON, tensorstore, orbax
            raise RunFault(f"checkpoint {where} is damaged ({_first_line(error)}): {instead}, "
                           "or pass another --workdir") from error
        if mismatch is not None:
            raise RunFault(f"checkpoint {where} was made by another config: {mismatch}. Resume "
                           "with the config that made it, or pass another --workdir")
        # An abstract `like` (jax.eval_shape) takes the arrays as restored.
        return committed_like(restored, like)

    def close(self) -> None:
        self.manager.close()


def _mismatch(saved: object, abstract: TrainState) -> str | None:
    """What differs between a checkpoint's tree metadata and the state to restore into (the
    first differing path, shape or dtype), or None."""
    def paths(tree):
        leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
        return {jax.tree_util.keystr(p, simple=True, separator="/"): x for p, x in leaves
                if x is not None}
    here = paths(abstract)
    there = paths(saved if isinstance(saved, dict) else dict(saved))
    if here.keys() != there.keys():
        parts = [f"{len(names)} arrays only in {side} ({', '.join(sorted(names)[:2])}, ...)"
                 for side, names in (("the checkpoint", there.keys() - here.keys()),
                                     ("this run's state", here.keys() - there.keys())) if names]
        return " and ".join(parts)
    for name, x in here.items():
        shape, dtype = tuple(there[name].shape), there[name].dtype
        if shape != tuple(x.shape) or dtype != x.dtype:
            return (f"{name} is {dtype}{list(shape)} in the checkpoint, {x.dtype}{list(x.shape)} "
                    "in this run")
    return None


def _first_line(error: BaseException) -> str:
    """The gist of an orbax / tensorstore error: its first line, without the store's spec."""
    text = str(error).split("See full TensorStore details")[0].strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """orbax logs a failure's traceback from its worker threads, and its abandoned reads report
    theirs as unraisable exceptions; the RunFault raised from the error says it in one line."""
    logger, hook = logging.getLogger("absl"), sys.unraisablehook
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    sys.unraisablehook = lambda _: None
    try:
        yield
    finally:
        gc.collect()  # the abandoned reads are reported as they are collected: now
        logger.setLevel(level)
        sys.unraisablehook = hook


def committed_like(restored: Any, like: Any) -> Any:
    """`restored` (arrays orbax returns, each committed to its device) with the leaves whose
    counterpart in `like` is uncommitted (a fresh single-device state or model) made uncommitted
    too. A train step first called with committed weights and an uncommitted step counter
    returns everything committed and compiles again for step 2; leaves of a sharded or abstract
    `like` are kept as restored."""
    return jax.tree.map(
        lambda r, x: r if getattr(x, "committed", True) else jnp.asarray(np.asarray(r)),
        restored, like)


def load_init_weights(model: Any, workdir: str | Path, source: str, dtype: str) -> Any:
    """`model` (a Decoder without adapters, loaded from model `source` in `dtype`) with the
    policy weights of an SFT (or StarPO) workdir's newest checkpoint, LoRA adapters merged in.
    Raises ValueError when the workdir has no config.json or checkpoint, or was trained from
    another base model."""
    workdir = Path(workdir)
    path = workdir / "config.json"
    if not path.is_file():
        raise ValueError(f"config.model.init_from = {str(workdir)!r} is invalid; valid: a "
                         "workdir of experiments/sft.py or run.py (it has no config.json)")
    saved = json.loads(path.read_text())
    saved.pop("auto_memory", None)
    saved.pop("sft", None)
    saved.get("model", {}).pop("init_from", None)
    base = (saved.get("model", {}).get("source"), saved.get("model", {}).get("dtype"))
    if base != (source, dtype):
        raise ValueError(f"config.model.init_from = {str(workdir)!r} was trained from model "
                         f"{base}; valid: a workdir trained from this run's {(source, dtype)}")
    train = train_config(saved)
    checkpoints = Checkpoints(workdir / "checkpoints", 0, 1)
    try:
        like = jax.eval_shape(lambda: init_train_state(train, jax.random.PRNGKey(0), model=model))
        state = checkpoints.restore_latest(like)
    finally:
        checkpoints.close()
    if state is None:
        raise ValueError(f"config.model.init_from = {str(workdir)!r} holds no checkpoint")
    params = nnx.to_pure_dict(state.actor)
    if train.lora.rank:
        params = merged_params(params, adapted_config(model.config, train.lora))
    graphdef, weights = nnx.split(model)
    nnx.replace_by_pure_dict(weights, committed_like(params, nnx.to_pure_dict(weights)))
    return nnx.merge(graphdef, weights)
