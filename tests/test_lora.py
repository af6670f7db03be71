"""LoRA: the adapted forward against plain numpy, training only the adapters (critic: its own
adapters and value head), the KL reference = the base, checkpoints without the frozen base
(exact resume from the adapters), and the merged export."""

from __future__ import annotations

import dataclasses
import json
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.run import export as run_export, loop as runner  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402
from starpo_jax.config import (FilterConfig, LoraConfig, LossConfig, OptimConfig,  # noqa: E402
                               RolloutConfig, TrainConfig)
from starpo_jax.train.forward import sequence_logprobs  # noqa: E402
from starpo_jax.models import Decoder, layers, load_pretrained  # noqa: E402
from starpo_jax.models.config import LORA_TARGETS  # noqa: E402
from starpo_jax.models.lora import (adapted, adapted_config, base_config,  # noqa: E402
                                    merged_params, split_trainable, with_lora)
from starpo_jax.rollout.jax_env import Rollout  # noqa: E402
from starpo_jax.train.step import init_train_state, make_train_fns  # noqa: E402
from helpers import forward  # noqa: E402
from helpers.tiny import tiny_config  # noqa: E402
from test_decoder import TINY, _numpy_forward, _random_model  # noqa: E402


RANK, ALPHA = 4, 8.0  # scale alpha / rank = 2


def _random_adapters(model: Decoder, seed: int) -> Decoder:
    """`model` with every adapter (A and B) random and nonzero, so that it differs from its base."""
    graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    rng = np.random.RandomState(seed)
    adapters = jax.tree.map(
        lambda x: jnp.asarray(0.2 * rng.standard_normal(x.shape), x.dtype), adapters)
    return nnx.merge(graphdef, adapters, rest)


def _lora(model: Decoder, seed: int = 1, **kwargs) -> Decoder:
    return with_lora(model, rank=RANK, alpha=ALPHA, targets=LORA_TARGETS,
                     key=jax.random.PRNGKey(seed), **kwargs)


# ---- the forward ----


def test_one_projection_matches_numpy():
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, 5, 6))
    w = {"q_proj": rng.standard_normal((6, 7)), "q_proj_lora_a": rng.standard_normal((6, 3)),
         "q_proj_lora_b": rng.standard_normal((3, 7))}
    got = layers._linear(jnp.asarray(x, jnp.float32),
                         {k: jnp.asarray(v, jnp.float32) for k, v in w.items()}, "q_proj", 2.5)
    want = x @ w["q_proj"] + (x @ w["q_proj_lora_a"] @ w["q_proj_lora_b"]) * 2.5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lora_model_matches_numpy_forward_of_merged_weights():
    """Every projection of a LoRA model (random A and B, rank 4) against the plain-numpy
    decoder whose weights are W + A B * alpha / rank, merged here in float64."""
    base = _random_model(TINY)
    model = _random_adapters(_lora(base), seed=2)
    state = nnx.to_pure_dict(nnx.state(model))["layers"]
    merged_layers = {}
    for name in LORA_TARGETS:
        a, b = (np.asarray(state[f"{name}_lora_a"], np.float64),
                np.asarray(state[f"{name}_lora_b"], np.float64))
        merged_layers[name] = np.asarray(state[name], np.float64) + (a @ b) * (ALPHA / RANK)
    reference = nnx.clone(base)
    for name, value in merged_layers.items():
        getattr(reference.layers, name)[...] = jnp.asarray(value, jnp.float32)
    ids = np.array([[5, 17, 3, 60, 2, 44, 9]])
    got = forward.logits(model, jnp.asarray(ids))
    want = _numpy_forward(reference, ids[0], np.arange(ids.shape[1], dtype=np.float64))
    assert np.abs(want - _numpy_forward(base, ids[0], np.arange(7.0))).max() > 0.1
    np.testing.assert_allclose(got[0], want, atol=2e-4, rtol=1e-4)
    # merged_params (the export's merge) gives the same model
    plain_state = nnx.state(nnx.clone(base))
    nnx.replace_by_pure_dict(plain_state,
                             merged_params(nnx.to_pure_dict(nnx.state(model)), model.config))
    plain = nnx.merge(nnx.graphdef(base), plain_state)
    np.testing.assert_allclose(forward.logits(plain, jnp.asarray(ids)), got, atol=2e-5, rtol=1e-5)


