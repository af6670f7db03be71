"""A small Qwen2-style tokenizer built in memory, for tests of the text codec.

Byte-level BPE trained on prompt-like text, with Qwen2's pre-tokenizer regex (one punctuation
char may lead a word, digits split one by one, punctuation runs absorb newlines), an NFC
normalizer and a ChatML chat template, so the codec is exercised on a tokenizer whose
pre-tokenization differs from SmolLM2's GPT-2 style one.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _corpus(
    symbol_sets: tuple[tuple[str, ...], ...], extra: tuple[str, ...], seed: int
) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = list(extra)
    for symbols in symbol_sets:
        for _ in range(200):
            rows, cols = rng.integers(1, 9, 2)
            grid = rng.choice(len(symbols), (rows, cols))
            texts.append(
                "State:\n" + "\n".join("".join(symbols[i] for i in row) for row in grid) + "\nYou"
            )
    texts += [
        f"Turn {rng.integers(0, 30)}: Reward:\n{rng.uniform(-20, 20):.2f}\n" for _ in range(200)
    ]
    return texts


@functools.cache
def qwen_style_tokenizer(
    symbol_sets: tuple[tuple[str, ...], ...],
    extra: tuple[str, ...],
    *,
    vocab_size: int = 1200,
    seed: int = 0,
) -> PreTrainedTokenizerFast:
    """Trains a Qwen2-style byte-level BPE on grids of `symbol_sets` plus the `extra` texts
    (once per process for the same arguments)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(symbol_sets, extra, seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=CHATML,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL[1:]),
    )


@functools.cache
def smollm2_tokenizer() -> Any:
    """The embedded SmolLM2 tokenizer, loaded once per process.

    It is also tiny-random's tokenizer: `load_pretrained("tiny-random")` pairs a random model
    with this same loader's result; loading it alone skips initialising that model.
    """
    from starpo_jax.models.embedded import embedded_gguf_path
    from starpo_jax.models.gguf import load_gguf_tokenizer

    return load_gguf_tokenizer(embedded_gguf_path())
