"""Checkpoints of the TrainState with orbax's CheckpointManager: every k steps, keep the last n.

    checkpoints = Checkpoints(workdir / "checkpoints", every=10, keep=3)
    checkpoints.maybe_save(state)               # saves when state.step is a multiple of `every`
    checkpoints.maybe_save(state, force=True)   # the end of a run, or on SIGTERM
    state = checkpoints.restore_latest(like=fresh_state)   # None when there is no checkpoint
    checkpoints.close()

A checkpoint is everything the run changes (actor, optimiser moments, critic, step counter), so
a run resumed from it, stepping with the same key, repeats a run never stopped bit for bit.
What never changes is left out (`saved_tree`): a LoRA actor's frozen base weights and the KL
reference, both what the run's fresh state holds again (model.source, model.init_from). In
their place the checkpoint keeps a fingerprint of each (`fingerprints`: an exact integer hash
of every array's bits), and restoring takes them from `like` (the fresh state) after checking
the fingerprints, so a base that changed since (another model.source file, an init_from workdir
trained further) is refused, not silently resumed. A LoRA checkpoint is then the adapters, their
AdamW moments, the critic's adapters and value head and the step; checkpoints of full-state
LoRA runs written before are restored as they are. Full fine-tuning keeps the weights and their
AdamW moments (3x the weights in float32): an exact resume needs both.

Saves are synchronous and atomic: orbax writes <step>.orbax-checkpoint-tmp/ and renames it to
<step>/ when complete, and lists only renamed directories, so a run killed mid-save leaves the
previous checkpoints as they were; the leftover temporary directory is removed when the
checkpoints are next opened. A failed save (disk full, unwritable) or a checkpoint that cannot
be restored (cut short, made by another config or other base weights) raises RunFault: one line
naming the step and directory, what is kept and how to go on, never orbax's traceback.
`restore_actor` reads only a checkpoint's policy (export.py, model.init_from).
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

from starpo_jax.models.lora import adapted, joined, merged_params, split_trainable
from starpo_jax.run.schema import train_config
from starpo_jax.run.workdir import RunFault
from starpo_jax.train.state import TrainState

#: The key of a checkpoint that leaves frozen parts out: {part: its fingerprints}.
FROZEN = "frozen"


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
                return bool(self.manager.save(step, args=ocp.args.StandardSave(saved_tree(state)),
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
        """The checkpoint of `step`, with the structure, shapes and dtypes of `like`. The parts
        a checkpoint leaves out (`saved_tree`) are `like`'s own arrays (not copies), which must
        then be concrete and match the saved fingerprints."""
        if step not in self.manager.all_steps():
            raise ValueError(f"no checkpoint of step {step}; saved steps: {self.steps}")
        where = self.directory / str(step)
        older = [s for s in self.steps if s < step]
        instead = (f"delete {where} to resume from step {older[-1]}" if older else
                   "delete it")
        try:
            with _quiet_orbax():
                saved = self.manager.item_metadata(step).tree
                lean = isinstance(saved, dict) and FROZEN in saved
                abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                        _abstract_saved_tree(like) if lean else like)
                mismatch = _mismatch(saved, abstract)
                if mismatch is None:
                    restored = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as error:  # a file cut short or missing: JSON, tensorstore, orbax
            raise RunFault(f"checkpoint {where} is damaged ({_first_line(error)}): {instead}, "
                           "or pass another --workdir") from error
        if mismatch is not None:
            raise RunFault(f"checkpoint {where} was made by another config: {mismatch}. Resume "
                           "with the config that made it, or pass another --workdir")
        if lean:
            restored = _with_frozen(restored, like, where)
        # An abstract `like` (jax.eval_shape) takes the arrays as restored.
        return committed_like(restored, like)

    def close(self) -> None:
        self.manager.close()


def _parts(state: TrainState) -> tuple[nnx.State, dict[str, Any]]:
    """(the actor as a checkpoint saves it, the frozen parts it leaves out by name): a LoRA
    actor's base weights ("actor": the adapters are saved) and the KL reference ("reference")."""
    adapters, base = split_trainable(state.actor)
    frozen: dict[str, Any] = {}
    actor = state.actor
    if jax.tree.leaves(adapters):  # LoRA: the actor holds adapters
        actor, frozen["actor"] = adapters, base
    if state.reference is not None:
        frozen["reference"] = state.reference
    return actor, frozen


def _lean(state: TrainState, actor: nnx.State, marks: dict[str, Any]) -> dict[str, Any]:
    return {"actor": actor, "actor_opt": state.actor_opt, "critic": state.critic,
            "critic_opt": state.critic_opt, "reference": None, "step": state.step, FROZEN: marks}


