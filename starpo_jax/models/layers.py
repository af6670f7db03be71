"""The pieces of one Qwen2 / Llama decoder layer, and the stack of layers run with one scan.

The layer math is written as pure functions of arrays; `LayerStack` holds every weight stacked
along a leading [num_layers] axis and runs the layers with `jax.lax.scan`, so the compiled
program holds one copy of the layer whatever the depth. Weights are stored in `[in, out]` layout.
"""

from __future__ import annotations

from typing import Callable

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
#: Query block of `attention` without the causal promise: its [B, KVH, G, block, S] scores are
#: all that exist at once (SmolLM2 at B = 128, S = 1732, 216 queries: 1.7 GB of float32 scores
#: unblocked).
PREFILL_BLOCK = 32


#: The attention implementation: "xla" (the blockwise one below, every backend) or "cudnn"
#: (jax.nn.dot_product_attention's fused cuDNN kernel). None: "cudnn" on a GPU for bfloat16 /
#: float16 queries (the only dtypes its flash kernel takes), else "xla".
ATTENTION_BACKEND: str | None = None
BACKENDS = ("xla", "cudnn")


def attention_backend(dtype: jnp.dtype) -> str:
    """The implementation `attention` runs for queries of `dtype` (see ATTENTION_BACKEND)."""
    if ATTENTION_BACKEND is not None:
        if ATTENTION_BACKEND not in BACKENDS:
            raise ValueError(f"ATTENTION_BACKEND = {ATTENTION_BACKEND!r} is invalid; valid: "
                             f"None or one of {BACKENDS}")
        return ATTENTION_BACKEND
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if half and jax.default_backend() == "gpu" else "xla"


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array, causal: bool = False,
    backend: str | None = None,
) -> jax.Array:
    """Grouped-query softmax attention.

    q [B, T, H, hd]; k, v [B, KVH, S, hd], heads ahead of positions (the KV cache's layout), with
    H a multiple of KVH (query head h reads kv head h // (H // KVH)); visible [B, T, S] bool.
    Scores and softmax in float32. -> [B, T, H, hd]. backend: "xla" or "cudnn" (None:
    attention_backend(q.dtype)); "cudnn" goes to jax.nn.dot_product_attention with the mask as
    a bias (implementation "cudnn"; the tests run the same call with implementation "xla").

    Both products are batched matmuls over (B, KVH) with no transpose of k or v. bfloat16 keys
    and values against float32 queries (a bfloat16 cache) are read as they are stored: see
    `_dot_f32`.

    `causal=True` promises that query t sees no key s > t + S - T (the queries are the last T
    of the S key positions: S == T without a cache, S > T for the rows of the shared-prefix
    forward, whose keys start with their prefix's): the queries then go in blocks of
    CAUSAL_BLOCK, each against only the keys up to its last query, which skips
    the upper triangle (about half the work and of the saved probabilities at T = 512, more
    than half the time of SmolLM2's attention forward+backward; measured in
    experiments/bench/sampler.py's training row). A query with no visible key (padding) gets a
    uniform softmax over the keys its block reads instead of over all of them.
    Otherwise (any visibility; a model call with a cache goes to `cache_attention`) the queries
    go in blocks of PREFILL_BLOCK against all keys: each query's softmax is its own, so the
    result is the unblocked one.
    """
    b, t, h, hd = q.shape
    kvh = k.shape[1]
    if (backend or attention_backend(q.dtype)) == "cudnn":
        return _fused_attention(q, k, v, visible, "cudnn")
    qh = q.reshape(b, t, kvh, h // kvh, hd).transpose(0, 2, 3, 1, 4)  # [B, KVH, G, T, hd]
    if causal:
        offset = k.shape[2] - t
        bounds = [(i, min(i + CAUSAL_BLOCK, t), offset + min(i + CAUSAL_BLOCK, t))
                  for i in range(0, t, CAUSAL_BLOCK)]
    else:
        bounds = [(i, min(i + PREFILL_BLOCK, t), k.shape[2]) for i in range(0, t, PREFILL_BLOCK)]
    outs = []
    for start, stop, keys in bounds:
        scores = _dot_f32("bkgtd,bksd->bkgts", qh[:, :, :, start:stop], k[:, :, :keys])
        seen = visible[:, None, None, start:stop, :keys]
        probs = jax.nn.softmax(jnp.where(seen, scores * (hd**-0.5), _MASKED), axis=-1)
        outs.append(_dot_f32("bkgts,bksd->bkgtd", probs.astype(q.dtype), v[:, :, :keys]))
    out = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd).astype(q.dtype)


