"""generate(): sampling math against numpy, KV-cache decoding against full forwards, stops."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from starpo_jax.models.config import ModelConfig
from starpo_jax.models.decoder import Decoder
from starpo_jax.models.cache import KVCache
from starpo_jax.rollout.sampling import (SamplingOptions, StopReason, generate, generate_pure,
                                         sample_tokens, token_logprob, truncated_logits)
from starpo_jax.text.stops import advance_stop_tail, stop_tail_width
from starpo_jax.text.token_bytes import TokenBytes

VOCAB = 48
# Big init so that a random model's greedy/sampled text varies instead of repeating one token.
CONFIG = ModelConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    initializer_range=0.4,
)
# A synthetic tokenizer: token i stands for PIECES[i]; a few pieces hold a whole stop string.
PIECES = [c for c in "ab</>\n ns"] + [
    "</",
    "an",
    "sw",
    "er>",
    "ab<",
    "/answer",
    ">\n",
    "</answer>\nx",
]
PIECES += [f"{c}{d}" for c in "ab<" for d in "xyz/"] + ["é", "🙂", "w", "e", "r", "<a"]
PIECES = (PIECES + ["q"] * VOCAB)[:VOCAB]


def _table(pieces: list[str]) -> TokenBytes:
    encoded = [p.encode() for p in pieces]
    table = np.zeros((len(encoded), max(map(len, encoded))), np.uint8)
    for i, e in enumerate(encoded):
        table[i, : len(e)] = np.frombuffer(e, np.uint8)
    return TokenBytes(bytes=table, lengths=np.array([len(e) for e in encoded], np.int32))


TABLE = _table(PIECES)


@pytest.fixture(scope="module")
def model() -> Decoder:
    return Decoder(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def prompts() -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(0).integers(0, VOCAB, (3, 6)).astype(np.int32)
    return ids, np.array([6, 2, 4], np.int32)


# ---------------------------------------------------------------- sampling math vs numpy


def _np_support(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Reference: the boolean support of HF-style temperature -> top-k -> top-p, one row."""
    x = logits / temperature
    keep = np.ones_like(x, bool)
    if top_k:
        keep &= x >= np.sort(x)[::-1][min(top_k, len(x)) - 1]
    if top_p < 1:
        order = np.argsort(-x)
        order = order[keep[order]]
        p = np.exp(x[order] - x[order].max())
        p /= p.sum()
        before = np.cumsum(p) - p
        keep = np.zeros_like(keep)
        keep[order[before < top_p]] = True
    return keep


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [
        (1.0, 0, 1.0),
        (0.7, 5, 1.0),
        (1.0, 0, 0.9),
        (1.3, 0, 0.5),
        (1.0, 8, 0.8),
        (0.5, 1, 1.0),
        (1.0, 100, 0.3),
        (2.0, 0, 0.999),
    ],
)
def test_truncated_logits_match_numpy(temperature, top_k, top_p):
    logits = np.random.default_rng(1).normal(size=(4, 40)).astype(np.float32) * 3
    out = np.asarray(
        truncated_logits(jnp.asarray(logits), temperature=temperature, top_k=top_k, top_p=top_p)
    )
    for row, got in zip(logits, out):
        keep = _np_support(row, temperature, top_k, top_p)
        np.testing.assert_array_equal(np.isfinite(got), keep)
        np.testing.assert_allclose(got[keep], row[keep] / temperature, rtol=1e-6)
        if top_p < 1:  # the kept mass reaches top_p, and would not without its least token
            p = np.exp(row / temperature - (row / temperature).max())
            p = p / p.sum()
            if top_k:
                p = (
                    np.where(_np_support(row, temperature, top_k, 1.0), p, 0)
                    / p[_np_support(row, temperature, top_k, 1.0)].sum()
                )
            assert p[keep].sum() >= top_p - 1e-6
            assert p[keep].sum() - p[keep].min() < top_p


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (dict(), [0.5, 0.3, 0.15, 0.05]),
        (dict(top_p=0.8), [0.625, 0.375, 0, 0]),  # 0.5 < 0.8 <= 0.5 + 0.3
        (dict(temperature=0.5, top_k=3), np.array([0.25, 0.09, 0.0225, 0]) / 0.3625),
    ],
)
def test_sampling_frequencies_follow_the_truncated_softmax(options, expected):
    batch = jnp.tile(jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05])), (20000, 1))
    tokens = sample_tokens(jax.random.key(3), batch, SamplingOptions(max_new_tokens=1, **options))
    counts = np.bincount(np.asarray(tokens), minlength=4)
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.015)