def saved_tree(state: TrainState) -> TrainState | dict[str, Any]:
    """What a checkpoint of `state` holds: `state` itself when nothing in it is frozen (full
    fine-tuning without a KL reference), else its fields as a dict without the frozen parts
    (`_parts`: reference None, a LoRA actor's adapters only) and with FROZEN: {part: its
    `fingerprints`}."""
    if not isinstance(state, TrainState):  # another pytree (a test's scripted state): whole
        return state
    actor, frozen = _parts(state)
    return _lean(state, actor, fingerprints(frozen)) if frozen else state


def checkpoint_bytes(state: TrainState) -> int:
    """The bytes of the arrays a checkpoint of `state` writes (about its size on disk)."""
    if not isinstance(state, TrainState):
        return sum(x.nbytes for x in jax.tree.leaves(state))
    actor, frozen = _parts(state)
    kept = _lean(state, actor, {}) if frozen else state
    return sum(x.nbytes for x in jax.tree.leaves(kept))


def _marks_like(frozen: dict[str, Any], sharding: Any) -> dict[str, jax.ShapeDtypeStruct]:
    return {name: jax.ShapeDtypeStruct((len(jax.tree.leaves(part)),), jnp.uint32,
                                       sharding=sharding) for name, part in frozen.items()}


def _abstract_saved_tree(like: TrainState) -> dict[str, Any]:
    """saved_tree(like)'s structure, the fingerprints as shapes (nothing is computed)."""
    actor, frozen = _parts(like)
    return _lean(like, actor, _marks_like(frozen, ocp.utils.to_shape_dtype_struct(
        like.step).sharding))


def _bits(x: jax.Array) -> jax.Array:
    """A hash [] uint32 of x's bits: each element's bits, xor its flat index times a constant,
    through murmur3's finaliser (a bijection: one changed element always changes its term),
    summed mod 2^32 (integer arithmetic: the same on every backend, sharding and reduction
    order)."""
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[jnp.dtype(x.dtype).itemsize]
    u32 = lambda v: jnp.uint32(v)  # noqa: E731
    index, stride = jnp.zeros(x.shape, jnp.uint32), 1
    for axis in reversed(range(x.ndim)):  # the flat index without reshaping a sharded array
        index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * u32(stride)
        stride *= x.shape[axis]
    h = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32) ^ (index * u32(0x9E3779B9))
    h = (h ^ (h >> 16)) * u32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * u32(0xC2B2AE35)
    return jnp.sum(h ^ (h >> 16), dtype=jnp.uint32)


@jax.jit
def fingerprints(frozen: dict[str, Any]) -> dict[str, jax.Array]:
    """{part: uint32 [its arrays]}: `_bits` of each array of each frozen part."""
    return {name: jnp.stack([_bits(x) for x in jax.tree.leaves(part)])
            for name, part in frozen.items()}


def _changed_parts(saved: dict[str, Any], frozen: dict[str, Any]) -> list[str]:
    """The frozen parts whose fingerprints differ from the `saved` ones."""
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(frozen)):
        raise ValueError("this checkpoint leaves frozen weights out: restore it into a concrete "
                         "state or model (the run's fresh one), not an abstract one")
    here = fingerprints(frozen)
    host = lambda x: np.asarray(x.addressable_data(0))  # noqa: E731  (replicated)
    return [name for name in frozen if not np.array_equal(host(saved[name]), host(here[name]))]


_WHAT = {"actor": "LoRA base weights", "reference": "KL reference weights"}


def _frozen_differ(where: Path, names: list[str]) -> str:
    parts = " and ".join(_WHAT[name] for name in names)
    return (f"checkpoint {where} left out its frozen {parts} and this run's differ from those "
            "it was trained with: model.source or model.init_from's checkpoint changed since")


def _with_frozen(restored: dict[str, Any], like: TrainState, where: Path) -> TrainState:
    """The TrainState of a checkpoint that left frozen parts out: those of `like`, whose
    fingerprints must be the saved ones (else RunFault)."""
    _, frozen = _parts(like)
    differ = _changed_parts(restored[FROZEN], frozen)
    if differ:
        raise RunFault(f"{_frozen_differ(where, differ)}. Resume with the weights it was made "
                       "with, or pass another --workdir")
    actor = joined(restored["actor"], frozen["actor"]) if "actor" in frozen else restored["actor"]
    return TrainState(actor=actor, actor_opt=restored["actor_opt"], critic=restored["critic"],
                      critic_opt=restored["critic_opt"], reference=frozen.get("reference"),
                      step=restored["step"])


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
        lambda r, x: r if r is x or getattr(x, "committed", True) else jnp.asarray(np.asarray(r)),
        restored, like)


