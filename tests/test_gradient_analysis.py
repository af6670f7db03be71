"""RAGEN-2's gradient analysis (starpo_jax/train/gradient_analysis.py): its buckets against a
port of the original's split_into_buckets (tests/helpers/ragen2_reference.py) on random
stds, its per-bucket gradient norms against direct gradients of the bucket's rows alone, its
metric names, its config, that it is a program of its own (the train step unchanged, no extra
compile when off), and the report's figure."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import ragen2_reference as ref
from helpers.tiny import tiny_config, tiny_experiment
from starpo_jax import api
from starpo_jax.algo.filtering import gather_group_rows
from starpo_jax.algo.losses import aggregate_normaliser
from starpo_jax.analysis.report import ExperimentResult, figures
from starpo_jax.config import FilterConfig, GradientAnalysisConfig, LossConfig, OptimConfig
from starpo_jax.models.lora import joined, policy_structure, trainable_split
from starpo_jax.run.schema import check_config, train_config
from starpo_jax.train import gradient_analysis as ga
from starpo_jax.train.learner import Forwards
from starpo_jax.train.shared_prefix import aligned_slots, plan_for
from starpo_jax.train.state import init_train_state
from starpo_jax.train.step import make_train_fns, make_train_step, shared_width


def _groups_of(masks: dict, group_size: int) -> dict[str, set[int]]:
    return {name: set(np.flatnonzero(mask.reshape(-1, group_size)[:, 0]).tolist())
            for name, mask in masks.items()}


def _ours(std, kept, num_buckets, mode) -> dict[str, set[int]]:
    """Our buckets as {name: kept groups, numbered among the kept ones}, empty ones left out."""
    bucket = np.asarray(ga.group_buckets(jnp.asarray(std), jnp.asarray(kept), num_buckets, mode))
    position = np.cumsum(kept) - 1  # a kept group's index in the original's filtered batch
    out = {"all": set(position[kept].tolist())}
    for b in range(ga.FIXED_RV_BUCKETS if mode == "fixed_rv" else num_buckets):
        members = set(position[kept & (bucket == b)].tolist())
        if members:
            out[f"bucket_{b + 1}"] = members
    return out


@pytest.mark.parametrize("mode", ["quantile", "fixed_rv"])
@pytest.mark.parametrize("seed", range(5))
def test_buckets_are_the_originals(mode, seed):
    rng = np.random.default_rng(seed)
    for groups, num_buckets in [(1, 6), (3, 6), (5, 2), (8, 6), (13, 4), (6, 1)]:
        for kind in ("random", "equal", "zero", "edges"):
            std = {"random": rng.random(groups) * 7, "equal": np.full(groups, 0.8),
                   "zero": np.zeros(groups), "edges": rng.integers(0, 7, groups) * 1.0}[kind]
            std = std.astype(np.float32)
            kept = rng.random(groups) < 0.75
            kept[rng.integers(groups)] = True
            n = 3
            want = _groups_of(ref.split_into_buckets(np.repeat(std[kept], n), n, num_buckets,
                                                     mode), n)
            assert _ours(std, kept, num_buckets, mode) == want, (groups, num_buckets, kind)


def test_nothing_kept_puts_every_group_out_of_every_bucket():
    bucket = ga.group_buckets(jnp.ones(4), jnp.zeros(4, bool), 3, "quantile")
    assert np.array_equal(bucket, [-1] * 4)


def test_host_metrics_are_the_originals_names():
    raw = {"rows": [6, 2, 0, 4], "tokens": [30, 10, 0, 20], "groups": [3, 1, 0, 2],
           "std_mean": [0.5, 0.1, 0, 0.7], "std_min": [0.1, 0.1, np.inf, 0.6],
           "std_max": [0.8, 0.1, -np.inf, 0.8], "norm/task": [3.0, 1.0, 0, 2.0],
           "norm/entropy": [0.3, 0.1, 0, 0.2], "loss/task": [0.2, 0.1, 0, 0.1],
           "loss/entropy": [-0.01, -0.01, 0, -0.01]}
    out = ga.host_metrics(raw, ("task", "entropy"))
    assert not any(k.startswith("grad_norm/bucket_2/") for k in out), "an empty bucket logs nothing"
    assert out["grad_norm/all/task"] == out["actor/grad_norm/task"] == 3.0
    assert out["grad_norm/bucket_3/per_sample/task"] == 0.5
    assert out["grad_norm/bucket_3/per_token/entropy"] == pytest.approx(0.01)
    assert out["grad_norm/bucket_1/sample_pct"] == pytest.approx(1 / 3)
    assert out["grad_norm/bucket_3/loss/total"] == pytest.approx(0.09)
    assert out["actor/loss/policy"] == 0.2 and out["grad_analysis/uses_training_batch"] == 1.0
    assert {k.split("/", 2)[2] for k in out if k.startswith("grad_norm/bucket_1/")} == {
        "sample_count", "sample_pct", "reward_std_mean", "reward_std_min", "reward_std_max",
        "group_rv_count", "task", "entropy", "per_sample/task", "per_sample/entropy",
        "per_token/task", "per_token/entropy", "loss/policy", "loss/entropy", "loss/total"}


def test_bucket_norms_are_the_gradients_of_the_buckets_rows_alone():
    """bucket_gradients (masked rows, micro-batch slices, the shared-prefix plan) against
    jax.grad of each component over the bucket's rows gathered on their own, every row whole."""
    exp = tiny_experiment()
    config = dataclasses.replace(exp.train, filter=FilterConfig(keep_ratio=1.0),
                                 loss=LossConfig(kl_coef=0.05, entropy_coef=0.01),
                                 optim=OptimConfig(micro_batches=2, actor_lr=1e-3))
    analysis = GradientAnalysisConfig(every=1, num_buckets=2)
    n = config.rollout.group_size
    fns = make_train_fns(config, exp.env, exp.codec, model=exp.model,
                         eos_id=exp.tokenizer.eos_token_id, pad_id=exp.tokenizer.pad_token_id)
    state = init_train_state(config, exp.init_key, model=exp.model)  # with its KL reference
    batch = jax.jit(lambda s, k: fns.prepare(s, fns.rollout(s, k)))(state, jax.random.PRNGKey(5))
    rng = np.random.default_rng(0)
    batch = batch.replace(
        advantages=jnp.where(batch.rollout.loss_mask, jnp.asarray(
            rng.normal(size=batch.advantages.shape), jnp.float32), 0.0),
        selection=batch.selection._replace(group_std=jnp.array([0.9, 0.2], jnp.float32)),
        ref_logp=batch.ref_logp + jnp.asarray(0.3 * rng.normal(size=batch.ref_logp.shape),
                                              jnp.float32))  # a KL term away from its minimum
    policy = policy_structure(exp.model, config.lora)
    forwards = Forwards.of(config, policy, lambda p: p, None)
    rows = config.kept_rows
    plan = plan_for(shared_width(config, exp.codec, None), rows // 2, aligned_slots(rows, rows // 2,
                                                                                   n))
    trainable, frozen = trainable_split(state.actor, False)
    raw = jax.device_get(jax.jit(lambda t, b: ga.bucket_gradients(
        config, analysis, forwards, plan, t, frozen, b))(trainable, batch))
    names = ga.components(config)
    assert names == ("task", "entropy", "kl")

    @jax.jit
    def direct(index: jax.Array) -> tuple[jax.Array, jax.Array]:
        sub = jax.tree.map(lambda x: gather_group_rows(x, index, n), batch.rollout)
        piece = {"mask": sub.loss_mask,
                 "advantages": gather_group_rows(batch.advantages, index, n),
                 "ref_logp": gather_group_rows(batch.ref_logp, index, n)}
        normaliser = aggregate_normaliser(sub.loss_mask, config.loss.agg, forwards.slots)
        norms, losses = [], []
        for name in names:
            def loss(p):
                logp, entropy = forwards.logprobs(joined(p, frozen), sub,
                                                  jnp.arange(index.shape[0] * n) // n, None)
                return ga.component_loss(name, logp, entropy, piece, config, normaliser)
            value, grads = jax.value_and_grad(loss)(trainable)
            norms.append(optax.tree.norm(grads))
            losses.append(value)
        return jnp.stack(norms), jnp.stack(losses)

    # "all", then bucket_1 (the lower std: group 1) and bucket_2 (group 0).
    for i, groups in enumerate([[0, 1], [1], [0]]):
        norms, losses = direct(jnp.asarray(groups, jnp.int32))
        np.testing.assert_allclose([raw[f"norm/{c}"][i] for c in names], norms, rtol=2e-4)
        np.testing.assert_allclose([raw[f"loss/{c}"][i] for c in names], losses, rtol=2e-4,
                                   atol=1e-7)
        assert raw["rows"][i] == len(groups) * n and raw["groups"][i] == len(groups)
    assert raw["std_mean"][1] == pytest.approx(0.2) and raw["std_max"][0] == pytest.approx(0.9)


def test_the_analysis_is_a_program_of_its_own_that_leaves_the_step_unchanged():
    c = tiny_config()
    c.filter.keep_ratio, c.check_memory = 1.0, False
    c.gradient_analysis.update(every=2, num_buckets=2)
    off = tiny_config()
    off.filter.keep_ratio, off.check_memory = 1.0, False
    assert train_config(c) == train_config(off), "the step is built from the same TrainConfig"
    exp = api.build(c)
    key = exp.key
    lowered = exp.train_step.lower(exp.state, key).as_text()
    plain = make_train_step(train_config(off), exp.env, exp.codec, model=exp.model,
                            eos_id=exp.tokenizer.eos_token_id,
                            pad_id=exp.tokenizer.pad_token_id)
    assert plain.lower(exp.state, key).as_text() == lowered, "the same program with it on or off"
    steps = [exp.step() for _ in range(3)]
    analysed = [any(k.startswith("grad_norm/") for k in m) for m in steps]
    assert analysed == [True, False, True], "steps 1, 3: (global_steps - 1) % every == 0"
    assert steps[0]["grad_norm/all/sample_count"] == 4 == steps[0]["rollout/kept_groups"] * 2
    assert steps[0]["grad_norm/all/reward_std_mean"] == pytest.approx(
        steps[0]["rollout/chosen_in_group_std"]), "the step's own rollout"
    assert {"grad_norm/bucket_1/task", "grad_norm/bucket_2/task", "actor/grad_norm/task",
            "grad_norm/all/entropy", "actor/loss/total"} <= set(steps[2])
    [analysis] = exp._analyses.values()
    assert analysis.analyse._cache_size() == 1, "one extra program, compiled once"
    assert exp.train_step._cache_size() == 1
    exp.config.gradient_analysis.every = 0  # off: nothing runs, nothing compiles
    exp._analyses.clear()
    assert not any(k.startswith("grad_norm/") for k in exp.step()) and not exp._analyses


@pytest.mark.parametrize("key,value,message", [
    ("bucket_mode", "linear", "gradient_analysis.bucket_mode = 'linear' is invalid; valid: one "
     "of ('quantile', 'fixed_rv')"),
    ("num_buckets", 0, "gradient_analysis.num_buckets = 0 is invalid; valid: an int >= 1"),
    ("every", -1, "gradient_analysis.every = -1 is invalid; valid: an int >= 0"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ValueError) as error:
        check_config({"gradient_analysis": {key: value}})
    assert message in str(error.value)


def test_defaults_and_host_envs():
    assert GradientAnalysisConfig() == GradientAnalysisConfig(every=0, num_buckets=6,
                                                              bucket_mode="quantile")
    with pytest.raises(ValueError, match="config.gradient_analysis.every = 5 is invalid; valid: "
                                         "0: env.name = 'rg_chain_sum' is a host env"):
        check_config({"env": {"name": "rg_chain_sum"}, "algo": "grpo",
                      "gradient_analysis": {"every": 5}})


def test_the_report_plots_the_buckets_when_a_run_logged_them():
    def rows(scale: float) -> list[dict]:
        analysed = {f"grad_norm/{b}/{c}": scale * (i + 1) for i, b in enumerate(
            ("bucket_1", "bucket_2", "all")) for c in ("task", "entropy")}
        analysed.update({f"grad_norm/{b}/reward_std_mean": 0.1 * i for i, b in enumerate(
            ("bucket_1", "bucket_2", "all"))})
        return [{"step": 1, "rollout/reward_mean": 0.1, **analysed},
                {"step": 2, "rollout/reward_mean": 0.2}]

    exp = ExperimentResult("g", "G", "other", "about", {"a": {0: rows(1.0), 1: rows(2.0)}})
    assert "g_gradient_analysis.png" in figures(exp)
    plain = ExperimentResult("g", "G", "other", "about",
                             {"a": {0: [{"step": 1, "rollout/reward_mean": 0.1}]}})
    assert "g_gradient_analysis.png" not in figures(plain)