def test_fresh_lora_model_equals_its_base():
    base = _random_model(TINY)
    model = _lora(base)
    assert model.config.lora_rank == RANK and base.config.lora_rank == 0
    ids = jnp.array([[5, 17, 3, 60, 2], [1, 2, 3, 4, 8]])
    np.testing.assert_array_equal(forward.logits(model, ids), forward.logits(base, ids))
    adapters = nnx.state(model, nnx.LoRAParam)["layers"]
    assert all(np.abs(adapters[f"{n}_lora_a"][...]).max() > 0 for n in LORA_TARGETS)
    assert all(np.abs(adapters[f"{n}_lora_b"][...]).max() == 0 for n in LORA_TARGETS)


def test_bfloat16_base_keeps_float32_adapters():
    base = _random_model(TINY)
    model = _random_adapters(_lora(base, base_dtype="bfloat16"), seed=3)
    adapters, frozen = split_trainable(nnx.state(model))
    assert {x.dtype for x in jax.tree.leaves(frozen)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {jnp.dtype(jnp.float32)}
    ids = jnp.array([[5, 17, 3, 60, 2]])
    f32 = nnx.merge(nnx.graphdef(model), adapters,
                    jax.tree.map(lambda x: x.astype(jnp.float32), frozen))
    np.testing.assert_allclose(forward.logits(model, ids), forward.logits(f32, ids), atol=1e-6)


def test_gradient_of_the_adapters_forms_no_weight_gradient():
    """Differentiating w.r.t. the adapters only (the frozen base closed over), the backward
    forms no [in, out] gradient of a base weight: no matmul has a base weight's shape, as one
    does when the base is differentiated too."""
    model = _lora(_random_model(TINY))
    graphdef = nnx.graphdef(model)
    adapters, base = split_trainable(nnx.state(model))
    ids = jnp.ones((3, 5), jnp.int32)

    def loss(adapters, base):
        return nnx.merge(graphdef, adapters, base).hidden_states(ids).sum()

    def matmul_shapes(grad):
        text = str(jax.make_jaxpr(grad)(adapters, base))
        return set(re.findall(r":f32\[([\d,]+)\] = dot_general", text))

    weights = {",".join(map(str, shape[1:])) for shape in layers.layer_weight_shapes(TINY).values()
               if len(shape) == 3}
    assert weights & matmul_shapes(jax.grad(loss, argnums=(0, 1)))
    assert not weights & matmul_shapes(jax.grad(loss))


# ---- training ----

CONFIG = TrainConfig(
    algo="ppo",
    rollout=RolloutConfig(groups=2, group_size=2, max_turns=1, reply_tokens=8, mode="nothink"),
    filter=FilterConfig(keep_ratio=1.0),
    loss=LossConfig(kl_coef=0.05),
    optim=OptimConfig(actor_lr=1e-2, critic_lr=1e-2, minibatch_rows=4),
    lora=LoraConfig(rank=RANK, alpha=ALPHA))


def _rollout(seed: int = 0, b: int = 4, length: int = 16, prompt: int = 6) -> Rollout:
    """A hand-made batch of b rows: a `prompt`-token prompt, then reply tokens to `lengths`."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(prompt + 3, length + 1, b).astype(np.int32)
    cols = np.arange(length)
    mask = (cols >= prompt) & (cols < lengths[:, None])
    ones = np.ones((b, 1), bool)
    return Rollout(
        tokens=rng.integers(0, 2000, (b, length)).astype(np.int32), lengths=lengths,
        prompt_lengths=np.full(b, prompt, np.int32), loss_mask=mask,
        turn_ids=np.where(mask, 0, -1).astype(np.int32),
        behaviour_logp=np.zeros((b, length), np.float32),
        behaviour_entropy=np.zeros((b, length), np.float32),
        turn_rewards=rng.normal(size=(b, 1)).astype(np.float32),
        format_penalties=np.zeros((b, 1), np.float32), turn_taken=ones, format_ok=ones,
        think_tokens=np.zeros((b, 1), np.int32), reply_lengths=mask.sum(1, keepdims=True),
        success=rng.random(b) < 0.5, num_actions=np.ones(b, np.int32),
        effective_actions=np.ones(b, np.int32))


@pytest.fixture(scope="module")
def trained():
    """(plain model, its tokenizer, compiled learn and prepare, step-0 state, rollout)."""
    model, tok = load_pretrained("tiny-random")
    fns = make_train_fns(CONFIG, None, None, model=model, eos_id=tok.eos_token_id,
                         pad_id=tok.pad_token_id)
    state = init_train_state(CONFIG, jax.random.PRNGKey(0), model=model)
    return model, tok, jax.jit(fns.learn), jax.jit(fns.prepare), state, _rollout()


def _flat(state: nnx.State, prefix: str = "") -> dict[tuple, np.ndarray]:
    return {(prefix, *path): np.asarray(x[...]) for path, x in nnx.to_flat_state(state)}


def _size(tree) -> int:
    return sum(x.size for x in jax.tree.leaves(tree))


def test_one_step_trains_only_the_adapters_and_the_critic_head(trained):
    model, _, learn, _, state, out = trained
    adapters, base = split_trainable(state.actor)
    # the base is the model's weights (frozen); no reference copy; the critic holds no base
    assert jax.tree.all(jax.tree.map(np.array_equal, base, nnx.state(model)))
    assert state.reference is None
    critic_paths = {p[-1] for p, _ in nnx.to_flat_state(state.critic)}
    assert critic_paths == {f"{n}_lora_{ab}" for n in LORA_TARGETS for ab in "ab"} | {
        "value_head", "value_bias"}
    # Adam's two moments of exactly the adapters (plus scalar step counts)
    scalars = sum(x.size for x in jax.tree.leaves(state.actor_opt) if x.ndim == 0)
    assert _size(state.actor_opt) - scalars == 2 * _size(adapters)
    assert _size(adapters) < 0.05 * _size(base)

    new, metrics = learn(state, out, jax.random.PRNGKey(4))
    new_adapters, new_base = split_trainable(new.actor)
    assert jax.tree.all(jax.tree.map(np.array_equal, new_base, base)), "the base moved"
    before = {**_flat(adapters), **_flat(state.critic, "critic")}
    after = {**_flat(new_adapters), **_flat(new.critic, "critic")}
    decay = 1 - CONFIG.optim.actor_lr * CONFIG.optim.weight_decay
    for name, x in after.items():
        if name[-1].endswith("_lora_a"):  # B = 0 gives A a zero gradient: only AdamW's decay
            np.testing.assert_allclose(x, before[name] * decay, rtol=1e-6, err_msg=str(name))
        else:  # Adam's first step moves every weight by about lr
            assert np.abs(x - before[name]).max() > 1e-3, name
    assert metrics["actor/grad_norm"] > 0 and metrics["critic/grad_norm"] > 0
    # a fresh adapter is zero: the policy is the reference, so the one update's KL is 0
    assert float(metrics["actor/kl_loss"]) == pytest.approx(0.0, abs=1e-7)


def test_reference_logprobs_are_the_base_models(trained):
    """With adapters that change the policy, prepare's reference log-probs are those of the base
    model (the adapters switched off), not the adapted policy's."""
    model, _, _, prepare, state, out = trained
    adapted_model = _random_adapters(adapted(model, CONFIG.lora, jax.random.PRNGKey(0)), 5)
    state = state.replace(actor=nnx.state(adapted_model))
    batch = prepare(state, out)
    slots = CONFIG.rollout.max_turns * CONFIG.rollout.reply_tokens

    @nnx.jit
    def logp(m, r):
        return sequence_logprobs(m, r.tokens, r.lengths, r.loss_mask, slots, slots)[0]

    kept = batch.rollout
    base = logp(model, kept)
    np.testing.assert_allclose(batch.ref_logp, base, atol=2e-5, rtol=1e-5)
    assert np.abs(np.asarray(logp(adapted_model, kept)) - np.asarray(base)).max() > 1e-2


def _saved_names(directory) -> list[str]:
    """The paths of the arrays a checkpoint directory holds (its newest step)."""
    checkpoints = Checkpoints(directory, 0, 1)
    try:
        tree = checkpoints.manager.item_metadata(checkpoints.latest_step).tree
    finally:
        checkpoints.close()
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
    return [jax.tree_util.keystr(p, simple=True, separator="/") for p, x in leaves
            if x is not None]


def _disk_bytes(directory) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_checkpoint_resume_gives_the_same_numbers(trained, tmp_path):
    """A LoRA checkpoint holds the adapters, their AdamW moments, the critic's adapters and
    head and the step, not the frozen base (a fingerprint of it instead): restored into the
    fresh state (the base from the model), the next update repeats the unstopped one's."""
    _, _, learn, _, state, out = trained
    first, _ = learn(state, out, jax.random.PRNGKey(1))
    checkpoints = Checkpoints(tmp_path / "checkpoints", every=1, keep=2)
    assert checkpoints.maybe_save(first)
    restored = checkpoints.restore_latest(like=state)
    checkpoints.close()
    names = _saved_names(tmp_path / "checkpoints")
    assert {n.split("/")[0] for n in names} == {"actor", "actor_opt", "critic", "critic_opt",
                                                "step", "frozen"}
    assert all("_lora_" in n for n in names if n.startswith("actor/")), "no base weight"
    base = sum(x.nbytes for x in jax.tree.leaves(split_trainable(state.actor)[1]))
    assert _disk_bytes(tmp_path / "checkpoints") < base / 4
    assert jax.tree.all(jax.tree.map(np.array_equal, restored, first))
    want_state, want = learn(first, out, jax.random.PRNGKey(2))
    got_state, got = learn(restored, out, jax.random.PRNGKey(2))
    assert jax.device_get(got) == jax.device_get(want)
    assert jax.tree.all(jax.tree.map(np.array_equal, got_state, want_state))


def test_a_checkpoint_refuses_another_base_and_reads_the_old_format(trained, tmp_path):
    """Restoring into a state whose frozen base differs from the one trained on (one weight
    changed) is refused in one line; a checkpoint of the whole state (as written before the
    base was left out) still restores."""
    _, _, _, _, state, _ = trained
    saved = state.replace(step=jnp.int32(3))
    checkpoints = Checkpoints(tmp_path / "new", every=0, keep=1)
    checkpoints.maybe_save(saved, force=True)
    adapters, base = split_trainable(state.actor)
    flat, tree = jax.tree.flatten(base)
    flat[0] = flat[0].at[(0,) * flat[0].ndim].add(1e-3)
    other = state.replace(actor=nnx.merge_state(adapters, jax.tree.unflatten(tree, flat)))
    with pytest.raises(RunFault, match=r"checkpoint .*new/3 left out its frozen LoRA base "
                                       r"weights and this run's differ from those it was "
                                       r"trained with: model.source or model.init_from's "
                                       r"checkpoint changed since. Resume with the weights"):
        checkpoints.restore(3, like=other)
    with pytest.raises(ValueError, match="restore it into a concrete state"):
        checkpoints.restore(3, like=jax.eval_shape(lambda: state))
    checkpoints.close()
    old = ocp.CheckpointManager((tmp_path / "old").absolute(),
                                options=ocp.CheckpointManagerOptions(create=True),
                                item_handlers=ocp.StandardCheckpointHandler())
    old.save(3, args=ocp.args.StandardSave(saved), force=True)
    old.wait_until_finished()
    old.close()
    assert "actor/embed/value" in _saved_names(tmp_path / "old")
    checkpoints = Checkpoints(tmp_path / "old", every=0, keep=1)
    restored = checkpoints.restore_latest(like=state)
    checkpoints.close()
    assert jax.tree.all(jax.tree.map(np.array_equal, restored, saved))


def _lora_metrics(workdir) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 25-50 s, a LoRA StarPO step's compile (the fast tier resumes a LoRA SFT
# run: tests/test_sft.py)
def test_a_lora_run_resumes_exactly_and_exports(tmp_path):
    """run.py's loop on a LoRA run: its checkpoints hold no base weight; stopped after step 1
    and resumed (the base from the experiment's fresh state) it logs the numbers of a run never
    stopped; export.py writes the resumed policy, the adapters merged into the rebuilt base."""
    config = tiny_config()
    config.lora.rank, config.lora.alpha = RANK, ALPHA
    exp = api.build(config)
    exp.config.steps = 2
    assert runner.train(exp, tmp_path / "straight") == 2
    exp.config.steps = 1
    assert runner.train(exp, tmp_path / "stopped") == 1
    exp.config.steps = 2
    assert runner.train(exp, tmp_path / "stopped", resume=True) == 2
    assert _lora_metrics(tmp_path / "stopped") == _lora_metrics(tmp_path / "straight")
    names = _saved_names(tmp_path / "stopped" / "checkpoints")
    assert all("_lora_" in n for n in names if n.startswith("actor/")), "no base weight"
    base = sum(x.nbytes for x in jax.tree.leaves(split_trainable(exp.state.actor)[1]))
    assert _disk_bytes(tmp_path / "stopped" / "checkpoints") < base / 2, "two checkpoints"
    assert run_export.export_run(tmp_path / "stopped", tmp_path / "out")[0] == 2
    exported, _ = load_pretrained(tmp_path / "out")
    want = merged_params(nnx.to_pure_dict(exp.state.actor), exp.model.config)
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(exported)), want)


