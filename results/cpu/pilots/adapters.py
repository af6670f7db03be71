"""Carry a LoRA run's adapters between machines without its checkpoint (pilots of issue 31).

A LoRA checkpoint holds the frozen base weights too (0.5 GB for SmolLM2 in float32), more than
a device machine returns in one call (8 files of 16 MiB); the adapters of rank 32 are ~40 MB.

    python results/cpu/pilots/adapters.py pack WORKDIR OUT     # OUT/adapters_<k>.npz, meta.json
    python results/cpu/pilots/adapters.py unpack OUT WORKDIR   # a workdir that init_from,
                                                               # evaluate.py and export.py read

`pack` reads the newest checkpoint's actor and writes its LoRA leaves in .npz files of at most
15 MiB each, with the run's config.json and step; `unpack` rebuilds the run's fresh TrainState
(base weights from model.source, a new optimiser state), puts the adapters in, and saves it
as checkpoint <step> of WORKDIR with the same config.json. The result differs from the
original checkpoint only in the optimiser state (fresh), which model.init_from does not read.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx, traverse_util  # noqa: E402

from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.models.lora import adapted  # noqa: E402
from starpo_jax.run import experiment  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.run.export import checkpoint_manager, restore_actor  # noqa: E402
from starpo_jax.run.schema import read_run_config  # noqa: E402
from starpo_jax.train.state import init_train_state  # noqa: E402

CHUNK = 15 * 2**20


def _model(workdir: Path):
    config, _ = read_run_config(workdir)
    train = experiment.train_config(config)
    if not train.lora.rank:
        sys.exit(f"error: {workdir} is not a LoRA run (lora.rank = 0)")
    model, _ = load_pretrained(config.model.source, config.model.dtype)
    return train, model


def pack(workdir: Path, out: Path) -> None:
    train, model = _model(workdir)
    model = adapted(model, train.lora, jax.random.PRNGKey(0))
    manager, steps = checkpoint_manager(workdir)
    try:
        actor = restore_actor(manager, steps[-1], nnx.state(model))
    finally:
        manager.close()
    flat = traverse_util.flatten_dict(nnx.to_pure_dict(actor), sep="/")
    leaves = {k: np.asarray(v) for k, v in flat.items() if "_lora_" in k}
    out.mkdir(parents=True, exist_ok=True)
    chunk: dict[str, np.ndarray] = {}
    files = 0
    for name in sorted(leaves):
        if chunk and sum(a.nbytes for a in chunk.values()) + leaves[name].nbytes > CHUNK:
            np.savez(out / f"adapters_{files}.npz", **chunk)
            files, chunk = files + 1, {}
        chunk[name] = leaves[name]
    np.savez(out / f"adapters_{files}.npz", **chunk)
    meta = {"step": steps[-1], "config": json.loads((workdir / "config.json").read_text())}
    (out / "meta.json").write_text(json.dumps(meta))
    print(f"packed {len(leaves)} adapter arrays of step {steps[-1]} in {files + 1} files")


def unpack(packed: Path, workdir: Path) -> None:
    meta = json.loads((packed / "meta.json").read_text())
    workdir.mkdir(parents=True, exist_ok=False)
    (workdir / "config.json").write_text(json.dumps(meta["config"], indent=2))
    train, model = _model(workdir)
    state = init_train_state(train, jax.random.PRNGKey(0), model=model)
    actor = traverse_util.flatten_dict(nnx.to_pure_dict(state.actor), sep="/")
    count = 0
    for path in sorted(packed.glob("adapters_*.npz")):
        with np.load(path) as arrays:
            for name in arrays.files:
                if name not in actor:
                    raise KeyError(f"{name} is not a leaf of this run's actor")
                actor[name] = jax.numpy.asarray(arrays[name])
                count += 1
    actor = traverse_util.unflatten_dict(actor, sep="/")
    nnx.replace_by_pure_dict(state.actor, actor)
    state = state.replace(step=jax.numpy.int32(meta["step"]))
    checkpoints = Checkpoints(workdir / "checkpoints", 0, 1)
    try:
        checkpoints.maybe_save(state, force=True)
    finally:
        checkpoints.close()
    print(f"unpacked {count} adapter arrays as checkpoint {meta['step']} of {workdir}")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(Path(sys.argv[2]), Path(sys.argv[3]))
