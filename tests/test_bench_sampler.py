"""experiments/bench/sampler.py's training rows: the JAX side's two losses (--jax-losses) are the
same mean next-token cross-entropy, value and gradient, so their timings compare like work."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from helpers.forward import logits as full_logits
from helpers.scripts import bench_module
from starpo_jax.models import load_pretrained


@pytest.fixture(scope="module")
def sampler():
    with bench_module("sampler") as module:
        yield module


def test_trainer_loss_is_the_full_cross_entropy(sampler):
    model, _ = load_pretrained("tiny-random")
    ids = sampler.train_batch(model.config.vocab_size, (2, 12))  # [2, 13]: 12 predicted each
    graphdef, params = nnx.split(model)
    # numpy: log-softmax of the model's logits at each position, read at the next token
    z = np.asarray(full_logits(model, ids[:, :-1]), np.float64)
    z -= z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want = -np.take_along_axis(logp, ids[:, 1:, None], -1).mean()
    values, grads = {}, {}
    for loss in sampler.JAX_LOSSES:
        value, grad = jax.jit(jax.value_and_grad(sampler.train_loss(graphdef, loss)))(params, ids)
        values[loss], grads[loss] = float(value), grad
    assert values["full"] == pytest.approx(want, rel=1e-5)
    assert values["trainer"] == pytest.approx(want, rel=1e-5)
    diff = optax.tree.norm(jax.tree.map(lambda a, b: a - b, grads["trainer"], grads["full"]))
    scale = float(optax.tree.norm(grads["full"]))
    assert scale > 0 and float(diff) <= 1e-4 * scale
