"""The compiled train step: it learns (bandit, GRPO), is a pure function of (state, key), and
gives the same numbers sharded over 4 fake CPU devices as on one."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import textwrap

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from starpo_jax.config import (AdvantageConfig, FilterConfig, LossConfig, OptimConfig,  # noqa: E402
                               RolloutConfig, TrainConfig)
from starpo_jax.train.forward import sequence_logprobs  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_fns, make_train_step  # noqa: E402
from test_rollout import REPLY_TOKENS, tiny_bandit_setup  # noqa: E402


def _warm_start(model, tok, env, codec, steps=40):
    """Teaches the random tiny model the answer format, both arms equally often (teacher forcing
    on "<answer> Phoenix </answer>" / "<answer> Dragon </answer>" after the real first prompt):
    RL then only has to move the choice between arms."""
    states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(7), 4))
    ids, n = codec.first_prompt(jax.vmap(env.render_symbols)(states), jnp.full((4,), 10))
    ids, n = np.asarray(ids), np.asarray(n)
    rows, masks = [], []
    for b, arm in enumerate(["Phoenix", "Dragon", "Phoenix", "Dragon"]):
        reply = tok.encode(f" {arm} </answer>", add_special_tokens=False)
        row = ids[b, : n[b]].tolist() + list(codec.forced_prefix_ids) + reply
        rows.append(row)
        masks.append([0] * (len(row) - len(reply)) + [1] * len(reply))
    width = max(map(len, rows))
    tokens = jnp.array([r + [0] * (width - len(r)) for r in rows], jnp.int32)
    mask = jnp.array([m + [0] * (width - len(m)) for m in masks], bool)
    lengths = jnp.array([len(r) for r in rows], jnp.int32)
    graphdef, params = nnx.split(model)
    tx = optax.adam(1e-2)

    def loss(p):
        logp, _ = sequence_logprobs(nnx.merge(graphdef, p), tokens, lengths, mask, 8, 8)
        return -jnp.sum(logp) / jnp.sum(mask)

    @jax.jit
    def update(p, o):
        grads = jax.grad(loss)(p)
        u, o = tx.update(grads, o, p)
        return optax.apply_updates(p, u), o

    opt_state = tx.init(params)
    for _ in range(steps):
        params, opt_state = update(params, opt_state)
    return nnx.merge(graphdef, params)


def _config(**rollout) -> TrainConfig:
    return TrainConfig(
        algo="grpo",
        rollout=RolloutConfig(**{**dict(groups=8, group_size=4, max_turns=1,
                                        reply_tokens=REPLY_TOKENS, mode="nothink"), **rollout}),
        filter=FilterConfig(keep_ratio=1.0),
        # Mean-only GRPO: with std normalisation the arm that wins MORE OFTEN gets the larger
        # expected advantage (Phoenix's sure 0.1 beats Dragon's miss 3 times in 4), not the
        # arm with the higher expected reward (Dragon: 0.25 > 0.1).
        advantage=AdvantageConfig(grpo_mode="mean"),
        loss=LossConfig(entropy_coef=0.0),
        optim=OptimConfig(actor_lr=2e-3))


@pytest.mark.slow  # minutes on a 2-core CPU: the slow tier (README)
@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_grpo_learns_the_high_risk_arm():
    model, tok, env, codec = tiny_bandit_setup()
    model = _warm_start(model, tok, env, codec)
    config = _config()
    state = init_train_state(config, jax.random.PRNGKey(0), model=model)
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    picks, formats = [], []
    for i in range(30):
        state, metrics = step(state, jax.random.PRNGKey(1))
        picks.append(float(metrics["train/success"]))
        formats.append(float(metrics["rollout/action_is_valid"]))
    print("high-arm pick rate per step:", np.round(picks, 2).tolist())
    assert np.mean(formats[:5]) > 0.5, "the warm start did not teach the answer format"
    assert np.mean(picks[-5:]) > np.mean(picks[:5]) + 0.2, picks


@pytest.mark.slow  # also in CI: test_run's resumed run equals the unstopped one (the slow tier)
def test_same_key_same_metrics():
    """PPO's step holds GRPO's parts and the critic's: one algorithm suffices."""
    model, tok, env, codec = tiny_bandit_setup()
    config = TrainConfig(
        algo="ppo",
        rollout=RolloutConfig(groups=2, group_size=2, max_turns=2, reply_tokens=REPLY_TOKENS,
                              mode="nothink"),
        filter=FilterConfig(keep_ratio=0.5),
        loss=LossConfig(kl_coef=0.01),
        optim=OptimConfig(actor_lr=1e-3, minibatch_rows=1, rollout_reuse=2))
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    runs = []
    for _ in range(2):
        state = init_train_state(config, jax.random.PRNGKey(0), model=model)
        state, first = step(state, jax.random.PRNGKey(5))
        _, second = step(state, jax.random.PRNGKey(5))
        runs.append(jax.device_get((first, second)))
    assert runs[0] == runs[1]
    assert all(np.isfinite(v) for v in runs[0][1].values())
    assert runs[0][0]["actor/grad_norm"] > 0


