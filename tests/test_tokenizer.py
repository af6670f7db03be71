"""The GGUF tokenizer against transformers' GGUF tokenizer for the embedded SmolLM2 file:
ids, decoding, chat templates and special tokens; the pre-tokenizer table; bad metadata."""

from __future__ import annotations

import os
import re

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may be downloaded

import pytest
from transformers import AutoTokenizer

from starpo_jax.models.embedded import embedded_gguf_path
from starpo_jax.models.gguf import load_gguf_tokenizer
from starpo_jax.models.tokenizer import PRE_TOKENIZERS, build_bpe_tokenizer, byte_to_unicode

SOKOBAN = "######\n#__#_#\n#_OX_#\n#_√P_#\n#S___#\n######"
FROZEN_LAKE = "_P__\n_O_O\n___O\nO__G"
BANDIT = (
    "You are facing 2 slot machines: Phoenix and Dragon. Phoenix pays 0.1 with p=0.9; "
    "Dragon pays 1.0 with p=0.25. Which do you pull? Answer with <answer> Dragon </answer>."
)
ANSWER = "<think> The box is left of me, push it: Left. </think> <answer> Up || Left </answer>"

CORPUS = [
    "Hello world",
    SOKOBAN,
    FROZEN_LAKE,
    BANDIT,
    ANSWER,
    "<answer>Right||Down</answer>",
    "😀 emoji 🤖👍🏽 and a flag 🇫🇷",
    "日本語のテキスト、中文文本，한국어",
    "café naïve résumé Zürich Ørsted",
    "digits 0 7 42 3.14159 -273.15 1e-5 1,000,000 2024-11-22",
    "12345678901234567890",
    "x=1+2*3/4",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\tmore",
    "\n\n\nnew\r\nlines\n",
    "mixed \u00a0nbsp and \u2003em space",
    "Reward: -0.1\nTurn 3/5",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><repo_name>x<file_sep>",
    "don't they'll we've I'M",
]


@pytest.fixture(scope="module")
def path():
    return embedded_gguf_path()


@pytest.fixture(scope="module")
def ours(path):
    return load_gguf_tokenizer(path)


@pytest.fixture(scope="module")
def ref(path):
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.parametrize("text", CORPUS)
def test_ids_and_decode_match_transformers(ours, ref, text):
    ids = ours.encode(text)
    assert ids == ref.encode(text)
    assert ours.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == ref.decode(ids) == text  # byte-level BPE is lossless
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


# SmolLM2 isolates every digit before GPT-2's split (its tokenizer.json: Digits then ByteLevel;
# llama.cpp's "smollm" pre-tokenizer: \p{N} then the GPT-2 regex). transformers' GGUF loader has
# no entry for "smollm" and falls back to GPT-2's split alone, which differs only where a run of
# whitespace precedes a digit: GPT-2 keeps one space for the digit (" 1"), the digit split leaves
# the whole run together. Reference: transformers' tokenizer on the digit-isolated pieces.
@pytest.mark.parametrize(
    "text,tokens",
    [
        ("a  1", ["a", "ĠĠ", "1"]),
        ("a   12 b", ["a", "ĠĠĠ", "1", "2", "Ġb"]),
        ("x\n\n 3", ["x", "ĊĊĠ", "3"]),
        ("score:  10", ["score", ":", "ĠĠ", "1", "0"]),
    ],
)
def test_digits_are_isolated_before_the_byte_level_split(ours, ref, text, tokens):
    ids = ours.encode(text)
    assert ours.convert_ids_to_tokens(ids) == tokens
    pieces = [p for p in re.split(r"(\d)", text) if p]
    assert ids == [i for piece in pieces for i in ref.encode(piece)]
    assert ours.decode(ids) == text


CONVERSATIONS = {
    "sokoban": [
        {
            "role": "system",
            "content": "You are solving Sokoban. Symbols: # wall, _ floor, O target, "
            "X box, √ box on target, P player, S player on target.",
        },
        {"role": "user", "content": f"Turn 1:\n{SOKOBAN}\nDecide your next action(s)."},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": f"Reward: -0.1\nTurn 2:\n{SOKOBAN}"},
    ],
    "frozen_lake": [{"role": "user", "content": f"FrozenLake, reach G avoiding O:\n{FROZEN_LAKE}"}],
    "bandit": [
        {"role": "user", "content": BANDIT},
        {
            "role": "assistant",
            "content": "<think> Dragon has higher EV </think> <answer> Dragon </answer>",
        },
    ],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, ref, name, generation_prompt):
    messages = CONVERSATIONS[name]
    text = ours.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    assert text == ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    ours_ids = ours.apply_chat_template(messages, add_generation_prompt=generation_prompt)[
        "input_ids"
    ]
    ref_ids = ref.apply_chat_template(messages, add_generation_prompt=generation_prompt)[
        "input_ids"
    ]
    assert ours_ids == ref_ids
    assert text.startswith("<|im_start|>") and text.endswith(
        "<|im_start|>assistant\n" if generation_prompt else "<|im_end|>\n"
    )