def test_a_key_draws_the_same_tokens_whatever_the_rounding_of_the_logits():
    """The sampled token survives the ~1e-6 rounding by which the same logits differ between
    layouts (one device, a mesh, two processes: tests/test_multihost.py). On a flat 49152-token
    distribution, as tiny-random's, an inverse CDF over a float32 cumulative sum moved ~3 in
    1000 picks by a token id or more under such noise (and so changed whole replies)."""
    logits = jax.random.normal(jax.random.key(0), (512, 49152)) * 0.1
    noise = jax.random.normal(jax.random.key(1), logits.shape) * 1e-6
    options = SamplingOptions(max_new_tokens=1)
    for seed in range(5):
        key = jax.random.key(10 + seed)
        np.testing.assert_array_equal(sample_tokens(key, logits, options),
                                      sample_tokens(key, logits + noise, options))


def test_low_temperature_is_greedy_and_logprobs_match_numpy():
    logits = jax.random.normal(jax.random.key(0), (16, 30)) * 2
    cold = SamplingOptions(max_new_tokens=1, temperature=1e-4)
    greedy = SamplingOptions(max_new_tokens=1, greedy=True)
    argmax = np.argmax(np.asarray(logits), -1)
    np.testing.assert_array_equal(sample_tokens(jax.random.key(1), logits, cold), argmax)
    np.testing.assert_array_equal(sample_tokens(jax.random.key(1), logits, greedy), argmax)
    x = np.asarray(logits, np.float64) / 0.7
    ref = x[np.arange(16), argmax] - np.log(np.exp(x).sum(-1))
    logp, entropy = token_logprob(logits, jnp.asarray(argmax), 0.7)
    np.testing.assert_allclose(logp, ref, rtol=1e-5)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(entropy, -(p * np.log(p)).sum(-1), rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=0.0), "greedy=True"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(stop=("",)), "stop"),
        (dict(stop="</answer>"), "tuple"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingOptions(**{"max_new_tokens": 4, **kwargs})


# ---------------------------------------------------------------- stop strings on bytes


def _first_stop(pieces: list[bytes], stops: tuple[str, ...]) -> int | None:
    """Reference: index of the first token after which the generated text contains a stop."""
    text = b""
    for i, piece in enumerate(pieces):
        text += piece
        if any(s.encode() in text for s in stops):
            return i
    return None


@pytest.mark.parametrize("stops", [("</answer>",), ("</answer>", "ab"), ("\n",), ("🙂x", "é")])
def test_stop_tail_matches_python_substring_search(stops):
    rng = np.random.default_rng(len(stops))
    sequences = rng.integers(0, VOCAB, (64, 12)).astype(np.int32)
    # Plant stop strings split over tokens and inside one token in some rows.
    sequences[0, 3:7] = [PIECES.index(p) for p in ("</", "an", "sw", "er>")]
    sequences[1, 5] = PIECES.index("</answer>\nx")
    tail = jnp.full((64, stop_tail_width(stops)), -1, jnp.int32)
    stopped = np.full(64, -1)
    table = (jnp.asarray(TABLE.bytes), jnp.asarray(TABLE.lengths))
    for i in range(12):
        hit, tail = advance_stop_tail(tail, jnp.asarray(sequences[:, i]), *table, stops)
        stopped = np.where((stopped < 0) & np.asarray(hit), i, stopped)
    for row, got in zip(sequences, stopped):
        want = _first_stop([PIECES[t].encode() for t in row], stops)
        assert got == (-1 if want is None else want), [PIECES[t] for t in row]


# ---------------------------------------------------------------- generate with the model


REF_LEN = 24  # full forwards run on one padded length, so they compile once


@functools.partial(jax.jit, static_argnums=1)
def _full_logits(params: nnx.State, graphdef: nnx.GraphDef, ids: jax.Array) -> jax.Array:
    return nnx.merge(graphdef, params)(ids)


def _forward(model: Decoder, seq: list[int]) -> np.ndarray:
    """Logits [len(seq), V] of one cache-free forward (right padding cannot leak back: causal)."""
    graphdef, params = nnx.split(model)
    padded = np.zeros((1, REF_LEN), np.int32)
    padded[0, : len(seq)] = seq
    return np.asarray(
        _full_logits(params, graphdef, jnp.asarray(padded))[0, : len(seq)], np.float64
    )


def _reference_greedy(model: Decoder, prompt: list[int], n: int) -> list[int]:
    """Argmax decoding by repeated full forwards without a cache."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(_forward(model, seq)[-1])))
    return seq[len(prompt) :]


def test_greedy_with_cache_equals_full_forwards_on_ragged_prompts(model, prompts):
    ids, lengths = prompts
    out = generate(model, ids, lengths, jax.random.key(0), max_new_tokens=6, greedy=True)
    for b in range(3):
        assert out.tokens[b].tolist() == _reference_greedy(model, ids[b, : lengths[b]].tolist(), 6)
    np.testing.assert_array_equal(out.lengths, 6)
    np.testing.assert_array_equal(out.stop_reason, StopReason.BUDGET)
    np.testing.assert_array_equal(out.cache.end, lengths + 6)


def test_logprobs_and_entropy_are_those_of_a_full_forward(model, prompts):
    ids, lengths = prompts
    out = generate(model, ids, lengths, jax.random.key(5), max_new_tokens=5, temperature=0.8)
    for b in range(3):
        seq = np.concatenate([ids[b, : lengths[b]], np.asarray(out.tokens[b])])
        logits = _forward(model, seq.tolist())[lengths[b] - 1 : -1]
        x = logits / 0.8
        logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
        np.testing.assert_allclose(out.logprobs[b], logp[np.arange(5), seq[lengths[b] :]],
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out.entropy[b], -(np.exp(logp) * logp).sum(-1), rtol=1e-4,
                                   atol=1e-5)


def test_continuing_a_cache_equals_the_concatenated_prompt(model, prompts):
    ids, lengths = prompts
    first = generate(model, ids, lengths, jax.random.key(1), max_new_tokens=3, max_len=24)
    chunk = np.random.default_rng(2).integers(0, VOCAB, (3, 4)).astype(np.int32)
    chunk_lengths = np.array([1, 4, 3], np.int32)
    cont = generate(
        model,
        chunk,
        chunk_lengths,
        jax.random.key(7),
        max_new_tokens=5,
        greedy=True,
        cache=first.cache,
    )
    for b in range(3):
        whole = (
            ids[b, : lengths[b]].tolist()
            + first.tokens[b].tolist()
            + chunk[b, : chunk_lengths[b]].tolist()
        )
        assert cont.tokens[b].tolist() == _reference_greedy(model, whole, 5)
    np.testing.assert_array_equal(cont.cache.end, lengths + 3 + chunk_lengths + 5)


def test_same_key_same_tokens_other_key_other_tokens(model, prompts):
    ids, lengths = prompts

    def run(seed: int) -> jax.Array:
        return generate(model, ids, lengths, jax.random.key(seed), max_new_tokens=8).tokens

    np.testing.assert_array_equal(run(11), run(11))
    assert not np.array_equal(run(11), run(12))


def test_stops_on_strings_eos_and_budget(model, prompts):
    """Stopping keeps the sampled prefix: same key, same draws until the stop."""
    ids, lengths = prompts
    key = jax.random.key(4)
    free = np.asarray(generate(model, ids, lengths, key, max_new_tokens=12).tokens)
    # A stop string that the free run contains, across a token boundary in row 0.
    text0 = [PIECES[t].encode() for t in free[0]]
    stop = ((text0[2] + text0[3]).decode(errors="ignore")[-2:] or "q",)
    eos = (int(free[1, 4]),)
    out = generate(
        model,
        ids,
        lengths,
        key,
        max_new_tokens=12,
        stop=stop,
        eos_ids=eos,
        token_bytes=TABLE,
        pad_id=-1,
    )
    for b in range(3):
        pieces = [PIECES[t].encode() for t in free[b]]
        at_stop = _first_stop(pieces, stop)
        at_eos = next((i for i, t in enumerate(free[b]) if t == eos[0]), None)
        end = min(i for i in (at_stop, at_eos, 11) if i is not None)
        reason = (
            StopReason.EOS
            if end == at_eos
            else StopReason.STOP_STRING
            if end == at_stop
            else StopReason.BUDGET
        )
        assert int(out.lengths[b]) == end + 1
        assert int(out.stop_reason[b]) == reason
        np.testing.assert_array_equal(out.tokens[b, : end + 1], free[b, : end + 1])
        assert np.all(np.asarray(out.tokens[b, end + 1 :]) == -1)
        assert np.all(np.asarray(out.logprobs[b, end + 1 :]) == 0)
    assert int(out.stop_reason[0]) in (StopReason.STOP_STRING, StopReason.EOS)
    assert int(out.stop_reason[1]) == StopReason.EOS or int(out.lengths[1]) <= 5
    np.testing.assert_array_equal(out.cache.end, lengths + np.asarray(out.lengths))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(prompt_lengths=np.array([0, 2, 4])), "prompt_lengths"),
        (dict(max_len=8), "slots"),
        (dict(stop=("x",), token_bytes=_table(PIECES[:10])), "vocab_size"),
    ],
)
def test_bad_inputs_are_named(model, prompts, kwargs, message):
    ids, lengths = prompts
    args = {"prompt_lengths": lengths, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate(
            model, ids, args.pop("prompt_lengths"), jax.random.key(0), max_new_tokens=4, **args
        )


# ---------------------------------------------------------------- embedded SmolLM2 vs transformers

CHAT = (
    "<|im_start|>system\nYou're a helpful assistant.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about ice.",
    "You are in a 4x4 grid world. Which action moves you Up? Answer with one word.",
]


@pytest.mark.slow  # minutes on a 2-core CPU: the slow tier (README)
@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_embedded_smollm2_greedy_text_equals_transformers(monkeypatch):
    import torch

    from starpo_jax.models import load_pretrained
    from starpo_jax.models.embedded import embedded_gguf_path
    from helpers.hf_reference import transformers_from_gguf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_pretrained("smollm2-135m-instruct")
    encoded = [tokenizer.encode(CHAT.format(q), add_special_tokens=False) for q in QUESTIONS]
    width = max(map(len, encoded))
    ids = np.array([e + [0] * (width - len(e)) for e in encoded], np.int32)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = generate(
        model,
        ids,
        np.array(list(map(len, encoded))),
        jax.random.key(0),
        max_new_tokens=32,
        greedy=True,
        eos_ids=(eos,),
    )
    ours = [tokenizer.decode(out.tokens[b, : out.lengths[b]].tolist()) for b in range(len(encoded))]

    reference = transformers_from_gguf(embedded_gguf_path())[0]
    left = torch.tensor([[0] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    with torch.inference_mode():
        full = reference.generate(
            input_ids=left,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=32,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    theirs = []
    for row in full[:, width:].tolist():
        theirs.append(tokenizer.decode(row[: row.index(eos) + 1] if eos in row else row))
    assert ours == theirs
    assert all(len(text) > 10 for text in ours)


def test_inactive_rows_sample_nothing_and_the_active_rows_are_unchanged(model, prompts):
    """generate_pure(active=...): the rows not active get length 0 and pad tokens, the loop
    ends with the active rows (their cache ends after the prompt), and the active rows' tokens
    and log-probs are those of the run where every row samples (each row draws its own
    numbers)."""
    ids, lengths = prompts
    graphdef, params = nnx.split(model)
    options = SamplingOptions(max_new_tokens=7, temperature=1.0, eos_ids=(3,), pad_id=0)

    @jax.jit
    def run(active):
        cache = KVCache.init(CONFIG, 3, 24)
        return generate_pure(graphdef, params, jnp.asarray(ids), jnp.asarray(lengths),
                             jax.random.key(9), cache, None, options, active)

    every = run(jnp.ones((3,), bool))
    some = run(jnp.array([True, False, True]))
    for b in (0, 2):
        np.testing.assert_array_equal(some.tokens[b], every.tokens[b])
        np.testing.assert_allclose(some.logprobs[b], every.logprobs[b], rtol=1e-6, atol=1e-7)
        assert int(some.lengths[b]) == int(every.lengths[b])
    assert int(every.lengths[1]) > 0  # row 1 would have sampled
    assert int(some.lengths[1]) == 0 and int(some.stop_reason[1]) == StopReason.BUDGET
    np.testing.assert_array_equal(some.tokens[1], 0)
    assert int(some.cache.end[1]) == int(lengths[1])
    none = run(jnp.zeros((3,), bool))
    np.testing.assert_array_equal(none.lengths, 0)


@pytest.mark.parametrize("chunk", [2, 4, 32])
def test_prefill_in_chunks_equals_one_call(model, prompts, monkeypatch, chunk):
    """jax_env.prefill_cache appends a message in chunks of PREFILL_CHUNK tokens, only as many
    as the longest row needs (ragged counts, one row 0): the cache's filled slots and ends are
    those of one model call over the whole message; all counts 0 leave the cache as it was."""
    from starpo_jax.rollout import jax_env
    ids, lengths = prompts
    first = generate(model, ids, lengths, jax.random.key(1), max_new_tokens=2, max_len=24).cache
    message = np.random.default_rng(3).integers(0, VOCAB, (3, 7)).astype(np.int32)
    counts = np.array([7, 0, 5], np.int32)
    mask = np.arange(7)[None] < counts[:, None]
    _, want = model.hidden_states(jnp.asarray(message), attention_mask=jnp.asarray(mask),
                                  cache=first)
    monkeypatch.setattr(jax_env, "PREFILL_CHUNK", chunk)
    got = jax.jit(lambda c: jax_env.prefill_cache(model, jnp.asarray(message),
                                                  jnp.asarray(counts), c))(first)
    np.testing.assert_array_equal(got.end, first.end + counts)
    for b in range(3):
        end = int(got.end[b])
        for g, w in ((got.k, want.k), (got.v, want.v)):
            np.testing.assert_allclose(g[:, b, :, :end], w[:, b, :, :end], rtol=1e-5, atol=1e-6)
    same = jax.jit(lambda c: jax_env.prefill_cache(model, jnp.asarray(message),
                                                   jnp.zeros((3,), jnp.int32), c))(first)
    for g, w in ((same.k, first.k), (same.v, first.v), (same.end, first.end)):
        np.testing.assert_array_equal(g, w)