_SHARDED_SCRIPT = textwrap.dedent("""
    import json, pickle, sys
    import jax
    from starpo_jax.config import TrainConfig
    from starpo_jax.models.sharding import make_mesh, shard_state
    from starpo_jax.train.step import init_train_state, make_train_fns, make_train_step
    model, tok, env, codec, config = pickle.load(open(sys.argv[1], "rb"))
    pieces = sys.argv[2] == "pieces"  # else: the step on one device, then sharded
    assert jax.device_count() == 4, jax.devices()
    ids = dict(model=model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    out = {}
    runs = [("sharded", make_mesh(tp=2))] if pieces else [("single", None),
                                                          ("sharded", make_mesh(tp=2))]
    for name, mesh in runs:
        def fresh():
            state = init_train_state(config, jax.random.PRNGKey(0), model=model)
            return state if mesh is None else shard_state(state, model, mesh)
        key = jax.random.PRNGKey(2)
        if pieces:  # the public pieces, jitted one by one, composed as the step does
            fns = make_train_fns(config, env, codec, mesh=mesh, **ids)
            state = fresh()
            rollout_key, update_key = jax.random.split(jax.random.fold_in(key, state.step))
            rollout = jax.jit(fns.rollout)(state, rollout_key)
            batch = jax.jit(fns.prepare)(state, rollout)
            by_hand, aux = jax.jit(fns.update)(state, batch, jax.random.split(update_key, 1)[0])
            out["pieces"] = {k: float(v) for k, v in aux.items()}
        step = make_train_step(config, env, codec, mesh=mesh, **ids)
        state, metrics = step(fresh(), key)
        out[name] = {k: float(v) for k, v in metrics.items()}
        out[name + "_embed"] = str(state.actor["embed"].get_value().sharding)
    if pieces:
        out["pieces_param_diff"] = max(float(abs(a - b).max()) for a, b in zip(
            jax.tree.leaves(by_hand.actor), jax.tree.leaves(state.actor)))
    print("RESULT" + json.dumps(out))
""")


def _sharded_run(tmp_path, what: str, algo: str = "ppo", rollout: dict | None = None,
                 **advantage) -> dict:
    """_SHARDED_SCRIPT in a 4-fake-device process: `what` = "step" (the step on one device and
    on a tp=2 mesh) or "pieces" (the public pieces jitted one by one on the mesh, and the
    step); algo and AdvantageConfig fields pick the estimator, `rollout` RolloutConfig fields
    change the rollout."""
    model, tok, env, codec = tiny_bandit_setup()
    config = TrainConfig(
        algo=algo,
        rollout=RolloutConfig(**{**dict(groups=2, group_size=4, max_turns=2,
                                        reply_tokens=REPLY_TOKENS, mode="nothink"),
                                 **(rollout or {})}),
        filter=FilterConfig(keep_ratio=1.0),
        advantage=AdvantageConfig(**advantage),
        optim=OptimConfig(actor_lr=1e-3, minibatch_rows=4))
    setup = tmp_path / "setup.pkl"
    setup.write_bytes(pickle.dumps((model, tok, env, codec, config)))
    # Conftest: this process runs long, so XLA optimises, at LLVM level 1 (measured on the PPO
    # case: 94 s against 105 s at the default level, compile 60 s against 70 s; at level 0 the
    # 4 fake devices' code runs for over 10 minutes; XLA's classic emitters: 133 s).
    env_vars = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "0",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=4"
                " --xla_backend_optimization_level=1"
                # A device thread can reach a collective minutes late on a loaded machine,
                # past XLA's 40 s default, without a bug.
                " --xla_cpu_collective_call_terminate_timeout_seconds=600"
                " --xla_cpu_collective_timeout_seconds=600",
                "PJRT_NPROC": "8", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT, str(setup), what],
                          env=env_vars, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT", 1)[1])
    assert "fsdp" in result["sharded_embed"] or "tp" in result["sharded_embed"]
    return result


