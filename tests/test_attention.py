"""layers.attention: the blockwise path (query blocks, the causal upper triangle skipped) and
the fused one (jax.nn.dot_product_attention), checked in values and gradients against a float64
numpy softmax attention and its hand-written VJP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax.models import layers

B, T, H, KVH, HD = 2, 11, 4, 2, 8
MASKED = -1e30


def _numpy_attention(q, k, v, visible, cot):
    """Masked GQA softmax attention and its VJP in float64: q [B, T, H, hd], k, v [B, KVH, S,
    hd], visible [B, T, S], cot [B, T, H, hd] the output's cotangent -> (out, dq, dk, dv). A
    query with no visible key reads the keys uniformly (the layer's convention)."""
    q, k, v, cot = (np.asarray(x, np.float64) for x in (q, k, v, cot))
    g = q.shape[2] // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # [B, H, S, hd]
    scale = q.shape[-1] ** -0.5
    s = np.einsum("bthd,bhsd->bhts", q, kk) * scale
    s = np.where(visible[:, None], s, MASKED)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhts,bhsd->bthd", p, vv)
    dp = np.einsum("bthd,bhsd->bhts", cot, vv)
    ds = np.where(visible[:, None], p * (dp - (p * dp).sum(-1, keepdims=True)), 0.0) * scale
    dq = np.einsum("bhts,bhsd->bthd", ds, kk)
    dk = np.einsum("bhts,bthd->bhsd", ds, q)
    dv = np.einsum("bhts,bthd->bhsd", p, cot)
    fold = lambda x: x.reshape(x.shape[0], -1, g, *x.shape[2:]).sum(2)  # noqa: E731 heads -> kv
    return out, dq, fold(dk), fold(dv)


def _inputs(s: int, seed: int):
    rng = np.random.RandomState(seed)
    q = rng.standard_normal((B, T, H, HD)).astype(np.float32)
    k, v = (rng.standard_normal((B, KVH, s, HD)).astype(np.float32) for _ in range(2))
    cot = rng.standard_normal((B, T, H, HD)).astype(np.float32)
    return q, k, v, cot


def _causal_visible(s: int, lengths) -> np.ndarray:
    """Causal over the last T of s keys (queries at s - T ..), keys < lengths[b] real."""
    keys, queries = np.arange(s), np.arange(s - T, s)
    return ((keys[None, None, :] <= queries[None, :, None])
            & (keys[None, None, :] < np.asarray(lengths)[:, None, None]))


def _jax_attention(q, k, v, visible, cot, fn=layers.attention, **kwargs):
    """fn(q, k, v, visible, **kwargs) and the gradients of sum(out * cot): (out, dq, dk, dv)."""
    def loss(q, k, v):
        out = fn(q, k, v, jnp.asarray(visible), **kwargs)
        return jnp.sum(out * cot), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return (out, *grads)


@pytest.mark.parametrize("s", [T, T + 5])  # plain causal; the shared-prefix rows' extra keys
@pytest.mark.parametrize("block", [4, 128])
def test_causal_blocks_values_and_gradients_equal_numpy(monkeypatch, s, block):
    # Row 1's keys are real up to 7 (of s): with s = T its queries after 7 are padding; blocks
    # of 4 (4 + 4 + 3 queries) read fewer keys in the first block than in the last.
    monkeypatch.setattr(layers, "CAUSAL_BLOCK", block)
    q, k, v, cot = _inputs(s, 0)
    visible = _causal_visible(s, [s, s - T + 7])
    got = _jax_attention(q, k, v, visible, cot, causal=True, backend="xla")
    want = _numpy_attention(q, k, v, visible, cot)
    real = visible.any(-1)  # [B, T] queries with a visible key: the rest read a block's keys
    np.testing.assert_allclose(np.asarray(got[0])[real], want[0][real], rtol=1e-5, atol=1e-5)
    # Gradients only through the real queries (the padded ones' cotangent zeroed), as a loss
    # reads them; then dq, dk and dv are the reference's wherever they are defined.
    cot = cot * real[:, :, None, None]
    got = _jax_attention(q, k, v, visible, cot, causal=True, backend="xla")
    want = _numpy_attention(q, k, v, visible, cot)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block", [3, 32])
def test_prefill_blocks_equal_numpy_with_empty_rows(monkeypatch, block):
    # A prefill's queries against every key (no causal promise), one query seeing nothing:
    # its output is the uniform mean of the values (finite), the others the reference's.
    monkeypatch.setattr(layers, "PREFILL_BLOCK", block)
    s = 17
    q, k, v, cot = _inputs(s, 1)
    visible = np.random.RandomState(2).rand(B, T, s) < 0.6
    visible[0, 3] = False
    got = _jax_attention(q, k, v, visible, cot, backend="xla")
    want = _numpy_attention(q, k, v, visible, cot)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got[0])[0, 3],
                               np.repeat(v[0].mean(1), H // KVH, axis=0), rtol=1e-5, atol=1e-6)


def test_fused_path_equals_blockwise():
    # The GPU path's call (jax.nn.dot_product_attention, a bias for the mask) run with
    # implementation "xla" on this CPU: the blockwise path's values and gradients.
    s = T + 3
    q, k, v, cot = _inputs(s, 3)
    visible = _causal_visible(s, [s, 9])
    real = visible.any(-1)
    cot = cot * real[:, :, None, None]
    fused = _jax_attention(q, k, v, visible, cot, fn=layers._fused_attention,
                           implementation="xla")
    blockwise = _jax_attention(q, k, v, visible, cot, causal=True, backend="xla")
    for f, b in zip(fused, blockwise):
        np.testing.assert_allclose(np.asarray(f), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_backend_choice():
    # float32 runs the blockwise path everywhere (cuDNN's flash kernel takes 16-bit inputs);
    # a bad override is one line naming it.
    assert layers.attention_backend(jnp.float32) == "xla"
    want = "cudnn" if jax.default_backend() == "gpu" else "xla"
    assert layers.attention_backend(jnp.bfloat16) == want
    try:
        layers.ATTENTION_BACKEND = "flash"
        with pytest.raises(ValueError, match=r"ATTENTION_BACKEND = 'flash' is invalid"):
            layers.attention_backend(jnp.float32)
    finally:
        layers.ATTENTION_BACKEND = None
