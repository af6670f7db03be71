"""Export to a Hugging Face directory: transformers' logits equal ours, our loader gives the
weights back bit for bit, shards, the tokenizer and chat template survive, experiments/export.py
exports a checkpoint's actor (not the initial weights), and each mistake is named."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may be downloaded

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from flax import nnx, traverse_util  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.run import export as run_export  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints, checkpoint_bytes, saved_tree  # noqa: E402
from starpo_jax.run.workdir import RunFault  # noqa: E402
from starpo_jax.models import Decoder, ModelConfig, load_pretrained  # noqa: E402
from starpo_jax.models.embedded import tiny_random_config  # noqa: E402
from starpo_jax.models.export import parse_size, save_pretrained  # noqa: E402
from starpo_jax.models.params import read_safetensors  # noqa: E402
from starpo_jax.rollout import jax_env  # noqa: E402
from starpo_jax.text import chat_pieces  # noqa: E402
from starpo_jax.train.step import init_train_state  # noqa: E402
from helpers.scripts import script  # noqa: E402
from helpers.tiny import tiny_config, tiny_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer, rebuilt from the embedded GGUF (49152 tokens, chat template)."""
    return load_pretrained("tiny-random")[1]


def _configs(vocab: int) -> dict[str, ModelConfig]:
    return {
        # tiny-random's shape: Llama, tied embeddings and GQA, as SmolLM2
        "llama": tiny_random_config(vocab),
        # Qwen2: q/k/v biases, untied head, a vocabulary padded past the tokenizer's (as Qwen2.5)
        "qwen2": ModelConfig(vocab_size=vocab + 64, hidden_size=32, intermediate_size=48,
                             num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                             rope_theta=5000.0, rms_norm_eps=1e-5, attention_bias=True,
                             tie_word_embeddings=False, max_position_embeddings=512),
    }


def _perturb(tree, seed: int):
    """Every leaf + N(0, 0.05^2): norms leave 1 and biases leave 0, so a swapped or dropped
    tensor changes the logits."""
    rng = np.random.default_rng(seed)  # numpy: eager jax ops would compile one by one
    return jax.tree.map(
        lambda x: jnp.asarray(np.asarray(x) + 0.05 * rng.standard_normal(x.shape, np.float32),
                              x.dtype), tree)


def _model(config: ModelConfig, seed: int = 0, value_head: bool = False) -> Decoder:
    model = Decoder(config, rngs=nnx.Rngs(seed), value_head=value_head)
    nnx.update(model, _perturb(nnx.state(model), seed))
    return model


def _flat(tree) -> dict[str, np.ndarray]:
    """nnx.State / Decoder -> {"layers/q_proj": array, ...}."""
    state = nnx.state(tree) if isinstance(tree, Decoder) else tree
    return {k: np.asarray(v) for k, v in
            traverse_util.flatten_dict(nnx.to_pure_dict(state), sep="/").items()}


def _assert_same_weights(got, want, dtype=np.float32) -> None:
    got, want = _flat(got), _flat(want)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name].astype(dtype), err_msg=name)


