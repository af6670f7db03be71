"""Decoder, KVCache and ModelConfig: checked against a plain-numpy reference forward pass."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from starpo_jax.models import Decoder, KVCache, ModelConfig, layers
from starpo_jax.rollout.sampling import generate

TINY = ModelConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rope_theta=500.0,
    attention_bias=True,
    tie_word_embeddings=False,
)


def _random_model(config: ModelConfig, seed: int = 0, value_head: bool = False) -> Decoder:
    """A Decoder with every weight random, norms and biases included (fresh ones are 1 / 0).

    Filled from numpy on an abstract model: no initialiser has to be compiled or dispatched.
    """
    graphdef, state = nnx.split(
        nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0), value_head=value_head))
    )
    rng = np.random.RandomState(seed)
    state = jax.tree.map(lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype), state)
    return nnx.merge(graphdef, state)


# Tests call the model through jit: eager dispatch of every op is slow on a busy CPU.
@nnx.jit
def _forward(
    model: Decoder,
    ids: jax.Array,
    mask: jax.Array | None = None,
    positions: jax.Array | None = None,
) -> jax.Array:
    return model(ids, positions=positions, attention_mask=mask)


@nnx.jit
def _forward_cached(model: Decoder, ids: jax.Array, mask: jax.Array, cache: KVCache):
    return model(ids, attention_mask=mask, cache=cache)


def _numpy_forward(model: Decoder, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Reference logits [T, V] for one unpadded row, in float64, one head at a time."""
    cfg = model.config
    p = {
        k: np.asarray(v, np.float64)
        for k, v in nnx.to_pure_dict(nnx.state(model))["layers"].items()
    }
    embed = np.asarray(model.embed[...], np.float64)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_norm_eps) * w

    def rope(x, pos):  # x [T, hd]: pairs (i, i + hd/2) rotate by pos * theta^(-2i/hd)
        half = cfg.head_dim // 2
        freq = cfg.rope_theta ** (-np.arange(half) * 2.0 / cfg.head_dim)
        ang = pos[:, None] * freq
        a, b = x[:, :half], x[:, half:]
        return np.concatenate(
            [a * np.cos(ang) - b * np.sin(ang), b * np.cos(ang) + a * np.sin(ang)], -1
        )

    t, group = len(ids), cfg.num_heads // cfg.num_kv_heads
    h = embed[ids]
    for i in range(cfg.num_layers):
        x = norm(h, p["attn_norm"][i])
        q = (x @ p["q_proj"][i] + p["q_bias"][i]).reshape(t, cfg.num_heads, cfg.head_dim)
        k = (x @ p["k_proj"][i] + p["k_bias"][i]).reshape(t, cfg.num_kv_heads, cfg.head_dim)
        v = (x @ p["v_proj"][i] + p["v_bias"][i]).reshape(t, cfg.num_kv_heads, cfg.head_dim)
        heads = []
        for head in range(cfg.num_heads):
            qh, kh, vh = (
                rope(q[:, head], positions),
                rope(k[:, head // group], positions),
                v[:, head // group],
            )
            s = qh @ kh.T / np.sqrt(cfg.head_dim) + np.triu(np.full((t, t), -np.inf), 1)
            w = np.exp(s - s.max(-1, keepdims=True))
            heads.append((w / w.sum(-1, keepdims=True)) @ vh)
        h = h + np.concatenate(heads, -1) @ p["o_proj"][i]
        x = norm(h, p["mlp_norm"][i])
        gate = x @ p["gate_proj"][i]
        h = h + (gate / (1 + np.exp(-gate)) * (x @ p["up_proj"][i])) @ p["down_proj"][i]
    h = norm(h, np.asarray(model.final_norm[...], np.float64))
    return h @ np.asarray(model.lm_head[...], np.float64)


@pytest.fixture(scope="module")
def model() -> Decoder:
    return _random_model(TINY)


def test_forward_matches_numpy_reference_on_ragged_batch(model):
    # Row 0 full, row 1 right-padded, row 2 left-padded: real positions must equal the unpadded row.
    rng = np.random.RandomState(0)
    ids = rng.randint(0, TINY.vocab_size, (3, 9))
    mask = np.ones((3, 9), bool)
    mask[1, 6:] = False
    mask[2, :3] = False
    logits = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    assert logits.shape == (3, 9, TINY.vocab_size) and logits.dtype == np.float32
    for row in range(3):
        real = ids[row][mask[row]]
        ref = _numpy_forward(model, real, np.arange(len(real), dtype=np.float64))
        np.testing.assert_allclose(logits[row][mask[row]], ref, atol=2e-4, rtol=1e-4)
    assert np.isfinite(logits).all()  # padding rows with nothing visible stay finite


@pytest.mark.parametrize("block", [4, 8])
def test_causal_query_blocks_match_numpy_reference(model, monkeypatch, block):
    # T = 9 in blocks of 4 (4 + 4 + 1) or 8 (8 + 1): every block reads only the keys up to its
    # last query; the left- and right-padded rows check that padding stays masked across blocks.
    monkeypatch.setattr(layers, "CAUSAL_BLOCK", block)
    rng = np.random.RandomState(1)
    ids = rng.randint(0, TINY.vocab_size, (3, 9))
    mask = np.ones((3, 9), bool)
    mask[1, 5:] = False
    mask[2, :6] = False
    forward = nnx.jit(lambda m, i, k: m(i, attention_mask=k))  # a fresh trace sees the block
    logits = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    for row in range(3):
        real = ids[row][mask[row]]
        ref = _numpy_forward(model, real, np.arange(len(real), dtype=np.float64))
        np.testing.assert_allclose(logits[row][mask[row]], ref, atol=2e-4, rtol=1e-4)
    assert np.isfinite(logits).all()


def test_explicit_positions_shift_rope(model):
    ids = np.random.RandomState(1).randint(0, TINY.vocab_size, (1, 5))
    positions = np.arange(5)[None] + 11
    logits = np.asarray(
        _forward(model, jnp.asarray(ids), positions=jnp.asarray(positions, jnp.int32))
    )
    np.testing.assert_allclose(
        logits[0], _numpy_forward(model, ids[0], positions[0].astype(float)), atol=2e-4, rtol=1e-4
    )


def test_kv_cache_ragged_chunks_then_decode_equal_full_forward(model):
    """Prefill ragged prompts, append a second ragged chunk, decode token by token."""
    rng = np.random.RandomState(2)
    first_len, second_len, decode_steps = [5, 2, 3], [1, 4, 0], 4
    b = len(first_len)
    full = [
        list(rng.randint(0, TINY.vocab_size, first_len[r] + second_len[r] + decode_steps))
        for r in range(b)
    ]

    def block(lengths, offsets, width):
        ids = np.zeros((b, width), np.int32)
        mask = np.zeros((b, width), bool)
        for r in range(b):
            ids[r, : lengths[r]] = full[r][offsets[r] : offsets[r] + lengths[r]]
            mask[r, : lengths[r]] = True
        return jnp.asarray(ids), jnp.asarray(mask)

    cache = KVCache.init(TINY, b, 24)
    got = [[] for _ in range(b)]
    offsets = [0] * b
    for lengths, width in ((first_len, 6), (second_len, 4)) + (([1] * b, 1),) * decode_steps:
        ids, mask = block(lengths, offsets, width)
        logits, cache = _forward_cached(model, ids, mask, cache)
        for r in range(b):
            got[r].extend(np.asarray(logits[r, : lengths[r]]))
            offsets[r] += lengths[r]
    lengths = [len(f) for f in full]
    np.testing.assert_array_equal(np.asarray(cache.end), lengths)
    ids, mask = block(lengths, [0] * b, max(lengths))
    want = np.asarray(_forward(model, ids, mask))
    for r in range(b):
        np.testing.assert_allclose(np.stack(got[r]), want[r, : lengths[r]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [2, 4])
def test_prefill_key_blocks_equal_one_block(model, monkeypatch, block):
    # A ragged 6-token prefill then a 5-token one into a 12-slot cache: keys read in blocks of 2
    # or 4 (the last block moved back over slots already read) up to the fullest row give the
    # logits and cache of one block of all 12 slots.
    rng = np.random.RandomState(3)
    first = jnp.asarray(rng.randint(0, TINY.vocab_size, (3, 6)), jnp.int32)
    second = jnp.asarray(rng.randint(0, TINY.vocab_size, (3, 5)), jnp.int32)
    mask1 = jnp.asarray(np.arange(6) < np.array([[6], [3], [1]]))
    mask2 = jnp.asarray(np.arange(5) < np.array([[2], [5], [4]]))

    def run():
        step = nnx.jit(lambda m, i, k, c: m(i, attention_mask=k, cache=c))  # fresh trace
        logits1, cache = step(model, first, mask1, KVCache.init(TINY, 3, 12))
        logits2, cache = step(model, second, mask2, cache)
        return jax.device_get((logits1, logits2, cache.k, cache.v))

    monkeypatch.setattr(layers, "CACHE_KEY_BLOCK", 100)
    want = run()
    monkeypatch.setattr(layers, "CACHE_KEY_BLOCK", block)
    for got, ref in zip(run(), want):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


def test_bfloat16_cache_decodes_like_float32(model):
    """The cache stored in bfloat16 (attention still in float32): greedy tokens equal, log-probs
    within 0.05 nats (bfloat16 keeps 8 significant bits of every key and value)."""
    ids = jnp.asarray(np.random.RandomState(4).randint(0, TINY.vocab_size, (3, 7)), jnp.int32)
    lengths = jnp.array([7, 4, 2], jnp.int32)
    out = {}
    for dtype in ("float32", "bfloat16"):
        cache = KVCache.init(TINY, 3, 16, dtype)
        out[dtype] = generate(model, ids, lengths, jax.random.key(0), max_new_tokens=5,
                              greedy=True, cache=cache)
    assert out["bfloat16"].cache.k.dtype == jnp.uint16  # bfloat16 bit patterns (cache.py)
    np.testing.assert_array_equal(out["bfloat16"].tokens, out["float32"].tokens)
    np.testing.assert_allclose(out["bfloat16"].logprobs, out["float32"].logprobs,
                               atol=5e-2)


def test_value_head_shape_and_gradient():
    model = _random_model(TINY, value_head=True)
    ids = jnp.asarray(np.random.RandomState(3).randint(0, TINY.vocab_size, (2, 6)))

    @nnx.jit
    def values_and_grads(m, ids):
        def loss(m):
            values = m.value(ids)
            return jnp.mean(values**2), values

        return nnx.grad(loss, has_aux=True)(m)[::-1]

    values, grads = values_and_grads(model, ids)
    assert values.shape == (2, 6) and values.dtype == jnp.float32
    assert float(jnp.abs(grads.value_head[...]).sum()) > 0
    assert float(jnp.abs(grads.layers["q_proj"][...]).sum()) > 0  # flows into the backbone
    no_head = nnx.eval_shape(lambda: Decoder(TINY, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="value_head=True"):
        no_head.value(ids)


def test_jit_with_params_as_arguments_matches_eager(model):
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids):
        return nnx.merge(graphdef, state)(ids)

    ids = jnp.asarray(np.random.RandomState(4).randint(0, TINY.vocab_size, (2, 5)))
    np.testing.assert_allclose(forward(state, ids), _forward(model, ids), atol=1e-5)


def test_remat_recomputes_layers_in_the_backward_pass(model):
    ids = jnp.asarray(np.random.RandomState(6).randint(0, TINY.vocab_size, (2, 6)))
    state = nnx.state(model)

    def matmuls(config):  # lowering only: remat shows as the layer's matmuls run again
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))

        def loss(s):
            return nnx.merge(graphdef, s)(ids).sum()

        return jax.jit(jax.grad(loss)).lower(state).as_text().count("stablehlo.dot_general")

    assert matmuls(dataclasses.replace(TINY, remat=True)) > matmuls(TINY)


def _while_loops(config: ModelConfig, use_cache: bool) -> int:
    """stablehlo.while ops in the lowered forward (lowering only, nothing is compiled)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
    cache = jax.eval_shape(lambda: KVCache.init(config, 2, 8)) if use_cache else None

    def forward(state, ids, cache):
        return nnx.merge(graphdef, state)(ids, cache=cache)

    ids = jax.ShapeDtypeStruct((2, 4), jnp.int32)
    return jax.jit(forward).lower(state, ids, cache).as_text().count("stablehlo.while")


@pytest.mark.parametrize("use_cache", [False, True])
def test_layers_compile_to_one_loop_whatever_the_depth(use_cache):
    # The layer scan; with a cache also the key-block loop of cache_attention inside it.
    counts = [_while_loops(dataclasses.replace(TINY, num_layers=n), use_cache) for n in (2, 8)]
    assert counts == ([2, 2] if use_cache else [1, 1])


def test_bfloat16_runs_close_to_float32(model):
    cfg16 = dataclasses.replace(TINY, dtype="bfloat16", param_dtype="bfloat16")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(cfg16, rngs=nnx.Rngs(0))))
    state = jax.tree.map(lambda new, old: old.astype(new.dtype), state, nnx.state(model))
    model16 = nnx.merge(graphdef, state)
    assert model16.layers.q_proj[...].dtype == jnp.bfloat16
    ids = jnp.asarray(np.random.RandomState(5).randint(0, TINY.vocab_size, (2, 6)))
    out16, out32 = _forward(model16, ids), _forward(model, ids)
    assert out16.dtype == jnp.float32
    scale = float(jnp.abs(out32).max())
    assert float(jnp.abs(out16 - out32).max()) < 0.05 * scale


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_kv_heads=3), "multiple of num_kv_heads (3)"),
        (dict(head_dim=7), "head_dim must be even"),
        (dict(num_layers=0), "num_layers must be a positive int; got 0"),
        (dict(vocab_size=3.5), "vocab_size must be a positive int; got 3.5"),
        (dict(rope_theta=-1.0), "rope_theta must be a positive number"),
        (dict(dtype="float8"), "dtype must be one of"),
        (dict(param_dtype="int8"), "param_dtype must be one of"),
    ],
)
def test_config_rejects_bad_values(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(TINY, **change)


# config.json files as Qwen2.5-0.5B-Instruct and SmolLM2-135M-Instruct ship them (transformers 4.x
# style: top-level rope_theta), and a transformers 5 style one (rope_parameters).
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "vocab_size": 49152,
}


@pytest.mark.parametrize(
    "hf, expected",
    [
        (
            QWEN25_05B,
            dict(
                hidden_size=896,
                num_layers=24,
                num_heads=14,
                num_kv_heads=2,
                head_dim=64,
                rope_theta=1e6,
                attention_bias=True,
                tie_word_embeddings=True,
            ),
        ),
        (
            SMOLLM2_135M,
            dict(
                num_layers=30,
                num_heads=9,
                num_kv_heads=3,
                head_dim=64,
                rope_theta=1e5,
                rms_norm_eps=1e-5,
                attention_bias=False,
                tie_word_embeddings=True,
            ),
        ),
        (
            {
                **SMOLLM2_135M,
                "rope_theta": None,
                "head_dim": 32,
                "tie_word_embeddings": False,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
            },
            dict(head_dim=32, rope_theta=5e5, tie_word_embeddings=False),
        ),
    ],
)
def test_from_hf_config_reads_real_config_files(hf, expected):
    config = ModelConfig.from_hf_config(
        {k: v for k, v in hf.items() if v is not None}, dtype="bfloat16"
    )
    assert {k: getattr(config, k) for k in expected} == expected
    assert config.dtype == "bfloat16" and config.param_dtype == "float32"


def test_qwen25_parameter_count():
    # Qwen2.5-0.5B is published as 0.49B parameters (tied embeddings counted once).
    assert ModelConfig.from_hf_config(QWEN25_05B).num_params == 494_032_768


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(architectures=["GPT2LMHeadModel"]), "unsupported architecture ['GPT2LMHeadModel']"),
        (dict(architectures=[], model_type="mistral"), "unsupported model_type 'mistral'"),
        (
            dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
            "unsupported rope scaling 'yarn'",
        ),
        (dict(rope_interleaved=True), "rope_interleaved=True"),
        (dict(mlp_bias=True), "mlp_bias=True"),
        (
            dict(layer_types=["sliding_attention"] * 30),
            "unsupported layer_types ['sliding_attention']",
        ),
        (dict(num_attention_heads=0), "num_heads must be a positive int; got 0"),
    ],
)
def test_from_hf_config_rejects_unsupported(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig.from_hf_config({**SMOLLM2_135M, **change})


def test_from_hf_config_rejects_unknown_override():
    with pytest.raises(ValueError, match=re.escape("unknown ModelConfig override(s) ['dtyp']")):
        ModelConfig.from_hf_config(SMOLLM2_135M, dtyp="bfloat16")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0, max_len=4), "batch_size must be a positive int; got 0"),
        (dict(batch_size=2, max_len=-1), "max_len must be a positive int; got -1"),
    ],
)
def test_cache_init_rejects_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        KVCache.init(TINY, **kwargs)


def test_call_rejects_mismatched_shapes(model):
    ids = jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(
        ValueError, match=r"attention_mask must have the shape of input_ids \(2, 5\)"
    ):
        model(ids, attention_mask=jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match="cache batch size 3 != input_ids batch size 2"):
        model(ids, cache=KVCache.init(TINY, 3, 8))


@pytest.mark.parametrize("t", [1, 5])
def test_float32_queries_read_bfloat16_keys_at_float32_precision(t):
    """Attention of float32 queries over bfloat16 keys and values (a bfloat16 cache; t = 1 is a
    decode step) reads them as stored yet matches float64 attention over the widened values to
    float32 precision: a plain bfloat16 product would round the queries to 8 bits."""
    rng = np.random.default_rng(5)
    b, h, kvh, s, hd = 2, 6, 2, 40, 16
    q = rng.standard_normal((b, t, h, hd)).astype(np.float32)
    k, v = (jnp.asarray(rng.standard_normal((b, kvh, s, hd)), jnp.bfloat16) for _ in range(2))
    visible = rng.random((b, t, s)) < 0.7
    visible[..., 0] = True
    got = np.asarray(layers.attention(jnp.asarray(q), k, v, jnp.asarray(visible)))

    def reference(q):
        kk, vv = (np.asarray(x.astype(jnp.float32), np.float64) for x in (k, v))
        out = np.zeros((b, t, h, hd))
        for r, i, j in np.ndindex(b, t, h):
            g = j // (h // kvh)
            scores = np.where(visible[r, i], kk[r, g] @ q[r, i, j] / np.sqrt(hd), -np.inf)
            p = np.exp(scores - scores.max())
            out[r, i, j] = (p / p.sum()) @ vv[r, g]
        return out

    want = reference(q.astype(np.float64))
    tolerance = 2e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    rounded = np.asarray(jnp.asarray(q, jnp.bfloat16).astype(jnp.float32), np.float64)
    assert np.abs(reference(rounded) - want).max() > 10 * tolerance  # what the test rules out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("block", [3, 4, 32])
@pytest.mark.parametrize("queries", [1, 3])
def test_cache_attention_over_filled_blocks_equals_one_softmax(monkeypatch, dtype, block,
                                                               queries):
    """A decode step (1 query a row) or a prefill (3, each seeing the slots up to its own) reads
    the cache in key blocks up to the fullest row (block 4 of 10 slots moves its last block
    back over slots already read; 32 is one block): the result is one softmax over the visible
    slots of the whole layer, as `attention`'s unblocked one."""
    rng = np.random.default_rng(6)
    layers_n, b, kvh, h, slots, hd = 2, 3, 2, 4, 10, 8
    stored = []
    for _ in range(2):
        values = jnp.asarray(rng.standard_normal((layers_n, b, kvh, slots, hd)), dtype)
        if dtype == "bfloat16":  # stored as bit patterns, as KVCache does
            values = jax.lax.bitcast_convert_type(values, jnp.uint16)
        stored.append(values)
    filled = np.array([7, 3, 9])  # each query sees a slot (else: uniform over what is read)
    last = filled[:, None] - queries + np.arange(queries)  # [B, T] the slot of each query
    visible = jnp.asarray(np.arange(slots)[None, None, :] <= last[:, :, None])
    q = jnp.asarray(rng.standard_normal((b, queries, h, hd)), jnp.float32)
    monkeypatch.setattr(layers, "CACHE_KEY_BLOCK", block)
    bound = layers.filled_bound(visible)
    assert int(bound) == 9
    got = layers.cache_attention(q, *stored, jnp.int32(1), visible, bound)
    want = layers.attention(q, *(layers._values(s[1]) for s in stored), visible)
    # bfloat16 values: both sides take the products at ~16 bits of the float32 side (_dot_f32).
    atol = 1e-6 if dtype == "float32" else 1e-5
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=atol)
