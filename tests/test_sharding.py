"""Partition rules: logical axes -> mesh axes, with indivisible or repeated axes replicated.
(The sharded step == single-device step check is in test_train.py: it needs a subprocess.)"""

from __future__ import annotations

import jax
import optax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from starpo_jax.models import Decoder
from starpo_jax.models.embedded import tiny_random_config
from starpo_jax.models.sharding import constrain_batch, make_mesh, spec_for, tree_shardings

MESH = AbstractMesh((2, 4), ("fsdp", "tp"))


@pytest.mark.parametrize("logical, shape, expected", [
    (("vocab", "embed"), (64, 32), P("tp", "fsdp")),
    (("layers", "embed", "heads"), (3, 32, 8), P(None, "fsdp", "tp")),
    (("layers", "embed", "kv_heads"), (3, 32, 6), P(None, "fsdp", None)),  # 6 % 4: replicated
    (("layers", "mlp", "embed"), (3, 16, 5), P(None, "tp", None)),  # 5 % 2: replicated
    (("embed",), (32,), P("fsdp")),
    (("embed", "embed"), (32, 32), P("fsdp", None)),  # a mesh axis is used once
    ((), (), P()),
    (("batch", None), (8, 7), P("fsdp", None)),
])
def test_spec_for(logical, shape, expected):
    assert spec_for(logical, shape, MESH) == expected


def test_spec_for_rejects_unknown_axis_and_rank_mismatch():
    with pytest.raises(ValueError, match="'sequence'"):
        spec_for(("sequence",), (4,), MESH)
    with pytest.raises(ValueError, match="do not match"):
        spec_for(("embed",), (4, 4), MESH)


def test_make_mesh_rejects_tp_not_dividing_devices():
    with pytest.raises(ValueError, match="tp = 3"):
        make_mesh(tp=3, devices=jax.devices()[:1] * 2)


def test_adam_moments_follow_their_parameter():
    model = Decoder(tiny_random_config(96), rngs=nnx.Rngs(0))
    params = nnx.state(model)
    opt_state = optax.adamw(1e-3).init(params)
    mesh = make_mesh(tp=1)
    shardings = tree_shardings({"params": params, "opt": opt_state}, model, mesh)
    embed = shardings["params"]["embed"].get_value().spec
    assert shardings["opt"][0].mu["embed"].get_value().spec == embed
    assert shardings["opt"][0].count.spec == P()


def _constraints(fn, *shapes):
    """The PartitionSpecs of the sharding constraints in fn's jaxpr on these input shapes."""
    jaxpr = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, "float32") for s in shapes))
    return [e.params["sharding"].spec for e in jaxpr.eqns
            if e.primitive.name == "sharding_constraint"]


@pytest.mark.parametrize("mesh, expected", [
    (AbstractMesh((4, 1), ("fsdp", "tp")), P(None, "fsdp")),
    (AbstractMesh((2, 2, 1), ("data", "fsdp", "tp")), P(None, ("data", "fsdp"))),
])
def test_constrain_batch_splits_rows_that_divide(mesh, expected):
    # [pieces, rows, ...] split on the rows (axis 1); 6 rows do not divide 4 devices: left to
    # XLA (replicated), so any batch runs on any mesh; a 1-d leaf has no axis 1.
    fn = lambda a, b, c: constrain_batch((a, b, c), mesh, axis=1)  # noqa: E731
    assert _constraints(fn, (2, 8, 3), (2, 6, 3), (8,)) == [expected]
    assert _constraints(lambda a: constrain_batch(a, None), (8, 3)) == []
