"""Token id -> the UTF-8 bytes it contributes to decoded text, as dense arrays for JAX.

Built once on the host from a Hugging Face tokenizer, so that code inside jit (stop strings,
action parsing) can turn generated ids into text bytes with a gather.

Supported decoders (the `decoder` of the tokenizer's `tokenizer.json`):
- `ByteLevel` (GPT-2, Qwen2, SmolLM2, Llama 3): every char of a token maps through the GPT-2
  bytes<->unicode table; a token with a char outside that table decodes to its own UTF-8 bytes
  (this is what `tokenizers` does, e.g. for added tokens containing a plain space).
- SentencePiece style, a `Sequence` of `Replace`/`ByteFallback`/`Fuse`/`Strip`, or `Metaspace`:
  `▁` becomes a space and `<0xNN>` tokens become the single byte NN. Their `Strip`/prefix rule
  removes one leading space of the *whole* text, which no per-token table can express: the
  table gives a token's bytes in the middle of a text (`▁Hello` -> b" Hello").
Added and special tokens go through the same decoder as `tokenizers` does (for ByteLevel
tokenizers this yields their content, e.g. `<|im_end|>`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import weakref
from typing import Any

import numpy as np

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclasses.dataclass(frozen=True)
class TokenBytes:
    """Per-token byte strings, padded.

    bytes:   [V, Lmax] uint8, row i holds token i's bytes in [0, lengths[i]), zeros after.
    lengths: [V] int32.
    """

    bytes: np.ndarray
    lengths: np.ndarray

    @property
    def vocab_size(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def max_len(self) -> int:
        return int(self.bytes.shape[1])

    def decode(self, ids: Any) -> bytes:
        """Host-side reference: concatenated bytes of a 1-D id sequence."""
        return b"".join(self.bytes[i, : self.lengths[i]].tobytes() for i in np.asarray(ids))


@functools.cache
def gpt2_unicode_to_byte() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, inverted: printable char -> the byte it stands for.

    Bytes that are printable and not whitespace in Latin-1 stand for themselves; the other 68
    bytes are given the chars 256, 257, ... in byte order.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _byte_level(token: str) -> bytes:
    table = gpt2_unicode_to_byte()
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode("utf-8")


def _sentencepiece_rule(decoder: dict) -> tuple[list[tuple[str, str]], bool]:
    """(string replacements, byte fallback on?) of a SentencePiece-style decoder description."""
    steps = decoder["decoders"] if decoder["type"] == "Sequence" else [decoder]
    replacements: list[tuple[str, str]] = []
    byte_fallback = False
    for step in steps:
        kind = step["type"]
        if kind == "Replace":
            pattern = step["pattern"]
            if "String" not in pattern:
                raise ValueError(
                    f"Replace decoder with a regex pattern {pattern!r} is not supported"
                )
            replacements.append((pattern["String"], step["content"]))
        elif kind == "Metaspace":
            replacements.append((step.get("replacement", "▁"), " "))
        elif kind == "ByteFallback":
            byte_fallback = True
        elif kind in ("Fuse", "Strip"):
            continue  # whole-text operations: see the module docstring
        else:
            raise ValueError(
                f"unsupported decoder step {kind!r}; supported: ByteLevel, or a Sequence of "
                "Replace/ByteFallback/Fuse/Strip/Metaspace"
            )
    return replacements, byte_fallback


def _backend_json(tokenizer: Any) -> tuple[Any, dict]:
    """The `tokenizers.Tokenizer` behind a transformers tokenizer (or itself) and its JSON."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not hasattr(backend, "to_str"):
        raise TypeError(
            "token_byte_table needs a fast (tokenizers-backed) tokenizer; "
            f"got {type(tokenizer).__name__}"
        )
    return backend, json.loads(backend.to_str())


def token_byte_table(tokenizer: Any, vocab_size: int | None = None) -> TokenBytes:
    """Builds the token -> bytes table of a tokenizer.

    tokenizer: a transformers fast tokenizer or a `tokenizers.Tokenizer`.
    vocab_size: rows of the table (>= the tokenizer's largest id + 1), e.g. the model's
      embedding size, which may exceed the tokenizer's; ids without a token get length 0.
    Returns TokenBytes with bytes [V, Lmax] uint8 and lengths [V] int32.
    """
    backend, spec = _backend_json(tokenizer)
    vocab = backend.get_vocab(with_added_tokens=True)
    size = max(vocab.values()) + 1
    if vocab_size is not None:
        if vocab_size < size:
            raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer's {size} ids")
        size = vocab_size
    decoder = spec.get("decoder")
    if decoder is None:
        raise ValueError(
            "the tokenizer has no decoder; cannot tell which bytes its tokens stand for"
        )
    if decoder["type"] == "ByteLevel":
        to_bytes = _byte_level
    else:
        replacements, byte_fallback = _sentencepiece_rule(decoder)

        def to_bytes(token: str) -> bytes:
            match = _BYTE_FALLBACK.match(token) if byte_fallback else None
            if match:
                return bytes([int(match.group(1), 16)])
            for old, new in replacements:
                token = token.replace(old, new)
            return token.encode("utf-8")

    pieces = [b""] * size
    for token, index in vocab.items():
        pieces[index] = to_bytes(token)
    width = max(1, max(len(p) for p in pieces))
    table = np.zeros((size, width), np.uint8)
    lengths = np.zeros((size,), np.int32)
    for index, piece in enumerate(pieces):
        table[index, : len(piece)] = np.frombuffer(piece, np.uint8)
        lengths[index] = len(piece)
    return TokenBytes(bytes=table, lengths=lengths)


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_token_byte_table(tokenizer: Any) -> TokenBytes:
    """`token_byte_table(tokenizer)`, built once per tokenizer (again if tokens were added):
    the JAX envs' codec and the host envs' text share one table per tokenizer."""
    size, table = _TABLES.get(tokenizer, (None, None))
    if size != len(tokenizer):
        table = token_byte_table(tokenizer)
        _TABLES[tokenizer] = (len(tokenizer), table)
    return table
