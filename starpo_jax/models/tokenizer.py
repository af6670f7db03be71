"""The tokenizer a GGUF file describes, rebuilt with `tokenizers` (no torch, no model hub).

A GGUF carries no `tokenizer.json`; it stores the byte-level BPE vocabulary and merges, token
types (control = special), the bos/eos/pad ids, the chat template and the name of the
pre-tokenizer llama.cpp should use (`tokenizer.ggml.pre`). From those this module builds a
`tokenizers.Tokenizer` and wraps it as a transformers fast tokenizer, so `apply_chat_template`,
`decode` and padding work as for any Hugging Face tokenizer.

Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: SmolLM, Qwen2, Llama 3) are
supported; SentencePiece vocabularies get a clear error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

# llama.cpp token types (llama_token_type): 3 = control (special), 4 = user-defined (added, plain).
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer splits, written as the `tokenizer.json`s of these model families define them.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = _QWEN2_SPLIT.replace(r"|\p{N}|", r"|\p{N}{1,3}|")


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), _byte_level(use_regex=False)]
    )


# `tokenizer.ggml.pre` -> the pre-tokenizer of the model family's own tokenizer.json.
# SmolLM isolates every digit before GPT-2's split (llama.cpp's "smollm" regexes do the same).
# transformers' GGUF loader (5.23) has no "smollm" entry and uses GPT-2's split alone, which
# differs only where whitespace runs into a digit ("a  1": we give a,ĠĠ,1; it gives a,Ġ,Ġ,1).
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "gpt2": lambda: _byte_level(use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level(use_regex=True)]
    ),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
}


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used to spell byte-level tokens.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) are
    shifted to code points 256, 257, ... in byte order, so no token holds whitespace.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {byte: chr(byte) for byte in printable}
    shifted = (byte for byte in range(256) if byte not in table)
    table.update({byte: chr(256 + offset) for offset, byte in enumerate(shifted)})
    return dict(sorted(table.items()))


def build_bpe_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` from GGUF tokenizer metadata (`tokenizer.ggml.*` keys).

    Needs `model` ("gpt2"), `tokens` and `merges`; `pre` (default "gpt2") picks the
    pre-tokenizer, `token_type` marks control tokens (special added tokens) and user-defined
    ones (plain added tokens), both matched whole in text. ValueError names what is unsupported.
    """
    model_kind = metadata.get("tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ValueError(
            f"unsupported GGUF tokenizer model {model_kind!r}; only byte-level BPE ('gpt2') is "
            "supported"
        )
    pre = metadata.get("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(
            f"unsupported GGUF pre-tokenizer {pre!r}; supported: {sorted(PRE_TOKENIZERS)}"
        )
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if key not in metadata:
            raise ValueError(f"GGUF metadata lacks the required key {key!r}")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    spelling = byte_to_unicode()
    alphabet = set(spelling.values())
    vocab = {}
    for index, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        # Normal tokens must be byte-level spelled for BPE; a few files store raw text instead.
        # Added tokens keep their text, which is what they are matched against.
        if kind not in (_CONTROL, _USER_DEFINED) and not set(token) <= alphabet:
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[token] = index
    merges = []
    for merge in metadata["tokenizer.ggml.merges"]:
        pair = merge.split(" ")
        if len(pair) != 2:
            raise ValueError(f"malformed GGUF merge {merge!r}: expected 'left right'")
        merges.append((pair[0], pair[1]))

    try:
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    except Exception as error:  # tokenizers raises a bare Exception for an inconsistent BPE
        raise ValueError(f"GGUF tokenizer merges and tokens disagree: {error}") from error
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == _CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=True)
            if kind == _USER_DEFINED
        ]
    )
    tokenizer.post_processor = _post_processor(metadata, tokens)
    return tokenizer


def _post_processor(metadata: Mapping[str, Any], tokens: list[str]) -> processors.PostProcessor:
    """Adds bos/eos around encoded text when the file asks for it (llama.cpp's add_*_token)."""
    prefix, suffix = [], []
    if metadata.get("tokenizer.ggml.add_bos_token", False):
        prefix = [_special(metadata, tokens, "bos_token_id")]
    if metadata.get("tokenizer.ggml.add_eos_token", False):
        suffix = [_special(metadata, tokens, "eos_token_id")]
    specials = [(tokens[i], i) for i in dict.fromkeys(prefix + suffix)]

    def around(body: str) -> str:
        return " ".join([*(tokens[i] for i in prefix), body, *(tokens[i] for i in suffix)])

    return processors.TemplateProcessing(
        single=around("$A"), pair=f"{around('$A')} {around('$B:1')}", special_tokens=specials
    )


def _special(metadata: Mapping[str, Any], tokens: list[str], name: str) -> int:
    index = int(metadata.get(f"tokenizer.ggml.{name}", -1))
    if not 0 <= index < len(tokens):
        raise ValueError(f"GGUF tokenizer.ggml.{name}={index} is not a token id (< {len(tokens)})")
    return index


def wrap_tokenizer(tokenizer: Tokenizer, metadata: Mapping[str, Any]) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer around (a copy of) `tokenizer` with the file's special tokens
    and chat template; pad falls back to eos when the file names no padding token."""
    tokens = metadata["tokenizer.ggml.tokens"]
    specials = {}
    for role, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        if f"tokenizer.ggml.{key}" in metadata:
            specials[role] = tokens[_special(metadata, tokens, key)]
    if "pad_token" not in specials and "eos_token" in specials:
        specials["pad_token"] = specials["eos_token"]
    template = metadata.get("tokenizer.chat_template")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        chat_template=template,
        clean_up_tokenization_spaces=False,
        **specials,
    )