@pytest.mark.parametrize("family, dtype, shard", [
    ("llama", "float32", None),
    ("qwen2", "float32", None),
    ("qwen2", "float32", "300KB"),
    ("llama", "bfloat16", None),
])
def test_export_round_trips(tmp_path, tokenizer, family, dtype, shard):
    config = _configs(len(tokenizer))[family]
    model = _model(config)
    out = tmp_path / "exported"
    kwargs = {"max_shard_size": shard} if shard else {}
    assert save_pretrained(model, config, tokenizer, out, dtype=dtype, **kwargs) == out
    assert not [p for p in tmp_path.iterdir() if p != out], "no temporary directory left"

    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == [{"llama": "LlamaForCausalLM",
                                           "qwen2": "Qwen2ForCausalLM"}[family]]
    assert hf_config["dtype"] == dtype
    special = {name: getattr(tokenizer, name) for name in SPECIAL_IDS}
    assert special["eos_token_id"] is not None
    special = {k: v for k, v in special.items() if v is not None}
    assert json.loads((out / "generation_config.json").read_text()) == special
    assert {k: hf_config[k] for k in special} == special
    if shard:
        _check_shards(out, parse_size(shard))

    # Our loader: the same config and bit-identical weights (cast to the stored dtype).
    loaded, loaded_tokenizer = load_pretrained(out, dtype=dtype)
    assert loaded.config == dataclasses.replace(config, dtype=dtype, param_dtype=dtype)
    _assert_same_weights(loaded, model, jnp.dtype(dtype))
    assert loaded_tokenizer("Up || Left")["input_ids"] == tokenizer("Up || Left")["input_ids"]

    if dtype == "float32":  # transformers' own model computes the same logits
        hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        assert type(hf).__name__ == hf_config["architectures"][0]
        ids = np.random.RandomState(0).randint(0, len(tokenizer), (2, 12))
        with torch.no_grad():
            want = hf(torch.tensor(ids)).logits.numpy()
        got = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(ids)))
        diff = np.abs(got - want).max()
        assert diff <= 1e-4, f"max abs logit diff {diff:.2e}"


def _check_shards(out: Path, limit: int) -> None:
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and not (out / "model.safetensors").exists()
    assert files == sorted(p.name for p in out.glob("model-*.safetensors"))
    total = 0
    for file in files:
        tensors = read_safetensors(out / file)
        assert {n for n, f in index["weight_map"].items() if f == file} == set(tensors)
        nbytes = sum(t.nbytes for t in tensors.values())
        assert nbytes <= limit or len(tensors) == 1, f"{file}: {nbytes} bytes > {limit}"
        total += nbytes
    assert index["metadata"]["total_size"] == total


