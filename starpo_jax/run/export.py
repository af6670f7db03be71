"""Exporting a run's trained policy as a Hugging Face model directory (experiments/export.py).

    from starpo_jax.run.export import export_run
    step, path = export_run("runs/bandit", "exported/bandit", dtype="bfloat16")

The run's config.json (read_run_config: model.source and model.dtype) rebuilds the model and
tokenizer with load_pretrained; the actor of the newest checkpoint under checkpoints/ (or of
`step`) is restored alone and written with starpo_jax.models.export.save_pretrained. The critic
is not exported; a LoRA run's adapters are merged into the weights (W + A B * alpha / rank), so
the directory is a plain model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from starpo_jax.run import experiment
from starpo_jax.models import load_pretrained
from starpo_jax.models.export import DEFAULT_MAX_SHARD_SIZE, check_out_dir, save_pretrained
from starpo_jax.models.lora import adapted
from starpo_jax.run.schema import read_run_config


def checkpoint_manager(workdir: Path) -> tuple[ocp.CheckpointManager, list[int]]:
    """The run's checkpoints/ opened read-only (nothing is created or deleted), and its saved
    steps in order. FileNotFoundError when there are none."""
    directory = (workdir / "checkpoints").absolute()
    if directory.is_dir():
        options = ocp.CheckpointManagerOptions(read_only=True, create=False)
        manager = ocp.CheckpointManager(directory, options=options)
        if manager.all_steps():
            return manager, sorted(manager.all_steps())
        manager.close()
    raise FileNotFoundError(f"{str(workdir)!r} holds no checkpoints ({directory} is missing or "
                            "empty); a run saves one every checkpoint_every steps and at its end")


def restore_actor(manager: ocp.CheckpointManager, step: int, like: nnx.State) -> nnx.State:
    """The actor weights (TrainState.actor) of checkpoint `step`, with the structure, shapes and
    dtypes of `like` (e.g. nnx.state of the run's model). Only the actor is read from disk, not
    the optimiser state, critic or reference."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    actor = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), like)
    places = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), actor)
    restored = manager.restore(step, args=ocp.args.PyTreeRestore(
        item={"actor": actor}, restore_args={"actor": places}, partial_restore=True))
    return restored["actor"]


def export_run(workdir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None,
               dtype: str | None = None, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
               overwrite: bool = False) -> tuple[int, Path]:
    """Exports the actor of `workdir`'s checkpoint `step` (default: the newest) to `out`.

    dtype: of the stored weights (default: the run's model.dtype). Returns (step, out).
    Raises FileNotFoundError for a workdir without config.json or checkpoints, ValueError for
    a step that was not saved (naming the saved ones) and save_pretrained's errors.
    """
    workdir = Path(workdir)
    check_out_dir(Path(out), overwrite)  # before the slow part
    config, _ = read_run_config(workdir)
    manager, steps = checkpoint_manager(workdir)
    try:
        step = steps[-1] if step is None else step
        if step not in steps:
            raise ValueError(f"no checkpoint of step {step} in {str(workdir)!r}; saved steps: "
                             f"{steps}")
        model, tokenizer = load_pretrained(config.model.source, config.model.dtype)
        # The run's policy structure (LoRA: with adapters, whose values the checkpoint holds).
        model = adapted(model, experiment.train_config(config).lora, jax.random.PRNGKey(0))
        actor = restore_actor(manager, step, nnx.state(model))
    finally:
        manager.close()
    source_generation = Path(config.model.source) / "generation_config.json"
    generation = json.loads(source_generation.read_text()) if source_generation.is_file() else None
    path = save_pretrained(actor, model.config, tokenizer, out,
                           dtype=dtype or config.model.dtype,
                           max_shard_size=max_shard_size, overwrite=overwrite,
                           generation_config=generation)
    return step, path
