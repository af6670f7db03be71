"""model.matmul_precision: the run key, its resolution per backend, and that every matmul the
model traces (forward, backward, value head, LM head, LoRA, the shared-prefix values) carries it,
while a model without it traces XLA's default (no precision on the dot)."""

from __future__ import annotations

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from starpo_jax import api
from starpo_jax.models.config import resolve_matmul_precision
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.embedded import tiny_random_config
from starpo_jax.models.lora import lora_config
from helpers.tiny import tiny_config


@pytest.mark.parametrize("name, backend, expected", [
    ("auto", "cpu", None), ("auto", "gpu", "highest"), ("auto", "tpu", "highest"),
    ("default", "gpu", None), ("high", "cpu", "high"), ("highest", "cpu", "highest"),
])
def test_resolution_per_backend(name, backend, expected):
    assert resolve_matmul_precision(name, backend) == expected


def test_a_bad_value_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"model.matmul_precision = 'tf32' is invalid; valid: "
                                         r"one of \('auto', 'default', 'high', 'highest'\)"):
        resolve_matmul_precision("tf32", "gpu")
    config = tiny_config()
    config.model.matmul_precision = "tf32"
    with pytest.raises(ValueError, match="model.matmul_precision"):
        api.train_config(config)


def _dots(jaxpr) -> list:
    """Every dot_general equation of a closed jaxpr, sub-jaxprs (scan, remat, cond) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_dots(sub))
    return found


def _model(precision: str | None, lora: bool = False) -> Decoder:
    config = tiny_random_config(vocab_size=64)
    if lora:
        config = lora_config(config, rank=4, alpha=8.0, targets=("q_proj", "down_proj"))
    config = dataclasses.replace(config, matmul_precision=precision)
    return Decoder(config, rngs=nnx.Rngs(0), value_head=True)


@pytest.mark.parametrize("lora", [False, True])
def test_forward_backward_and_heads_carry_the_precision(lora):
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 64

    def loss(state, graphdef):
        model = nnx.merge(graphdef, state)
        return model(tokens).mean() + model.value(tokens).mean()

    for precision, expected in (("highest", (jax.lax.Precision.HIGHEST,) * 2), (None, None)):
        graphdef, state = nnx.split(_model(precision, lora))
        jaxpr = jax.make_jaxpr(jax.value_and_grad(loss), static_argnums=1)(state, graphdef)
        dots = _dots(jaxpr.jaxpr)
        # Layers x (q, k, v, o, gate, up, down, 2 attention products), heads, adapters, and
        # as many again in the backward pass: all of them carry it.
        assert len(dots) > 40
        assert all(p == expected for p in dots), set(map(str, dots))


def test_the_same_numbers_on_the_cpu_where_float32_is_exact():
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 64
    plain, highest = _model(None), _model("highest")
    np.testing.assert_array_equal(np.asarray(plain(tokens)), np.asarray(highest(tokens)))


def test_the_built_experiment_traces_its_step_with_the_key():
    """api.build resolves the key into the model (auto: XLA's default on this CPU) and the
    compiled step's dots (rollout and update) carry it."""
    counts = {}
    for name in ("auto", "highest"):
        config = tiny_config()
        config.algo = "ppo"
        config.model.matmul_precision = name
        exp = api.build(config)
        assert exp.model.config.matmul_precision == (None if name == "auto" else name)
        dots = _dots(jax.make_jaxpr(exp.train_step)(exp.state, exp.key).jaxpr)
        counts[name] = sum(p == (jax.lax.Precision.HIGHEST,) * 2 for p in dots), len(dots)
    assert counts["auto"][0] == 0
    highest, total = counts["highest"]
    # Every dot of the models (the rollout's prefill and decode, the old log-probs, the critic's
    # values, the update's forward and backward); the step's few other dots are not the model's.
    assert highest >= 0.9 * total and highest > 100, counts