# ---- export ----


def test_export_merges_the_adapters(tmp_path):
    """experiments/export.py on a LoRA run's checkpoint writes a plain Hugging Face model whose
    logits are the adapted policy's."""
    config = tiny_config()
    config.lora.rank, config.lora.alpha = RANK, ALPHA
    (tmp_path / "config.json").write_text(config.to_json(indent=2) + "\n")
    model, _ = load_pretrained("tiny-random")
    train = api.train_config(config)
    state = init_train_state(train, jax.random.PRNGKey(0), model=model)
    policy = _random_adapters(nnx.merge(nnx.graphdef(adapted(model, train.lora,
                                                             jax.random.PRNGKey(0))),
                                        state.actor), seed=6)
    checkpoints = Checkpoints(tmp_path / "checkpoints", every=0, keep=1)
    checkpoints.maybe_save(state.replace(actor=nnx.state(policy), step=jnp.int32(3)), force=True)
    checkpoints.close()
    step, out = run_export.export_run(tmp_path, tmp_path / "out")
    assert step == 3
    assert "lora" not in (out / "config.json").read_text()
    exported, _ = load_pretrained(out)
    assert exported.config == base_config(policy.config)
    ids = jnp.array([[5, 17, 3, 60, 2, 44, 9, 1000]])
    want = forward.logits(policy, ids)
    assert np.abs(np.asarray(want - forward.logits(model, ids))).max() > 0.1
    np.testing.assert_allclose(forward.logits(exported, ids), want, atol=1e-5, rtol=1e-5)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_export_refuses_a_base_other_than_the_one_trained(tmp_path):
    """A LoRA checkpoint trained on other base weights than model.source gives (another file
    under the same name, an init_from workdir trained on since) is refused, nothing written."""
    config = tiny_config()
    config.lora.rank, config.lora.alpha = RANK, ALPHA
    (tmp_path / "config.json").write_text(config.to_json(indent=2) + "\n")
    model, _ = load_pretrained("tiny-random")
    state = init_train_state(api.train_config(config), jax.random.PRNGKey(0), model=model)
    adapters, base = split_trainable(state.actor)
    moved = nnx.merge_state(adapters, jax.tree.map(lambda x: x * 1.001, base))
    checkpoints = Checkpoints(tmp_path / "checkpoints", every=0, keep=1)
    checkpoints.maybe_save(state.replace(actor=moved, step=jnp.int32(3)), force=True)
    checkpoints.close()
    with pytest.raises(ValueError, match=r"left out its frozen LoRA base weights and this run's "
                                         r"differ .*; valid: the base weights the run was"):
        run_export.export_run(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- settings ----


@pytest.mark.parametrize("fields, message", [
    (dict(rank=-1), "lora.rank = -1 is invalid; valid: an int >= 0"),
    (dict(rank=8, alpha=0), "lora.alpha = 0 is invalid; valid: a number in (0.0, "),
    (dict(rank=8, targets="q_proj,mlp"), "lora.targets = 'q_proj,mlp' is invalid; valid: "
                                         "'all-linear' or comma-separated distinct names from"),
    (dict(rank=8, targets="q_proj,q_proj"), "lora.targets = 'q_proj,q_proj' is invalid"),
    (dict(rank=8, base_dtype="float16"), "lora.base_dtype = 'float16' is invalid; valid: one of "
                                         "('float32', 'bfloat16')"),
    (dict(base_dtype="bfloat16"), "lora.base_dtype = 'bfloat16' is invalid; valid: None when "
                                  "lora.rank = 0"),
])
def test_bad_settings_are_named(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LoraConfig(**fields)


def test_settings_through_the_experiment_config():
    config = tiny_config()
    config.lora.rank, config.lora.targets = 64, "q_proj, v_proj"
    assert api.train_config(config).lora.target_modules == ("q_proj", "v_proj")
    config.lora.targets = "attention"
    with pytest.raises(ValueError, match=re.escape("lora.targets = 'attention' is invalid")):
        api.train_config(config)


def test_a_model_with_other_adapters_is_refused():
    base = _random_model(TINY)
    model = _lora(base)
    assert adapted_config(model.config, dataclasses.replace(CONFIG.lora)) == model.config
    with pytest.raises(ValueError, match=re.escape("the model's LoRA adapters (rank, alpha, "
                                                   "targets) = (4, 8.0")):
        adapted_config(model.config, LoraConfig(rank=8))
    with pytest.raises(ValueError, match="differ from the config's lora section None"):
        adapted_config(model.config, LoraConfig())