# Serial: run after the parallel suite (README's test command), on a machine not also running
# other tests. Four fake devices on two cores: XLA:CPU's collective rendezvous can starve when
# the machine is loaded (every device thread asleep in a different collective; seen under load
# 10, never on an idle machine). PJRT_NPROC widens its thread pools; the timeouts turn a hang
# into a failure within minutes.
@pytest.mark.serial
@pytest.mark.parametrize("algo,advantage,rollout", [
    ("ppo", {}, None),  # CI: the critic's and the actor's state on the mesh
    # The slow tier (README): GiGPO's anchor groups, and turn samples (each turn's window
    # prefilled afresh, one training row per (row, turn)) on the mesh.
    pytest.param("grpo", {"estimator": "gigpo"}, None, marks=pytest.mark.slow),
    pytest.param("grpo", {}, dict(context_window_mode="limited_multi_turn",
                                  max_context_window=1), marks=pytest.mark.slow)])
def test_sharded_step_equals_single_device(tmp_path, algo, advantage, rollout):
    result = _sharded_run(tmp_path, "step", algo, rollout, **advantage)
    single, sharded = result["single"], result["sharded"]
    assert single.keys() == sharded.keys()
    for key in single:
        np.testing.assert_allclose(sharded[key], single[key], rtol=2e-3, atol=2e-4, err_msg=key)