def read_only_manager(workdir: Path) -> tuple[ocp.CheckpointManager, list[int]]:
    """The run's checkpoints/ opened read-only (nothing is created or deleted), and its saved
    steps in order. FileNotFoundError when there are none."""
    directory = (Path(workdir) / "checkpoints").absolute()
    if directory.is_dir():
        options = ocp.CheckpointManagerOptions(read_only=True, create=False)
        manager = ocp.CheckpointManager(directory, options=options,
                                        item_handlers=ocp.PyTreeCheckpointHandler())
        if manager.all_steps():
            return manager, sorted(manager.all_steps())
        manager.close()
    raise FileNotFoundError(f"{str(workdir)!r} holds no checkpoints ({directory} is missing or "
                            "empty); a run saves one every checkpoint_every steps and at its end")


def frozen_parts(manager: ocp.CheckpointManager, step: int) -> set[str]:
    """The frozen parts checkpoint `step` left out (`saved_tree`): a subset of {"actor",
    "reference"}."""
    tree = manager.item_metadata(step)
    tree = getattr(tree, "tree", tree)
    return set(tree.get(FROZEN) or ()) if isinstance(tree, dict) else set()


def restore_actor(manager: ocp.CheckpointManager, step: int, like: nnx.State) -> nnx.State:
    """The actor weights (TrainState.actor) of checkpoint `step`, with the structure, shapes and
    dtypes of `like` (e.g. nnx.state of the run's model). Only the actor is read from disk, not
    the optimiser state, critic or reference. A LoRA checkpoint that left the base weights out
    takes them from `like` (concrete: the run's model, loaded from model.source and
    model.init_from), which must match the saved fingerprint (else ValueError)."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    adapters, base = split_trainable(like)
    lean = "actor" in frozen_parts(manager, step)
    item: dict[str, Any] = {"actor": jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        adapters if lean else like)}
    if lean:
        item[FROZEN] = _marks_like({"actor": base}, device)
    places = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), item)
    where = Path(manager.directory) / str(step)
    try:
        with _quiet_orbax():
            restored = manager.restore(step, args=ocp.args.PyTreeRestore(
                item=item, restore_args=places, partial_restore=True))
    except Exception as error:  # cut short, or another model's: JSON, tensorstore, orbax
        raise ValueError(f"checkpoint {where} cannot be read into the run's model "
                         f"({_first_line(error)}); valid: a complete checkpoint of this "
                         "run") from error
    if not lean:
        return restored["actor"]
    if _changed_parts(restored[FROZEN], {"actor": base}):
        raise ValueError(f"{_frozen_differ(where, ['actor'])}; valid: the base weights the run "
                         "was trained from")
    return joined(restored["actor"], base)


def load_init_weights(model: Any, workdir: str | Path, source: str, dtype: str) -> Any:
    """`model` (a Decoder without adapters, loaded from model `source` in `dtype`) with the
    policy weights of an SFT (or StarPO) workdir's newest checkpoint, LoRA adapters merged in
    (when that checkpoint left its base weights out and the workdir itself started from a
    model.init_from, the base is that workdir's policy, loaded the same way).
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
    parent = saved.get("model", {}).pop("init_from", None)
    base = (saved.get("model", {}).get("source"), saved.get("model", {}).get("dtype"))
    if base != (source, dtype):
        raise ValueError(f"config.model.init_from = {str(workdir)!r} was trained from model "
                         f"{base}; valid: a workdir trained from this run's {(source, dtype)}")
    train = train_config(saved)
    try:
        manager, steps = read_only_manager(workdir)
    except FileNotFoundError:
        raise ValueError(f"config.model.init_from = {str(workdir)!r} holds no checkpoint") \
            from None
    try:
        start = model
        if parent and "actor" in frozen_parts(manager, steps[-1]):
            start = load_init_weights(model, parent, source, dtype)
        policy = adapted(start, train.lora, jax.random.PRNGKey(0))  # adapters: restored
        actor = restore_actor(manager, steps[-1], nnx.state(policy))
    finally:
        manager.close()
    params = nnx.to_pure_dict(actor)
    if train.lora.rank:
        params = merged_params(params, policy.config)
    graphdef, weights = nnx.split(model)
    nnx.replace_by_pure_dict(weights, committed_like(params, nnx.to_pure_dict(weights)))
    return nnx.merge(graphdef, weights)
