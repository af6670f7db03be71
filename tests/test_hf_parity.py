"""Hugging Face checkpoints: our loader + Decoder against transformers' own models (float32)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may be downloaded

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from starpo_jax.models import load_pretrained
from starpo_jax.models.params import load_hf_directory, model_from_hf_tensors, read_safetensors

from helpers import forward

SMALL = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def _save_hf_model(
    directory: Path, family: str, seed: int = 0, shard: str | None = None, **config
) -> torch.nn.Module:
    """A random transformers model saved as safetensors; norms and biases made non-trivial."""
    torch.manual_seed(seed)
    config_cls, model_cls = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "llama": (LlamaConfig, LlamaForCausalLM),
    }[family]
    model = model_cls(config_cls(**{**SMALL, **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.add_(0.2 * torch.randn_like(p))
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(directory, **kwargs)
    return model


def _ragged_batch(vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    ids = rng.randint(0, vocab_size, (3, 10))
    mask = np.zeros((3, 10), bool)
    for row, length in enumerate((10, 6, 3)):  # right padding, as the KV-cache path uses
        mask[row, :length] = True
    return ids, mask


@pytest.mark.parametrize(
    "family, config, shard",
    [
        ("qwen2", dict(rope_theta=5000.0), None),
        ("qwen2", dict(tie_word_embeddings=True), None),
        ("llama", dict(), None),
        ("llama", dict(tie_word_embeddings=True, rope_theta=500000.0), None),
        ("qwen2", dict(tie_word_embeddings=True), "40KB"),
    ],
)
def test_logits_match_transformers(tmp_path, family, config, shard):
    hf_model = _save_hf_model(tmp_path, family, shard=shard, **config)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").is_file()
        assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    cfg, tensors = load_hf_directory(tmp_path)
    assert cfg.attention_bias == (family == "qwen2")
    assert cfg.tie_word_embeddings == config.get("tie_word_embeddings", False)
    assert cfg.rope_theta == config.get("rope_theta", 10000.0)
    model = model_from_hf_tensors(cfg, tensors)

    ids, mask = _ragged_batch(cfg.vocab_size)
    with torch.no_grad():
        want = hf_model(
            torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64))
        ).logits
    got = np.asarray(forward.logits(model, jnp.asarray(ids), jnp.asarray(mask)))
    diff = np.abs(got - want.numpy())[mask]
    assert diff.max() <= 1e-4, f"max abs logit diff {diff.max():.2e}"


def test_bfloat16_checkpoint_is_read_exactly(tmp_path):
    hf_model = _save_hf_model(tmp_path, "llama")
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path)
    tensors = read_safetensors(tmp_path / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    want = hf_model.state_dict()[name].float().numpy()
    np.testing.assert_array_equal(tensors[name].astype(np.float32), want)


def test_load_pretrained_reads_directory_with_tokenizer(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    _save_hf_model(tmp_path, "qwen2")
    # A small byte-level BPE, as Qwen2's tokenizer is; trained here since nothing is downloaded.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["<think> push the box </think> <answer> Up || Left </answer>", "# _ O X P\n#__#"] * 20
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=SMALL["vocab_size"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    original = PreTrainedTokenizerFast(tokenizer_object=tok)
    original.save_pretrained(tmp_path)

    model, tokenizer = load_pretrained(tmp_path, dtype="bfloat16", value_head=True)
    assert model.config.dtype == model.config.param_dtype == "bfloat16"
    assert model.layers.q_proj[...].dtype == jnp.bfloat16
    assert model.value_head[...].shape == (SMALL["hidden_size"],)
    text = "<answer> Left || Up </answer>"
    ids = tokenizer(text)["input_ids"]
    assert ids == original(text)["input_ids"] and len(ids) > 3
    assert tokenizer.decode(ids) == text


def test_value_head_taken_from_score_tensors(saved):
    cfg, tensors = load_hf_directory(saved)
    score = np.random.RandomState(0).standard_normal((1, cfg.hidden_size)).astype(np.float32)
    tensors = {**tensors, "score.weight": score, "score.bias": np.array([0.5], np.float32)}
    critic = model_from_hf_tensors(cfg, tensors, value_head=True)
    np.testing.assert_array_equal(np.asarray(critic.value_head[...]), score[0])
    assert float(critic.value_bias[...]) == 0.5
    with pytest.raises(ValueError, match="does not use: score.bias, score.weight"):
        model_from_hf_tensors(cfg, tensors)  # a policy has no value head to put them in


# ---- errors: each bad input -> a message that names the problem ----


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("qwen2")
    _save_hf_model(directory, "qwen2")
    return directory


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _truncate(directory: Path) -> None:
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _garbage(directory: Path) -> None:
    (directory / "model.safetensors").write_bytes(b"\xff" * 64)


def _write_index(directory: Path) -> None:
    weight_map = {"model.norm.weight": "model.safetensors", "lm_head.weight": "model-2.safetensors"}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize(
    "damage, error, message",
    [
        (lambda d: (d / "config.json").unlink(), FileNotFoundError, "has no config.json"),
        (
            lambda d: _edit_config(d, architectures=["MistralForCausalLM"]),
            ValueError,
            "unsupported architecture ['MistralForCausalLM']; "
            "supported: Qwen2ForCausalLM, LlamaForCausalLM",
        ),
        (
            lambda d: _edit_config(d, rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}),
            ValueError,
            "unsupported rope scaling 'llama3'",
        ),
        (lambda d: _edit_config(d, hidden_act="gelu"), ValueError, "unsupported hidden_act 'gelu'"),
        (lambda d: _edit_config(d, use_sliding_window=True), ValueError, "use_sliding_window=True"),
        (
            lambda d: _edit_config(d, num_key_value_heads=3),
            ValueError,
            "num_heads (4) must be a multiple of num_kv_heads (3)",
        ),
        (_truncate, ValueError, "truncated or corrupt"),
        (_garbage, ValueError, "not a valid safetensors file"),
        (
            lambda d: (d / "model.safetensors").unlink(),
            FileNotFoundError,
            "neither model.safetensors nor model.safetensors.index.json",
        ),
        (_write_index, FileNotFoundError, "shard 'model-2.safetensors' listed in"),
    ],
)
def test_directory_errors(saved, tmp_path, damage, error, message):
    directory = tmp_path / "model"
    shutil.copytree(saved, directory)
    damage(directory)
    with pytest.raises(error, match=re.escape(message)):
        load_hf_directory(directory)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"no model directory at '{tmp_path / 'nope'}'")
    ):
        load_hf_directory(tmp_path / "nope")


def _rename(tensors, old, new):
    tensors[new] = tensors.pop(old)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.pop("model.norm.weight"),
            "missing 1 tensor(s) the config needs: model.norm.weight",
        ),
        (
            lambda t: t.__setitem__("model.extra.weight", np.zeros(3)),
            "1 tensor(s) this config does not use: model.extra.weight",
        ),
        (
            lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight", np.zeros((32, 64))),
            "tensor 'model.layers.0.self_attn.q_proj.weight': "
            "expected shape (64, 64), found (32, 64)",
        ),
        (
            lambda t: _rename(
                t, "model.layers.2.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight"
            ),
            "model.layers.2.mlp.up_proj.weight",
        ),
    ],
)
def test_tensor_mapping_errors(saved, edit, message):
    cfg, tensors = load_hf_directory(saved)
    tensors = dict(tensors)
    edit(tensors)
    with pytest.raises(ValueError, match=re.escape(message)):
        model_from_hf_tensors(cfg, tensors)


def test_tied_config_rejects_a_different_lm_head(saved):
    cfg, tensors = load_hf_directory(saved, tie_word_embeddings=True)  # the file is untied
    with pytest.raises(
        ValueError, match="'lm_head.weight' differs from 'model.embed_tokens.weight'"
    ):
        model_from_hf_tensors(cfg, tensors)


@pytest.mark.parametrize(
    "source, error, message",
    [
        ("no-such-model", FileNotFoundError, "cannot load model 'no-such-model'"),
        ("no-such-model", FileNotFoundError, "'smollm2-135m-instruct', 'tiny-random'"),
        ("/nowhere/model.gguf", FileNotFoundError, "no GGUF file at '/nowhere/model.gguf'"),
    ],
)
def test_load_pretrained_rejects_unknown_sources(source, error, message):
    with pytest.raises(error, match=re.escape(message)):
        load_pretrained(source)
