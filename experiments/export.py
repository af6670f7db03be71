"""Export a run's trained policy as a Hugging Face model directory (safetensors).

    python experiments/export.py --workdir runs/bandit --out exported/bandit
    python experiments/export.py --workdir runs/bandit --out exported/bandit --step 20 \
        --dtype bfloat16 --overwrite

Reads the run's config.json (api.read_run_config: model.source and model.dtype), rebuilds the
model and tokenizer with load_pretrained, restores the actor of the newest checkpoint under
checkpoints/ (or of --step N) and writes it with starpo_jax.models.export.save_pretrained:
config.json, safetensors weights (sharded above --max_shard_size), generation_config.json and
the tokenizer with its chat template (files mode 0644). The critic is not exported; a LoRA run's adapters are merged into the
weights (W + A B * alpha / rank), so the directory is a plain model. The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(out)` and with our own `load_pretrained(out)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from starpo_jax.config import MODEL_DTYPES as DTYPES  # noqa: E402
from starpo_jax.run_config import read_run_config  # noqa: E402


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="the run's --workdir")
    parser.add_argument("--out", required=True, help="the directory to write (must not exist, "
                        "or be empty, unless --overwrite)")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint to export (default: the newest)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="dtype of the stored weights (default: the run's model.dtype)")
    parser.add_argument("--max_shard_size", default=None,
                        help="split the weights into files of at most this size (e.g. 2GB; "
                        "default: save_pretrained's)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    args = parser.parse_args(argv)
    try:  # the run's config, before the heavy imports: a workdir without one is a line at once
        read_run_config(args.workdir)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    return args


_ARGS: argparse.Namespace | None = None  # parsed and checked first, run as a script
if __name__ == "__main__":
    _ARGS = _parse(None)

import jax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from flax import nnx  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.models.export import (DEFAULT_MAX_SHARD_SIZE, check_out_dir,  # noqa: E402
                                      save_pretrained)
from starpo_jax.models.lora import adapted  # noqa: E402


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
        model = adapted(model, api.train_config(config).lora, jax.random.PRNGKey(0))
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


def main(argv: list[str] | None = None) -> None:
    args = _ARGS if _ARGS is not None and argv is None else _parse(argv)
    absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on opening read-only
    shards = {} if args.max_shard_size is None else {"max_shard_size": args.max_shard_size}
    try:
        step, path = export_run(args.workdir, args.out, step=args.step, dtype=args.dtype,
                                overwrite=args.overwrite, **shards)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"exported step {step} of {args.workdir} -> {path}", flush=True)


if __name__ == "__main__":
    main()
