"""The device mesh and the partition rules of the training step.

Mesh axes: "fsdp" (data parallel: the batch is split over it, and so are the weights' embed
dimension, FSDP style) and "tp" (tensor parallel: heads, kv heads, MLP and vocabulary
dimensions). The model's parameters carry logical axis names (`models/layers.py`:
"vocab", "embed", "heads", "kv_heads", "mlp", "layers"); `RULES` maps them onto mesh axes. A
dimension that the mesh axis does not divide stays replicated, so any model runs on any mesh.
Inside the step the rows (rollout tokens, KV cache, env states, every mini- and micro-batch) are
split over the data axes (`constrain_batch`), and each forward gathers the weights it uses
(`gather_for_compute`): each device computes its share of the rows with whole weights.

    mesh = make_mesh(tp=1)                         # every device on "fsdp"
    step = make_train_step(config, env, codec, model=model, ..., mesh=mesh)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from starpo_jax.models.decoder import Decoder

AXES = ("fsdp", "tp")
#: Mesh axes the batch's rows are split over (those the mesh has, outermost first).
DATA_AXES = ("data", "fsdp")

#: Logical axis name -> mesh axis (None = replicated).
RULES: dict[str, str | None] = {
    "batch": "fsdp",
    "embed": "fsdp",
    "vocab": "tp",
    "heads": "tp",
    "kv_heads": "tp",
    "mlp": "tp",
    "layers": None,
}


def make_mesh(tp: int = 1, devices: list[Any] | None = None) -> Mesh:
    """A ("fsdp", "tp") mesh over `devices` (default all): fsdp = len(devices) // tp."""
    devices = list(jax.devices() if devices is None else devices)
    if not isinstance(tp, int) or tp < 1 or len(devices) % tp:
        raise ValueError(f"tp = {tp!r} must be a positive int dividing the {len(devices)} devices")
    return Mesh(np.array(devices).reshape(len(devices) // tp, tp), AXES)


def spec_for(logical: tuple[str | None, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """PartitionSpec of an array with these logical axes: each axis mapped by RULES when the mesh
    axis divides the dimension and is not used by an earlier dimension."""
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match shape {shape}")
    used: set[str] = set()
    out: list[str | None] = []
    for name, dim in zip(logical, shape):
        if name is not None and name not in RULES:
            raise ValueError(f"no sharding rule for logical axis {name!r}; known: {sorted(RULES)}")
        axis = RULES.get(name) if name is not None else None
        if axis is None or axis in used or dim % mesh.shape[axis]:
            out.append(None)
            continue
        used.add(axis)
        out.append(axis)
    return P(*out)


def _param_axes(model: Decoder) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Parameter path -> logical axes, for the model with a value head (covers actor and critic)."""
    abstract = nnx.eval_shape(lambda: Decoder(model.config, rngs=nnx.Rngs(0), value_head=True))
    return {tuple(str(k) for k in path): tuple(var.get_metadata()["out_sharding"])
            for path, var in nnx.to_flat_state(nnx.state(abstract))}


def _dict_keys(path: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def tree_shardings(tree: Any, model: Decoder, mesh: Mesh) -> Any:
    """NamedShardings for every leaf of `tree` (e.g. a TrainState, abstract or concrete).

    A leaf whose path ends with a parameter's path (weights, Adam moments) gets that
    parameter's rule; every other leaf (step counters, scalars) is replicated.
    """
    axes = _param_axes(model)

    def one(path, leaf):
        keys = _dict_keys(path)
        for start in range(len(keys)):
            if keys[start:] in axes:
                return NamedSharding(mesh, spec_for(axes[keys[start:]], leaf.shape, mesh))
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(one, tree)


def data_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes that split the batch (rows): "fsdp" and any "data" axis the mesh has."""
    return tuple(axis for axis in DATA_AXES if axis in mesh.shape)


def constrain_batch(tree: Any, mesh: Mesh | None, axis: int = 0) -> Any:
    """Inside jit: split dimension `axis` (the rows) of every leaf over the mesh's data axes.

    A leaf whose row count the data axes' total size does not divide (or with no such
    dimension) is left unconstrained: XLA places it (replicated, in practice), so any row count
    works on any mesh. No mesh: the tree as it is.
    """
    if mesh is None:
        return tree
    axes = data_axes(mesh)
    size = int(np.prod([mesh.shape[a] for a in axes]))
    if size == 1:
        return tree

    def one(x):
        if x.ndim <= axis or x.shape[axis] % size:
            return x
        spec = P(*(None,) * axis, axes if len(axes) > 1 else axes[0])
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return jax.tree.map(one, tree)


def gather_for_compute(params: Any, model: Decoder, mesh: Mesh | None) -> Any:
    """Inside jit: the weights as a forward uses them, gathered over the data axes (which split
    the rows instead; tensor-parallel axes stay split). Stored weights and optimiser state stay
    sharded (FSDP); without this XLA would keep a weight split on its contracting "embed"
    dimension and gather the whole batch's activations to every device instead. No mesh:
    params as they are."""
    if mesh is None:
        return params
    data = set(data_axes(mesh))

    def one(x, sharding):
        spec = P(*(None if axis in data else axis for axis in sharding.spec))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return jax.tree.map(one, params, tree_shardings(params, model, mesh))


def jit_sharded_step(step: Callable, abstract_state: Any, model: Decoder, mesh: Mesh) -> Callable:
    """jax.jit of step(state, key) -> (state, metrics) with the state laid out by the rules
    (donated), the key and the metrics replicated."""
    state_sharding = tree_shardings(abstract_state, model, mesh)
    replicated = NamedSharding(mesh, P())
    return jax.jit(step, in_shardings=(state_sharding, replicated),
                   out_shardings=(state_sharding, replicated), donate_argnums=0)


def shard_state(state: Any, model: Decoder, mesh: Mesh) -> Any:
    """Places a (host or single-device) TrainState on the mesh by the rules."""
    return jax.device_put(state, tree_shardings(state, model, mesh))


def split_rows(tree: Any, pieces: int, mesh: Mesh | None = None) -> Any:
    """Every leaf [rows, ...] -> [pieces, rows / pieces, ...]; with a mesh, the rows of each
    piece are split over its data axes (not the piece index: each piece is then computed by
    every device, a share of its rows each)."""
    return jax.tree.map(lambda x: constrain_batch(x.reshape(pieces, -1, *x.shape[1:]), mesh, 1),
                        tree)


def merge_rows(tree: Any) -> Any:
    """Every leaf [pieces, rows / pieces, ...] -> [rows, ...] (undoes split_rows)."""
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), tree)