@pytest.mark.serial
@pytest.mark.slow  # three more sharded compiles; on one device: tests/test_faithful.py (CI)
def test_sharded_pieces_equal_sharded_step(tmp_path):
    """The public pieces (train.make_train_fns) jitted one by one on the mesh give the sharded
    step's numbers and parameters."""
    result = _sharded_run(tmp_path, "pieces")
    assert result["pieces"] and result["pieces_param_diff"] <= 1e-6
    for key, value in result["pieces"].items():
        np.testing.assert_allclose(value, result["sharded"][key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)


def _step_outputs(config, setup):
    model, tok, env, codec = setup
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    state, metrics = step(init_train_state(config, jax.random.PRNGKey(0), model=model),
                          jax.random.PRNGKey(3))
    return jax.device_get((state.actor, state.critic, metrics))


# The two variants of a case share one rollout (compiled once for the file: the memory knobs
# do not touch it) and differ in `learn`, the half of the step they change (each case compiles
# two learns). One case per algorithm, each aggregation once; test_losses checks that row
# slices add up for every aggregation.
_KNOB_ROLLOUT = RolloutConfig(groups=2, group_size=4, max_turns=1, reply_tokens=REPLY_TOKENS,
                              mode="nothink")


@pytest.fixture(scope="module")
def knob_rollout():
    """(setup, one rollout of the tiny model's initial weights) for the memory-knob cases."""
    model, tok, env, codec = setup = tiny_bandit_setup()
    config = TrainConfig(algo="grpo", rollout=_KNOB_ROLLOUT, filter=FilterConfig(keep_ratio=1.0))
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    state = init_train_state(config, jax.random.PRNGKey(0), model=model)
    return setup, jax.jit(fns.rollout)(state, jax.random.PRNGKey(3))


def _learn_outputs(config, setup, out):
    model, tok, env, codec = setup
    fns = make_train_fns(config, env, codec, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    state, metrics = jax.jit(fns.learn)(init_train_state(config, jax.random.PRNGKey(0),
                                                         model=model), out, jax.random.PRNGKey(4))
    return jax.device_get((state.actor, state.critic, metrics))


@pytest.mark.parametrize("algo,agg,optim", [
    ("ppo", "seq_mean_token_mean", dict(micro_batches=4, remat=True)),
    ("grpo", "token_mean", dict(micro_batches=2)),
])
def test_micro_batches_and_remat_change_nothing(algo, agg, optim, knob_rollout):
    """Gradient accumulation (each micro-batch's loss normalised by the whole minibatch) and
    rematerialised layers give the plain step's parameters and metrics."""
    setup, out = knob_rollout
    base = TrainConfig(
        algo=algo, rollout=_KNOB_ROLLOUT, filter=FilterConfig(keep_ratio=1.0),
        loss=LossConfig(agg=agg, kl_coef=0.01 if algo == "grpo" else 0.0, entropy_coef=0.01),
        # Per-row forwards in both (here 1-row micro-batches share no prefix, the plain step's
        # do): the shared-prefix forward's own equality is test_shared_prefix's.
        optim=OptimConfig(actor_lr=1e-3, critic_lr=1e-3, minibatch_rows=4, shared_prefix=False))
    want_actor, want_critic, want = _learn_outputs(base, setup, out)
    config = dataclasses.replace(base, optim=dataclasses.replace(base.optim, **optim))
    actor, critic, got = _learn_outputs(config, setup, out)
    assert got.keys() == want.keys() and want["actor/grad_norm"] > 0
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # Adam's first steps move each weight by about lr whatever the gradient's size, so equal
    # weights to 1% of lr mean equal gradients (a near-zero gradient's step is the rounding's).
    for a, b in zip(jax.tree.leaves((actor, critic)), jax.tree.leaves((want_actor, want_critic))):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("optim,match", [
    (dict(minibatch_rows=4, micro_batches=3),
     "optim.micro_batches = 3 is invalid; valid: a divisor of the 4 rows"),
    (dict(minibatch_rows=3),
     r"optim.minibatch_rows = 3 is invalid; valid: a divisor of the 8 kept rows .*, or >= 8"),
    (dict(micro_batches=0), "optim.micro_batches = 0 is invalid"),
    (dict(remat=1), "optim.remat = 1 is invalid; valid: True or False"),
])
def test_memory_knobs_are_validated(optim, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(rollout=RolloutConfig(groups=4, group_size=2),
                    filter=FilterConfig(keep_ratio=1.0), optim=OptimConfig(**optim))


def test_cache_dtype_is_validated():
    with pytest.raises(ValueError, match="rollout.cache_dtype = 'float16' is invalid; valid: one"):
        RolloutConfig(cache_dtype="float16")


@pytest.mark.slow  # two uncached steps; test_api's phase lines stay in CI: the slow tier (README)
def test_phase_clock_marks_each_phase_in_order_and_changes_nothing():
    """The host hears of each phase as it ends, in the program's order, once per Online-k round;
    the marked step's state and metrics are the unmarked step's."""
    setup = tiny_bandit_setup()
    config = TrainConfig(
        algo="ppo",
        rollout=RolloutConfig(groups=4, group_size=2, max_turns=1, reply_tokens=REPLY_TOKENS,
                              mode="nothink", chunks=2),
        filter=FilterConfig(keep_ratio=0.5),
        loss=LossConfig(kl_coef=0.01),
        optim=OptimConfig(actor_lr=1e-3, rollout_reuse=2))
    want = _step_outputs(config, setup)
    model, tok, env, codec = setup
    heard = []
    step = make_train_step(config, env, codec, model=model, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id,
                           phase_clock=lambda label, index: heard.append((label, index)))
    state, metrics = step(init_train_state(config, jax.random.PRNGKey(0), model=model),
                          jax.random.PRNGKey(3))
    got = jax.device_get((state.actor, state.critic, metrics))
    assert heard == [("rollout_chunk", 0), ("rollout_chunk", 1), ("rollout", 0),
                     ("reference_logprobs", 0), ("old_logprobs", 0), ("update", 0),
                     ("old_logprobs", 0), ("update", 0)]
    # Equal up to float rounding: the marks' optimisation barriers change how XLA may fuse the
    # phases (e.g. the old-log-prob forward with the first gradient's forward); 1e-5 is 1/100
    # of one Adam step (lr 1e-3), and this step makes two.
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