def test_tokenizer_and_chat_template_survive(tmp_path, tokenizer):
    config = _configs(len(tokenizer))["llama"]
    save_pretrained(_model(config), config, tokenizer, tmp_path / "out")
    theirs = AutoTokenizer.from_pretrained(tmp_path / "out")
    for text in ["<think> push the box </think> <answer> Up || Left </answer>",
                 "Turn 1:\nState:\n#P_O#\nYou have 5 actions left.", "a  1 22 333 ;)",
                 "héllo wörld 🙂", "<|im_start|>user\nhi<|im_end|>"]:
        assert theirs(text)["input_ids"] == tokenizer(text)["input_ids"], text
    messages = [{"role": "system", "content": "You're a helpful assistant."},
                {"role": "user", "content": "Turn 1:\nState:\n#P_O#"},
                {"role": "assistant", "content": "<think> hm </think> <answer> Up </answer>"},
                {"role": "user", "content": "Reward:\n0.1"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in prompt
    assert theirs.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=True) == prompt
    for name in SPECIAL_IDS:
        assert getattr(theirs, name) == getattr(tokenizer, name), name


def test_value_head_is_not_exported(tmp_path, tokenizer):
    config = _configs(len(tokenizer))["llama"]
    critic = _model(config, value_head=True)
    save_pretrained(nnx.state(critic), config, tokenizer, tmp_path / "out")
    assert not [n for n in read_safetensors(tmp_path / "out" / "model.safetensors")
                if n.startswith("score")]
    policy = {k: v for k, v in _flat(critic).items() if not k.startswith("value_")}
    loaded = _flat(load_pretrained(tmp_path / "out")[0])
    assert sorted(loaded) == sorted(policy)
    assert all(np.array_equal(loaded[k], policy[k]) for k in policy)


def test_overwrite_replaces_a_directory(tmp_path, tokenizer):
    config = _configs(len(tokenizer))["llama"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    save_pretrained(_model(config, seed=1), config, tokenizer, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_export_leaves_nothing(tmp_path, tokenizer):
    class BrokenTokenizer:  # fails after the weights are written
        def __init__(self, inner):
            self.inner = inner

        def __len__(self):
            return len(self.inner)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def save_pretrained(self, directory):
            raise OSError("disk full")

    config = _configs(len(tokenizer))["llama"]
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(_model(config), config, BrokenTokenizer(tokenizer), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size, nbytes", [
    (1000, 1000), ("2GB", 2 * 10**9), ("40KiB", 40 * 1024), ("1.5MB", 1_500_000), ("7", 7)])
def test_parse_size(size, nbytes):
    assert parse_size(size) == nbytes


@pytest.mark.parametrize("size", ["0", "2 parsecs", "GB", -5, True])
def test_parse_size_rejects(size):
    with pytest.raises(ValueError, match=re.escape(f"size {size!r} is invalid")):
        parse_size(size)


def _bad_out(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    return tmp_path / "out"


def _file_out(tmp_path: Path) -> Path:
    (tmp_path / "out").write_text("x")
    return tmp_path / "out"


@pytest.mark.parametrize("case, error, message", [
    ("non-empty out", FileExistsError, "exists and is not empty; choose another directory or "
                                       "pass overwrite=True"),
    ("file out", FileExistsError, "exists and is not a directory"),
    ("dtype", ValueError, "export dtype 'int8' is invalid; valid: one of ('float32', "),
    ("shard size", ValueError, "size '2 parsecs' is invalid"),
    ("tokenizer too big", ValueError, "the tokenizer has 49152 tokens but the model's "
                                      "vocabulary only 300"),
    ("other shape", ValueError, "parameter 'embed' has shape (49152, 64); the config needs "
                                "(49152, 32)"),
    ("untied config, tied params", ValueError, "missing ['lm_head'], unexpected []"),
])
def test_errors_are_named(tmp_path, tokenizer, case, error, message):
    llama, qwen2 = _configs(len(tokenizer)).values()
    model, config, out, kwargs = _model(llama), llama, tmp_path / "new", {}
    if case == "non-empty out":
        out = _bad_out(tmp_path)
    elif case == "file out":
        out = _file_out(tmp_path)
    elif case == "dtype":
        kwargs = {"dtype": "int8"}
    elif case == "shard size":
        kwargs = {"max_shard_size": "2 parsecs"}
    elif case == "tokenizer too big":
        config = dataclasses.replace(llama, vocab_size=300)
    elif case == "other shape":
        config = dataclasses.replace(llama, hidden_size=32)
    elif case == "untied config, tied params":
        config = dataclasses.replace(llama, tie_word_embeddings=False)
    with pytest.raises(error, match=re.escape(message)):
        save_pretrained(model, config, tokenizer, out, **kwargs)
    assert not (tmp_path / "new").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary left"


# ---- experiments/export.py: a run's checkpoint -> a Hugging Face directory ----


def _make_workdir(workdir: Path, source: str, steps: tuple[int, ...]) -> tuple[dict, Decoder]:
    """A workdir as run.py leaves it: config.json (PPO with KL, so a checkpoint also holds a
    critic, its optimiser state and a reference) and checkpoints of `steps`, whose actors are
    different perturbations of the model's weights. Returns ({step: actor}, the model)."""
    config = tiny_config()
    config.model.source, config.algo, config.loss.kl_coef = source, "ppo", 0.001
    (workdir / "config.json").write_text(config.to_json(indent=2) + "\n")
    model, _ = load_pretrained(source, config.model.dtype)
    state = init_train_state(api.train_config(config), jax.random.PRNGKey(0), model=model)
    assert state.critic is not None and state.reference is not None
    actors = {}
    checkpoints = Checkpoints(workdir / "checkpoints", every=0, keep=3)
    for step in steps:
        actors[step] = _perturb(state.actor, seed=step)
        checkpoints.maybe_save(state.replace(actor=actors[step], step=jnp.int32(step)),
                               force=True)
    checkpoints.close()
    return actors, model


@pytest.fixture(scope="module")
def run_workdir(tmp_path_factory):
    """A tiny-random run with checkpoints of steps 2 and 5: (workdir, {step: actor}, model)."""
    workdir = tmp_path_factory.mktemp("run")
    return workdir, *_make_workdir(workdir, "tiny-random", (2, 5))


def test_a_checkpoint_keeps_what_changes_and_not_the_kl_reference(run_workdir):
    """Full fine-tuning: a checkpoint keeps the weights and their AdamW moments (an exact resume
    needs both; export.py writes the weights alone), not the KL reference, which is the fresh
    state's (the initial weights): restored into a fresh state it is the saved state bit for
    bit; a fresh state with another reference is refused. Without a reference (the
    quickstart's) the whole state is saved as it is."""
    workdir, actors, model = run_workdir
    config = api.train_config(api.read_run_config(workdir)[0])
    fresh = init_train_state(config, jax.random.PRNGKey(0), model=model)
    checkpoints = Checkpoints(workdir / "checkpoints", 0, 3)
    try:
        saved = checkpoints.manager.item_metadata(5).tree
        restored = checkpoints.restore(5, like=fresh)
        other = fresh.replace(reference=jax.tree.map(lambda x: x * 2, fresh.reference))
        with pytest.raises(RunFault, match=r"checkpoint .*/5 left out its frozen KL reference "
                                           r"weights and this run's differ"):
            checkpoints.restore(5, like=other)
    finally:
        checkpoints.close()
    assert saved["reference"] is None and set(saved["frozen"]) == {"reference"}
    assert {"embed", "layers"} <= set(saved["actor"]) and saved["actor_opt"] is not None
    want = fresh.replace(actor=actors[5], step=jnp.int32(5))
    assert jax.tree.all(jax.tree.map(np.array_equal, restored, want))
    assert checkpoint_bytes(fresh) == sum(
        x.nbytes for x in jax.tree.leaves(fresh.replace(reference=None)))
    no_reference = fresh.replace(reference=None)
    assert saved_tree(no_reference) is no_reference


@pytest.mark.parametrize("step", [None, 2])
def test_export_run_writes_the_checkpoint_actor(tmp_path, run_workdir, step):
    workdir, actors, initial = run_workdir
    assert not np.array_equal(_flat(actors[2])["embed"], _flat(initial)["embed"])
    argv = ["--workdir", str(workdir), "--out", str(tmp_path / "out")]
    script("export")["main"](argv + ([] if step is None else ["--step", str(step)]))
    loaded, _ = load_pretrained(tmp_path / "out")
    _assert_same_weights(loaded, actors[5 if step is None else step])
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.tie_word_embeddings


def test_the_export_prompts_its_policy_as_the_run_did(tmp_path, tokenizer, run_workdir):
    """Plain transformers on the export alone: the messages starpo_prompt.json describes (its
    system prompt, the env's intro and the per-turn template filled for a rollout's initial
    state), through the exported chat template with add_generation_prompt=True, are token for
    token what the run's rollout fed the policy (first prompt and forced reply prefix), and the
    greedy reply transformers generates from them is the rollout's greedy reply."""
    workdir, actors, model = run_workdir
    run_export.export_run(workdir, tmp_path / "out")
    setup = json.loads((tmp_path / "out" / "starpo_prompt.json").read_text())
    assert (setup["reply_prefix"], setup["stop"]) == ("<answer>", ["</answer>"])
    assert setup["chat_template_adds_reply_prefix"]
    theirs = AutoTokenizer.from_pretrained(tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    exp = tiny_experiment()  # the run's env and codec (tiny_config's; PPO changes neither)
    config = api.train_config(api.read_run_config(workdir)[0]).rollout
    graphdef, params = nnx.split(model)
    out = jax.device_get(jax.jit(lambda p, k: jax_env.rollout(
        graphdef, p, exp.env, exp.codec, config, k, eos_id=theirs.eos_token_id,
        pad_id=theirs.pad_token_id, greedy=True))(actors[5], jax.random.PRNGKey(3)))
    reset_keys = jax.random.split(jax.random.split(jax.random.PRNGKey(3))[0], config.groups)
    fed = int(out.prompt_lengths[0]) + len(exp.codec.forced_prefix_ids)
    reply = out.tokens[0][out.loss_mask[0]].tolist()
    state = exp.env.render_text(exp.env.reset(reset_keys[0])[0])
    user = setup["intro"] + setup["turn"].format(turn=1, state=state,
                                                 actions_left=config.max_actions_per_traj)
    messages = [{"role": "system", "content": setup["system"]}, {"role": "user", "content": user}]
    ids = theirs.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == out.tokens[0, :fed].tolist()
    assert theirs.decode(ids).endswith("<|im_start|>assistant\n<answer>")
    with torch.no_grad():
        generated = hf.generate(torch.tensor([ids]), do_sample=False, pad_token_id=0,
                                max_new_tokens=config.reply_tokens)[0, len(ids):].tolist()
    assert 1 <= len(reply) and generated[:len(reply)] == reply
    # The example is the same construction for the initial state of PRNGKey(0); reply_prefix=""
    # gives the model's own generation prompt.
    example = setup["example"]
    assert theirs.apply_chat_template(example["messages"], add_generation_prompt=True,
                                      tokenize=False) == example["prompt"]
    assert theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                      reply_prefix="") + "<answer>" == theirs.decode(ids)
    # A run from the export (model.source) builds its prompts as from the original model.
    assert chat_pieces(theirs) == chat_pieces(tokenizer)


def test_export_run_from_a_hugging_face_source(tmp_path, tokenizer):
    """A run of a Qwen2-style model read from a Hugging Face directory (the paper setting):
    its export keeps the source's generation defaults."""
    config = _configs(len(tokenizer))["qwen2"]
    defaults = {"temperature": 0.7, "eos_token_id": [tokenizer.eos_token_id, 0]}
    source = save_pretrained(_model(config), config, tokenizer, tmp_path / "source",
                             generation_config=defaults)
    (tmp_path / "run").mkdir()
    actors, _ = _make_workdir(tmp_path / "run", str(source), (1,))
    assert run_export.export_run(tmp_path / "run", tmp_path / "out") == (1, tmp_path / "out")
    _assert_same_weights(load_pretrained(tmp_path / "out")[0], actors[1])
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert {k: generation[k] for k in defaults} == defaults


@pytest.mark.parametrize("case, error, message", [
    ("missing step", ValueError, "no checkpoint of step 3 in"),
    ("missing step", ValueError, "saved steps: [2, 5]"),
    ("no config", FileNotFoundError, "config.json does not exist: expected the --workdir of a "
                                     "run of experiments/run.py"),
    ("no checkpoints", FileNotFoundError, "holds no checkpoints"),
    ("out exists", FileExistsError, "exists and is not empty"),
])
def test_export_run_errors(tmp_path, run_workdir, case, error, message):
    workdir, out = run_workdir[0], tmp_path / "out"
    if case in ("no config", "no checkpoints"):
        workdir = tmp_path / "workdir"
        workdir.mkdir()
        if case == "no checkpoints":
            (workdir / "config.json").write_text((run_workdir[0] / "config.json").read_text())
    if case == "out exists":
        out = _bad_out(tmp_path)
    with pytest.raises(error, match=re.escape(message)):
        run_export.export_run(workdir, out, step=3 if case == "missing step" else None)
    assert not (workdir / "checkpoints").exists() or case in ("missing step", "out exists")
    assert not (tmp_path / "out").exists() or case == "out exists"


def test_command_line_reports_errors(tmp_path, run_workdir):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "export.py"), "--workdir",
                           str(run_workdir[0]), "--out", str(tmp_path / "out"), "--step", "4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "error: no checkpoint of step 4" in done.stderr and "[2, 5]" in done.stderr, \
        done.stderr[-2000:]