def test_special_tokens_match_transformers(ours, ref):
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, name) == getattr(ref, name), name
        assert getattr(ours, f"{name}_id") == getattr(ref, f"{name}_id"), name
    assert (ours.eos_token, ours.eos_token_id, ours.pad_token_id) == ("<|im_end|>", 2, 2)
    assert ours.all_special_tokens == ref.all_special_tokens
    assert ours.all_special_ids == ref.all_special_ids
    assert len(ours) == len(ref) == 49152
    assert {i: (t.content, t.special) for i, t in ours.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in ref.added_tokens_decoder.items()
    }


@pytest.mark.parametrize(
    "text,ids",
    [
        ("<|im_end|>", [2]),
        ("<|im_start|>", [1]),
        ("<repo_name>", [3]),
        ("<|im_end|><|im_end|>", [2, 2]),
    ],
)
def test_control_tokens_stay_whole(ours, text, ids):
    assert ours.encode(text) == ids


def test_each_call_returns_an_independent_tokenizer(path, ours):
    again = load_gguf_tokenizer(path)
    again.padding_side = "left"
    assert again is not ours and ours.padding_side == "right"
    assert again.encode(SOKOBAN) == ours.encode(SOKOBAN)


def test_byte_to_unicode_is_a_printable_bijection():
    table = byte_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert all(table[b] == chr(b) for b in range(ord("!"), ord("~") + 1))
    assert not any(c.isspace() for c in table.values())
    assert (table[ord(" ")], table[ord("\n")], table[0]) == ("Ġ", "Ċ", "Ā")


@pytest.mark.parametrize(
    "pre,text,pieces",
    [
        ("gpt2", "ab 12345 don't\n\n  x", ["ab", "Ġ12345", "Ġdon", "'t", "ĊĊĠ", "Ġx"]),
        ("smollm", "ab 12345 don't", ["ab", "Ġ", "1", "2", "3", "4", "5", "Ġdon", "'t"]),
        (
            "qwen2",
            "ab 12345 DON'T\n\n  x",
            ["ab", "Ġ", "1", "2", "3", "4", "5", "ĠDON", "'T", "ĊĊ", "Ġ", "Ġx"],
        ),
        ("llama-bpe", "ab 12345 don't", ["ab", "Ġ", "123", "45", "Ġdon", "'t"]),
    ],
)
def test_pre_tokenizers(pre, text, pieces):
    assert [p for p, _ in PRE_TOKENIZERS[pre]().pre_tokenize_str(text)] == pieces


def _metadata(**changes):
    base = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
    }
    base.update({f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    "metadata,message",
    [
        (_metadata(model="llama"), "unsupported GGUF tokenizer model 'llama'; only byte-level BPE"),
        (_metadata(pre="tekken"), "unsupported GGUF pre-tokenizer 'tekken'; supported: .*smollm"),
        (_metadata(merges=None), "lacks the required key 'tokenizer.ggml.merges'"),
        (_metadata(merges=["a b c"]), "malformed GGUF merge 'a b c'"),
        (_metadata(merges=["a c"]), "merges and tokens disagree: .*`c` out of vocabulary"),
        (_metadata(add_bos_token=True, bos_token_id=7), "bos_token_id=7 is not a token id"),
    ],
)
def test_bad_metadata_is_named(metadata, message):
    with pytest.raises(ValueError, match=message):
        build_bpe_tokenizer(metadata)


def test_raw_text_tokens_are_respelled_as_bytes():
    """Some converters store a normal token as raw text ("€" rather than its bytes "âĤ¬")."""
    tokenizer = build_bpe_tokenizer(
        _metadata(tokens=["â", "Ĥ", "¬", "âĤ", "€"], token_type=[1] * 5, merges=["â Ĥ", "âĤ ¬"])
    )
    assert tokenizer.encode("€").ids == [4]
    assert tokenizer.decode([4]) == "€"
