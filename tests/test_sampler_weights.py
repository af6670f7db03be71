"""The rollout's sampler weights (models/sampler_weights.py): a LoRA policy samples as its
merged plain model, rollout.sampler_dtype="bfloat16" as a bfloat16 copy (against the
plain-numpy decoder), and the train step's rollout with each."""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from starpo_jax.config import LoraConfig, RolloutConfig  # noqa: E402
from starpo_jax.train.forward import sequence_logprobs  # noqa: E402
from starpo_jax.models.cache import KVCache  # noqa: E402
from starpo_jax.models.config import LORA_TARGETS  # noqa: E402
from starpo_jax.models.lora import policy_structure, with_lora  # noqa: E402
from starpo_jax.models.sampler_weights import (sampler_config, sampler_graphdef,  # noqa: E402
                                               sampler_params)
from starpo_jax.train.step import init_train_state, make_train_fns  # noqa: E402
from test_decoder import TINY, _numpy_forward, _random_model  # noqa: E402
from test_faithful import _config  # noqa: E402
from test_lora import _random_adapters  # noqa: E402
from test_rollout import REPLY_TOKENS, tiny_bandit_setup  # noqa: E402

IDS = np.array([5, 17, 3, 60, 2, 44, 9, 81])
RANK, ALPHA = 4, 8.0


def _sampler(model, dtype):
    params = sampler_params(nnx.state(model), model.config, dtype)
    return nnx.merge(sampler_graphdef(model, dtype), params)


def _merged_reference(model):
    """The plain float32 model whose weights are W + A B * alpha / rank, merged in numpy."""
    state = nnx.to_pure_dict(nnx.state(model))["layers"]
    plain = _random_model(TINY)
    nnx.update(plain, nnx.split_state(nnx.state(model), nnx.LoRAParam, ...)[1])
    for name in LORA_TARGETS:
        a = np.asarray(state[f"{name}_lora_a"], np.float64)
        b = np.asarray(state[f"{name}_lora_b"], np.float64)
        merged = np.asarray(state[name], np.float64) + (a @ b) * (ALPHA / RANK)
        getattr(plain.layers, name)[...] = jnp.asarray(merged, jnp.float32)
    return plain


def _logits(model):
    return np.asarray(jax.jit(lambda m: m(jnp.asarray(IDS[None])))(model))[0]


def test_a_lora_policy_samples_as_its_merged_plain_model():
    lora = _random_adapters(with_lora(_random_model(TINY), rank=RANK, alpha=ALPHA,
                                      targets=LORA_TARGETS, key=jax.random.PRNGKey(1)), seed=2)
    sampler = _sampler(lora, "model")
    assert sampler.config.lora_rank == 0
    assert not jax.tree.leaves(nnx.state(sampler, nnx.LoRAParam))  # no adapter runs
    want = _numpy_forward(_merged_reference(lora), IDS, np.arange(len(IDS), dtype=np.float64))
    assert np.abs(want - _numpy_forward(_random_model(TINY), IDS, np.arange(8.0))).max() > 0.1
    np.testing.assert_allclose(_logits(sampler), want, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(_logits(sampler), _logits(lora), atol=2e-5, rtol=1e-5)


def test_a_plain_float32_policy_samples_with_its_own_weights():
    model = _random_model(TINY)
    state = nnx.state(model)
    assert sampler_params(state, model.config, "model") is state
    assert sampler_graphdef(model, "model") == nnx.graphdef(model)


@pytest.mark.parametrize("lora", [False, True])
def test_bfloat16_sampler_computes_in_bfloat16(lora):
    model = _random_model(TINY)
    if lora:
        model = _random_adapters(with_lora(model, rank=RANK, alpha=ALPHA, targets=LORA_TARGETS,
                                           key=jax.random.PRNGKey(1)), seed=2)
    sampler = _sampler(model, "bfloat16")
    assert sampler.config.compute_dtype == jnp.bfloat16
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(sampler))}
    assert dtypes == {jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.uint16)}  # layers as bit patterns
    reference = _merged_reference(model) if lora else model
    want = _numpy_forward(reference, IDS, np.arange(len(IDS), dtype=np.float64))
    got = _logits(sampler)
    assert got.dtype == np.float32
    err = np.abs(got - want)
    # bfloat16 has 8 significant bits: off by ~1e-2 of the logits' scale, not by float32's 1e-6
    scale = np.abs(want).max()
    assert 1e-4 * scale < err.max() < 0.06 * scale, (err.max(), scale)
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.75


def test_a_bfloat16_sampler_keeps_a_bfloat16_cache():
    assert KVCache.init(TINY, 2, 8, "float32").k.dtype == jnp.float32
    half = KVCache.init(sampler_config(TINY, "bfloat16"), 2, 8, "float32")
    assert half.k.dtype == jnp.uint16  # bfloat16 bit patterns (cache.py)


def test_a_bad_sampler_dtype_is_named():
    with pytest.raises(ValueError, match=r"rollout\.sampler_dtype = 'float16'.*'bfloat16'"):
        RolloutConfig(sampler_dtype="float16")
    with pytest.raises(ValueError, match="float16"):
        sampler_config(TINY, "float16")


def _rollout_against_trainer(config, perturb_adapters=False):
    """(behaviour log-probs, the trainer's log-probs) of the rollout's sampled tokens; checks
    that the same key gives the same rollout."""
    model, tok, env, codec = tiny_bandit_setup()
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    state = init_train_state(config, jax.random.PRNGKey(0), model=model)
    if perturb_adapters:  # fresh B = 0 would make the merge trivially exact
        adapters, base = nnx.split_state(state.actor, nnx.LoRAParam, ...)
        rng = np.random.RandomState(4)
        adapters = jax.tree.map(
            lambda x: jnp.asarray(0.05 * rng.standard_normal(x.shape), x.dtype), adapters)
        state = state.replace(actor=nnx.merge_state(adapters, base))
    rollout = jax.jit(fns.rollout)
    out = rollout(state, jax.random.PRNGKey(3))
    again = rollout(state, jax.random.PRNGKey(3))
    np.testing.assert_array_equal(out.tokens, again.tokens)  # same key, same rollout
    graph = nnx.graphdef(policy_structure(model, config.lora))
    logp, _ = jax.jit(lambda p: sequence_logprobs(
        nnx.merge(graph, p), out.tokens, out.lengths, out.loss_mask, REPLY_TOKENS, REPLY_TOKENS,
        config.rollout.temperature))(state.actor)
    mask = np.asarray(out.loss_mask)
    assert mask.sum() > 4
    return np.asarray(out.behaviour_logp)[mask], np.asarray(logp)[mask]


def test_the_steps_rollout_samples_with_the_sampler_weights():
    """The sampler / trainer mismatch: float rounding with the policy's own weights (a LoRA
    policy merged), a bfloat16 one's size with sampler_dtype="bfloat16"."""
    base = _config()
    lora = dataclasses.replace(base, lora=LoraConfig(rank=RANK, alpha=ALPHA))
    behaviour, trainer = _rollout_against_trainer(lora, perturb_adapters=True)
    np.testing.assert_allclose(behaviour, trainer, atol=1e-4)
    half = dataclasses.replace(
        base, rollout=dataclasses.replace(base.rollout, sampler_dtype="bfloat16"))
    behaviour, trainer = _rollout_against_trainer(half)
    diff = np.abs(behaviour - trainer)
    assert 1e-4 < diff.mean() < 0.1, diff