def _fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array,
                     implementation: str) -> jax.Array:
    """`attention` through jax.nn.dot_product_attention: q [B, T, H, hd], k, v [B, KVH, S, hd],
    visible [B, T, S] bool -> [B, T, H, hd]. The mask goes in as a finite bias, so a query with
    no visible key gets a uniform softmax (finite, as in the blockwise path) rather than NaN."""
    k, v = (_values(x).transpose(0, 2, 1, 3).astype(q.dtype) for x in (k, v))  # [B, S, KVH, hd]
    bias = jnp.where(visible, 0.0, _MASKED).astype(q.dtype)[:, None]  # [B, 1, T, S]
    return jax.nn.dot_product_attention(q, k, v, bias=bias, implementation=implementation)


#: Key block of an attention over a cache (a decode step, a prefill into a cache): it reads the
#: cache in blocks of this many slots, and only the blocks below the fullest row's filled count.
CACHE_KEY_BLOCK = 128


def filled_bound(visible: jax.Array) -> jax.Array:
    """One past the last slot any query sees: visible [B, T, S] bool -> int32 scalar."""
    seen_any = jnp.any(visible, axis=(0, 1))
    return jnp.max(jnp.where(seen_any, jnp.arange(1, visible.shape[-1] + 1), 0))


def cache_attention(
    q: jax.Array, cache_k: jax.Array, cache_v: jax.Array, layer: jax.Array, visible: jax.Array,
    bound: jax.Array,
) -> jax.Array:
    """Attention of T new tokens per row over layer `layer` of the cache, read in place: a
    decode step (T = 1) or a prefill into a cache (the new tokens already written to it).

    q [B, T, H, hd]; cache_k, cache_v [num_layers, B, KVH, S, hd] (uint16 = bfloat16 bit
    patterns); visible [B, T, S] bool; bound = filled_bound(visible), computed once for all
    layers. -> [B, T, H, hd].

    A cache is sized for a whole trajectory, so most of it is empty for most of the rollout: the
    keys go in blocks of CACHE_KEY_BLOCK slots (a while loop with an online softmax) up to the
    last block any row has filled, each block sliced straight out of the whole cache, so the
    empty slots are never read and the layer is never copied out. With the head-major cache and
    `_dot_f32`, SmolLM2's decode step at 16 rows and 1732 bfloat16 slots went from 367 to 122 ms
    half full and from 376 to 196 ms full (experiments/bench/sampler.py --decode-fills; README).
    A prefill of a multi-turn rollout's later message reads the turns so far, not the whole
    conversation's buffer. The result is that one softmax up to float rounding (a query that
    sees no slot gets a uniform softmax over the blocks read); the block order is fixed.
    """
    b, t, h, hd = q.shape
    kvh, slots = cache_k.shape[2], cache_k.shape[3]
    g = h // kvh
    block = min(CACHE_KEY_BLOCK, slots)
    qh = q.reshape(b, t, kvh, g, hd).transpose(0, 2, 3, 1, 4)  # [B, KVH, G, T, hd]
    blocks = jnp.maximum((bound + block - 1) // block, 1)

    def read(cache: jax.Array, start: jax.Array) -> jax.Array:
        return _values(jax.lax.dynamic_slice(cache, (layer, 0, 0, start, 0),
                                             (1, b, kvh, block, hd))[0])

    def body(j, carry):
        top, total, acc = carry  # running max [B, KVH, G, T], softmax denominator, numerator
        # The last block is moved back to fit the cache; its slots before j * block were read.
        start = jnp.minimum(j * block, slots - block)
        keys = start + jnp.arange(block)
        seen = jax.lax.dynamic_slice_in_dim(visible, start, block, axis=2)  # [B, T, block]
        seen = seen & (keys >= j * block)
        scores = _dot_f32("bkgtd,bksd->bkgts", qh, read(cache_k, start)) * (hd**-0.5)
        scores = jnp.where(seen[:, None, None], scores, _MASKED)
        new_top = jnp.maximum(top, jnp.max(scores, axis=-1))
        rescale = jnp.exp(top - new_top)
        probs = jnp.exp(scores - new_top[..., None])
        total = total * rescale + jnp.sum(probs, axis=-1)
        acc = acc * rescale[..., None] + _dot_f32(
            "bkgts,bksd->bkgtd", probs.astype(q.dtype), read(cache_v, start))
        return new_top, total, acc

    init = (jnp.full((b, kvh, g, t), _MASKED, jnp.float32), jnp.zeros((b, kvh, g, t), jnp.float32),
            jnp.zeros((b, kvh, g, t, hd), jnp.float32))
    _, total, acc = jax.lax.fori_loop(0, blocks, body, init)
    out = acc / total[..., None]  # [B, KVH, G, T, hd]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd).astype(q.dtype)


def _dot_f32(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """einsum(spec, x, y) accumulated in float32, for x [B, KVH, G, ...] against keys or values y.

    A float32 x against a bfloat16 y (a bfloat16 cache) goes as ONE bfloat16 product of x's high
    and low bfloat16 halves, stacked along G, whose two results are summed: y is read in its
    stored width, and x keeps ~16 significant bits (bfloat16 x bfloat16 products are exact in
    float32), so the result is the float32 one within ~1e-5 relative. Widening y instead writes a
    float32 copy of every layer's cache on every call: SmolLM2's decode attention at 16 rows and
    1732 slots took 27 ms per layer that way, 5.0 ms split, against 10.9 ms for the broadcast
    product over the [B, S, KVH, hd] cache used before (one layer's attention timed alone).
    """
    if x.dtype == jnp.float32 and y.dtype == jnp.bfloat16:
        hi = x.astype(jnp.bfloat16)
        lo = (x - hi.astype(jnp.float32)).astype(jnp.bfloat16)
        out = jnp.einsum(spec, jnp.concatenate([hi, lo], axis=2), y,
                         preferred_element_type=jnp.float32)
        g = x.shape[2]
        return out[:, :, :g] + out[:, :, g:]
    return jnp.einsum(spec, x, y.astype(x.dtype), preferred_element_type=jnp.float32)


def _write_slots(
    cache: jax.Array, i: jax.Array, rows: jax.Array, slots: jax.Array, new: jax.Array
) -> jax.Array:
    """Writes new [B, T, KVH, hd] to slots [B, T] of layer i of cache [num_layers, B, KVH, S, hd]
    (rows [B, 1] = arange(B)), in cache's storage (a uint16 cache holds bfloat16 bit patterns,
    see cache.py); out-of-range slots are dropped."""
    if cache.dtype == jnp.uint16:
        new = jax.lax.bitcast_convert_type(new.astype(jnp.bfloat16), jnp.uint16)
    # The two index arrays around the head slice put their [B, T] first: the update is [B, T,
    # KVH, hd], new's own layout.
    return cache.at[i, rows, :, slots].set(new.astype(cache.dtype), mode="drop")


def _values(stored: jax.Array) -> jax.Array:
    """Stored values: a uint16 cache or stacked weight holds bfloat16 bit patterns. XLA's CPU
    backend converts a bfloat16 array that is dynamically sliced or scattered into as a WHOLE
    to float32 (a layer's weights sliced out of the stack, a cache written at a slot), so the
    bfloat16 cache (cache.py) and the bfloat16 sampler's layer weights (sampler_weights.py) are
    stored as bit patterns and read through this bitcast after the slice."""
    if stored.dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(stored, jnp.bfloat16)
    return stored


def logical_param(value: jax.Array, axes: tuple[str, ...]) -> nnx.Param:
    """A Param annotated with logical axis names (`out_sharding`) for the sharding rules.

    Placement is left to the caller's mesh (no eager sharding), so models build without a mesh.
    """
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.einsum("...i,io->...o", x, w.astype(x.dtype))


def _linear(x: jax.Array, w: dict[str, jax.Array], name: str, scale: float) -> jax.Array:
    """x [..., in] through projection `name` of one layer's weights w: x W, plus (x A) B * scale
    when w holds the projection's LoRA adapters (A [in, r], B [r, out])."""
    y = _dense(x, w[name])
    if f"{name}_lora_a" in w:
        y = y + _dense(_dense(x, w[f"{name}_lora_a"]), w[f"{name}_lora_b"]) * scale
    return y


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


def lora_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of each stacked LoRA adapter of `LayerStack` ({} when config.lora_rank is 0):
    "<proj>_lora_a" [num_layers, in, rank] and "<proj>_lora_b" [num_layers, rank, out]."""
    shapes = layer_weight_shapes(config)
    r = config.lora_rank
    out = {}
    for name in (config.lora_targets if r else ()):
        n, fan_in, fan_out = shapes[name]
        out.update({f"{name}_lora_a": (n, fan_in, r), f"{name}_lora_b": (n, r, fan_out)})
    return out


def init_lora(config: ModelConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Fresh LoRA adapters (lora_weight_shapes), float32: A kaiming-uniform with bound
    1/sqrt(in) (peft's default), B zero, so that a fresh adapter adds nothing."""
    shapes = lora_weight_shapes(config)
    keys = jax.random.split(key, max(len(shapes), 1))
    out = {}
    for k, (name, shape) in zip(keys, shapes.items()):
        if name.endswith("_a"):
            bound = shape[1] ** -0.5
            out[name] = jax.random.uniform(k, shape, jnp.float32, -bound, bound)
        else:
            out[name] = jnp.zeros(shape, jnp.float32)
    return out


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
        for name, value in init_lora(config, rngs.params()).items():
            base, part = name.rsplit("_lora_", 1)
            layers, fan_in, fan_out = _WEIGHT_AXES[base]
            axes = (layers, fan_in, None) if part == "a" else (layers, None, fan_out)
            setattr(self, name, nnx.LoRAParam(value, out_sharding=axes, eager_sharding=False))

    def __call__(
        self,
        h: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        visible: jax.Array,
        kv: tuple[jax.Array, jax.Array, jax.Array] | None = None,
        attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Runs every layer.

        h [B, T, D]; cos, sin [B, T, head_dim]; visible [B, T, S] bool (S = T without a cache).
        kv = (k, v, slots) with k, v [num_layers, B, KVH, S, hd] and slots [B, T] int32, the
        cache slots the new tokens are written to (out-of-range slots are dropped).
        attend (no cache; visible unused): the attention itself, (q [B, T, H, hd], k, v
        [B, T, KVH, hd]) -> [B, T, H, hd], for a batch whose tokens are not rows of one causal
        sequence (the shared-prefix forward packs prefixes and suffixes into one row).
        Returns the new h [B, T, D] and the updated (k, v), or None without a cache.
        """
        cfg = self.config
        names = (*layer_weight_shapes(cfg), *lora_weight_shapes(cfg))
        weights = {name: getattr(self, name)[...] for name in names}
        scale = cfg.lora_scale if cfg.lora_rank else 1.0
        b, t, _ = h.shape
        rows = jnp.arange(b)[:, None]

        def project(x: jax.Array, w: dict[str, jax.Array], name: str, heads: int) -> jax.Array:
            y = _linear(x, w, f"{name}_proj", scale)
            if cfg.attention_bias:
                y = y + w[f"{name}_bias"].astype(y.dtype)
            return y.reshape(b, t, heads, cfg.head_dim)

        def attention_inputs(h: jax.Array, w: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
            x = rms_norm(h, w["attn_norm"], cfg.rms_norm_eps)
            q = apply_rope(project(x, w, "q", cfg.num_heads), cos, sin)
            k = apply_rope(project(x, w, "k", cfg.num_kv_heads), cos, sin)
            return q, k, project(x, w, "v", cfg.num_kv_heads)

        def mlp_block(h: jax.Array, w: dict[str, jax.Array], attn: jax.Array) -> jax.Array:
            """The rest of the layer after attention: attn [B, T, H, hd]."""
            h = h + _linear(attn.reshape(b, t, -1), w, "o_proj", scale)
            x = rms_norm(h, w["mlp_norm"], cfg.rms_norm_eps)
            mlp = jax.nn.silu(_linear(x, w, "gate_proj", scale)) * _linear(x, w, "up_proj", scale)
            return h + _linear(mlp, w, "down_proj", scale)

        if kv is None:

            def body(h, w):
                w = {name: _values(x) for name, x in w.items()}
                q, k, v = attention_inputs(h, w)
                heads_first = (0, 2, 1, 3)  # [B, KVH, T, hd], the layout attention reads
                if attend is not None:
                    attn = attend(q, k, v)
                else:
                    attn = attention(q, k.transpose(heads_first), v.transpose(heads_first),
                                     visible, causal=True)
                return mlp_block(h, w, attn), None

            if cfg.remat:
                body = jax.checkpoint(body, prevent_cse=False)  # scan already blocks CSE
            h, _ = jax.lax.scan(body, h, weights)
            return h, None

        # The whole cache rides in the carry and is updated in place at the layer's index;
        # passing it as scan inputs/outputs would copy every layer's cache on every call
        # (measured: 2x slower decode for SmolLM2-135M at batch 32).
        slots = kv[2]
        bound = filled_bound(visible)

        def cached_body(carry, xs):
            h, cache_k, cache_v = carry
            w, i = xs
            w = {name: _values(x) for name, x in w.items()}
            q, k, v = attention_inputs(h, w)
            cache_k = _write_slots(cache_k, i, rows, slots, k)
            cache_v = _write_slots(cache_v, i, rows, slots, v)
            attn = cache_attention(q, cache_k, cache_v, i, visible, bound)
            h = mlp_block(h, w, attn)
            return (h, cache_k, cache_v), None

        layer_ids = jnp.arange(cfg.num_layers)
        (h, k, v), _ = jax.lax.scan(cached_body, (h, kv[0], kv[1]), (weights, layer_ids))
        return h, (k, v)
