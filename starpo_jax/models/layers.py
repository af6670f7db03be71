"""The pieces of one Qwen2 / Llama decoder layer, and the stack of layers run with one scan.

The layer math is written as pure functions of arrays; `LayerStack` holds every weight stacked
along a leading [num_layers] axis and runs the layers with `jax.lax.scan`, so the compiled
program holds one copy of the layer whatever the depth. Weights are stored in `[in, out]` layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from starpo_jax.models.config import ModelConfig

# Finite stand-in for -inf in attention scores: a query with no visible key (a padding row)
# then gets a uniform softmax instead of NaNs that would poison gradients through `where`.
_MASKED = -1e30


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis in float32: x [..., D], weight [D] -> [..., D] in x.dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """Rotary cos and sin for integer positions [B, T] -> two float32 [B, T, head_dim].

    Frequencies are theta^(-2i/head_dim), repeated twice along the last axis (the
    Hugging Face "rotate_half" layout: the first half of a head pairs with the second half).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x [B, T, heads, head_dim] by cos/sin [B, T, head_dim] (computed in float32)."""
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


#: Query block of causal attention without a cache: block i reads only keys [0, end of block i).
CAUSAL_BLOCK = 128
#: Query block of a prefill into a cache: its [B, KVH, G, block, S] scores are all that exist at
#: once. SmolLM2 at B = 128, L = 1732 (a 216-token environment message): 1.7 GB of float32
#: scores per copy unblocked; XLA's plan of the whole step shrinks by 0.48 GiB from 64 to 32.
PREFILL_BLOCK = 32


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array, causal: bool = False
) -> jax.Array:
    """Grouped-query softmax attention.

    q [B, T, H, hd]; k, v [B, S, KVH, hd] with H a multiple of KVH (query head h reads kv head
    h // (H // KVH)); visible [B, T, S] bool. Scores and softmax in float32. -> [B, T, H, hd].

    `causal=True` promises that query t sees no key s > t (S == T, no cache): the queries then
    go in blocks of CAUSAL_BLOCK, each against only the keys up to its last query, which skips
    the upper triangle (about half the work and of the saved probabilities at T = 512, more
    than half the time of SmolLM2's attention forward+backward; measured in
    experiments/bench_sampler.py's training row). A query with no visible key (padding) gets a
    uniform softmax over the keys its block reads instead of over all of them.
    Otherwise (a prefill into a cache) the queries go in blocks of PREFILL_BLOCK against all
    keys: each query's softmax is its own, so the result is the unblocked one.
    """
    b, t, h, hd = q.shape
    kvh = k.shape[2]
    if t == 1:
        q1 = q.reshape(b, kvh, h // kvh, hd)
        return _attention_one_query(q1, k, v, visible[:, 0]).reshape(b, 1, h, hd)
    # Heads ahead of positions, so both products are plain batched matmuls over (B, KVH).
    qh = q.reshape(b, t, kvh, h // kvh, hd).transpose(0, 2, 3, 1, 4)  # [B, KVH, G, T, hd]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, KVH, S, hd]
    if causal:
        bounds = [(i, min(i + CAUSAL_BLOCK, t), min(i + CAUSAL_BLOCK, t))
                  for i in range(0, t, CAUSAL_BLOCK)]
    else:
        bounds = [(i, min(i + PREFILL_BLOCK, t), k.shape[1]) for i in range(0, t, PREFILL_BLOCK)]
    outs = []
    for start, stop, keys in bounds:
        scores = jnp.einsum("bkgtd,bksd->bkgts", qh[:, :, :, start:stop], kh[:, :, :keys],
                            preferred_element_type=jnp.float32) * (hd**-0.5)
        seen = visible[:, None, None, start:stop, :keys]
        probs = jax.nn.softmax(jnp.where(seen, scores, _MASKED), axis=-1).astype(v.dtype)
        outs.append(jnp.einsum("bkgts,bksd->bkgtd", probs, vh[:, :, :keys],
                               preferred_element_type=jnp.float32))
    out = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd).astype(q.dtype)


def _attention_one_query(
    q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array
) -> jax.Array:
    """Decode-step attention: q [B, KVH, G, hd]; k, v [B, S, KVH, hd]; visible [B, S] bool.

    Returns [B, KVH, G, hd]. Scores and softmax in float32.

    Written as broadcast products and reductions over the cache in its stored [B, S, KVH, hd]
    layout: the dot_general form transposes each layer's whole cache slice into
    [B, KVH, S, hd] on every step (SmolLM2-135M, batch 32: ~20% of a decode step; best of 16
    alternated steps ~0.68 s -> ~0.49 s without it, loaded 2-core VM). A single query row has
    no matmul to gain from.
    """
    hd = q.shape[-1]
    q32 = q.astype(jnp.float32)
    # [B, S, KVH, G]: the softmax runs over S (axis 1), with no transpose of k or v.
    scores = jnp.sum(q32[:, None] * k.astype(jnp.float32)[:, :, :, None, :], axis=-1)
    scores = jnp.where(visible[:, :, None, None], scores * (hd**-0.5), _MASKED)
    probs = jax.nn.softmax(scores, axis=1)
    out = jnp.sum(probs[..., None] * v.astype(jnp.float32)[:, :, :, None, :], axis=1)
    return out.astype(q.dtype)


def _write_slots(cache: jax.Array, index: tuple[jax.Array, ...], new: jax.Array) -> jax.Array:
    """cache.at[index].set(new) in cache's storage (a uint16 cache holds bfloat16 bit patterns,
    see cache.py), out-of-range slots dropped."""
    if cache.dtype == jnp.uint16:
        new = jax.lax.bitcast_convert_type(new.astype(jnp.bfloat16), jnp.uint16)
    return cache.at[index].set(new.astype(cache.dtype), mode="drop")


def _read_layer(cache: jax.Array, i: jax.Array) -> jax.Array:
    """Layer i of a cache [num_layers, B, S, KVH, hd], as values (bfloat16 for a uint16 cache)."""
    layer = cache[i]
    return jax.lax.bitcast_convert_type(layer, jnp.bfloat16) if layer.dtype == jnp.uint16 else layer


def logical_param(value: jax.Array, axes: tuple[str, ...]) -> nnx.Param:
    """A Param annotated with logical axis names (`out_sharding`) for the sharding rules.

    Placement is left to the caller's mesh (no eager sharding), so models build without a mesh.
    """
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.einsum("...i,io->...o", x, w.astype(x.dtype))


# Names of the stacked weights, with the logical axis names used for sharding.
_WEIGHT_AXES = {
    "attn_norm": ("layers", "embed"),
    "q_proj": ("layers", "embed", "heads"),
    "k_proj": ("layers", "embed", "kv_heads"),
    "v_proj": ("layers", "embed", "kv_heads"),
    "o_proj": ("layers", "heads", "embed"),
    "mlp_norm": ("layers", "embed"),
    "gate_proj": ("layers", "embed", "mlp"),
    "up_proj": ("layers", "embed", "mlp"),
    "down_proj": ("layers", "mlp", "embed"),
}
_BIAS_AXES = {
    "q_bias": ("layers", "heads"),
    "k_bias": ("layers", "kv_heads"),
    "v_bias": ("layers", "kv_heads"),
}


def layer_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of each stacked weight of `LayerStack` ([num_layers, in, out] for matrices)."""
    n, d, f = config.num_layers, config.hidden_size, config.intermediate_size
    qd, kvd = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {
        "attn_norm": (n, d),
        "q_proj": (n, d, qd),
        "k_proj": (n, d, kvd),
        "v_proj": (n, d, kvd),
        "o_proj": (n, qd, d),
        "mlp_norm": (n, d),
        "gate_proj": (n, d, f),
        "up_proj": (n, d, f),
        "down_proj": (n, f, d),
    }
    if config.attention_bias:
        shapes.update(q_bias=(n, qd), k_bias=(n, kvd), v_bias=(n, kvd))
    return shapes


class LayerStack(nnx.Module):
    """All decoder layers, weights stacked along a leading [num_layers] axis."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        dtype = config.weight_dtype
        for name, shape in layer_weight_shapes(config).items():
            if name.endswith("_norm"):
                value = jnp.ones(shape, dtype)
            elif name.endswith("_bias"):
                value = jnp.zeros(shape, dtype)
            else:
                value = config.initializer_range * jax.random.normal(rngs.params(), shape, dtype)
            axes = _WEIGHT_AXES.get(name) or _BIAS_AXES[name]
            setattr(self, name, logical_param(value, axes))

    def __call__(
        self,
        h: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        visible: jax.Array,
        kv: tuple[jax.Array, jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Runs every layer.

        h [B, T, D]; cos, sin [B, T, head_dim]; visible [B, T, S] bool (S = T without a cache).
        kv = (k, v, slots) with k, v [num_layers, B, S, KVH, hd] and slots [B, T] int32, the
        cache slots the new tokens are written to (out-of-range slots are dropped).
        Returns the new h [B, T, D] and the updated (k, v), or None without a cache.
        """
        cfg = self.config
        weights = {name: getattr(self, name)[...] for name in layer_weight_shapes(cfg)}
        b, t, _ = h.shape
        rows = jnp.arange(b)[:, None]

        def project(x: jax.Array, w: dict[str, jax.Array], name: str, heads: int) -> jax.Array:
            y = _dense(x, w[f"{name}_proj"])
            if cfg.attention_bias:
                y = y + w[f"{name}_bias"].astype(y.dtype)
            return y.reshape(b, t, heads, cfg.head_dim)

        def attention_inputs(h: jax.Array, w: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
            x = rms_norm(h, w["attn_norm"], cfg.rms_norm_eps)
            q = apply_rope(project(x, w, "q", cfg.num_heads), cos, sin)
            k = apply_rope(project(x, w, "k", cfg.num_kv_heads), cos, sin)
            return q, k, project(x, w, "v", cfg.num_kv_heads)

        def attend_and_mlp(
            h: jax.Array, w: dict[str, jax.Array], q: jax.Array, k: jax.Array, v: jax.Array
        ) -> jax.Array:
            attn = attention(q, k.astype(q.dtype), v.astype(q.dtype), visible, causal=kv is None)
            h = h + _dense(attn.reshape(b, t, -1), w["o_proj"])
            x = rms_norm(h, w["mlp_norm"], cfg.rms_norm_eps)
            mlp = jax.nn.silu(_dense(x, w["gate_proj"])) * _dense(x, w["up_proj"])
            return h + _dense(mlp, w["down_proj"])

        if kv is None:

            def body(h, w):
                return attend_and_mlp(h, w, *attention_inputs(h, w)), None

            if cfg.remat:
                body = jax.checkpoint(body, prevent_cse=False)  # scan already blocks CSE
            h, _ = jax.lax.scan(body, h, weights)
            return h, None

        # The whole cache rides in the carry and is updated in place at the layer's index;
        # passing it as scan inputs/outputs would copy every layer's cache on every call
        # (measured: 2x slower decode for SmolLM2-135M at batch 32).
        slots = kv[2]

        def cached_body(carry, xs):
            h, cache_k, cache_v = carry
            w, i = xs
            q, k, v = attention_inputs(h, w)
            cache_k = _write_slots(cache_k, (i, rows, slots), k)
            cache_v = _write_slots(cache_v, (i, rows, slots), v)
            h = attend_and_mlp(h, w, q, _read_layer(cache_k, i), _read_layer(cache_v, i))
            return (h, cache_k, cache_v), None

        layer_ids = jnp.arange(cfg.num_layers)
        (h, k, v), _ = jax.lax.scan(cached_body, (h, kv[0], kv[1]), (weights, layer_ids))
        return h, (k, v)
