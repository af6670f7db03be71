"""ModelConfig: the shape and numerics of one Qwen2 / Llama-family decoder.

One dataclass covers both families: Qwen2 / Qwen2.5 are Llama plus q/k/v biases (and, for the
small sizes, tied embeddings). `from_hf_config` reads a Hugging Face `config.json` dict.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

# The projections of a layer that can carry LoRA adapters (layers.py's weight names), with
# LoraConfig, and the names accepted for `dtype` / `param_dtype`: defined without JAX.
from starpo_jax.config import LORA_TARGETS  # noqa: F401
from starpo_jax.config import MATMUL_PRECISIONS, RUN_MATMUL_PRECISIONS
from starpo_jax.config import MODEL_DTYPES as DTYPES

#: Hugging Face architecture name -> (model_type, whether q/k/v projections carry a bias).
SUPPORTED_ARCHITECTURES = {
    "Qwen2ForCausalLM": ("qwen2", True),
    "LlamaForCausalLM": ("llama", False),
}

# Per-family defaults of the Hugging Face config classes, used for keys a config.json omits.
_HF_DEFAULTS = {
    "qwen2": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False},
}


def resolve_matmul_precision(name: str, backend: str) -> str | None:
    """ModelConfig.matmul_precision for the run key model.matmul_precision (RUN_MATMUL_PRECISIONS)
    on `backend` (jax.default_backend()): "auto" is "highest" on an accelerator, whose default
    float32 matmuls are not float32 (TF32 on NVIDIA GPUs since Ampere, bfloat16 passes on TPUs),
    and XLA's default (None) on a CPU, where float32 is float32 already; "default" is None."""
    if name not in RUN_MATMUL_PRECISIONS:
        raise ValueError(f"model.matmul_precision = {name!r} is invalid; valid: one of "
                         f"{RUN_MATMUL_PRECISIONS}")
    if name == "auto":
        return None if backend == "cpu" else "highest"
    return None if name == "default" else name


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Static description of a decoder; hashable, so it can be a jit static argument."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False  # q/k/v bias: True for Qwen2, False for Llama
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192
    dtype: str = "float32"  # compute dtype of matmuls (softmax and norms always run in float32)
    param_dtype: str = "float32"
    initializer_range: float = 0.02  # std of the normal init of fresh (random) weights
    # Recompute each layer's activations in the backward pass instead of storing them
    # (activation memory of one layer instead of all; about one extra forward of compute).
    remat: bool = False
    # LoRA adapters (float32, whatever param_dtype) on these projections: lora_rank 0 = none.
    # Each targeted W [in, out] computes x W + (x A B) * lora_alpha / lora_rank (layers.py).
    lora_rank: int = 0
    lora_alpha: float = 64.0
    lora_targets: tuple[str, ...] = ()
    # The precision of every matmul the model's forward and backward trace (applied as
    # jax.default_matmul_precision around them): None = XLA's default for the backend (on a GPU,
    # float32 matmuls then run in TF32), or one of MATMUL_PRECISIONS ("highest": float32 that
    # means float32 on every backend).
    matmul_precision: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int; got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim must be even for rotary embeddings; got {self.head_dim}"
            )
        for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"ModelConfig.{name} must be a positive number; got {value!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"ModelConfig.{name} must be one of {DTYPES}; got {getattr(self, name)!r}"
                )

        if self.matmul_precision is not None and self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"ModelConfig.matmul_precision must be None or one of "
                             f"{MATMUL_PRECISIONS}; got {self.matmul_precision!r}")
        if not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) or (
                self.lora_rank < 0):
            raise ValueError(f"ModelConfig.lora_rank must be an int >= 0; got {self.lora_rank!r}")
        if self.lora_rank and (not self.lora_targets
                               or not set(self.lora_targets) <= set(LORA_TARGETS)):
            raise ValueError(f"ModelConfig.lora_targets must be a non-empty tuple of names from "
                             f"{LORA_TARGETS} when lora_rank > 0; got {self.lora_targets!r}")

    @property
    def lora_scale(self) -> float:
        """The adapters' factor alpha / rank (LoRA's scaling)."""
        return self.lora_alpha / self.lora_rank

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def num_params(self) -> int:
        """Parameter count of the language model (no value head), counting tied weights once."""
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * h * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.attention_bias:
            attn += h * (self.num_heads + 2 * self.num_kv_heads)
        layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_layers * layer + d + head

    @classmethod
    def from_hf_config(cls, hf_config: dict[str, Any], **overrides: Any) -> ModelConfig:
        """Builds a config from a Hugging Face Qwen2 / Llama `config.json` dict.

        `overrides` replace fields afterwards (e.g. `dtype="bfloat16"`). Raises ValueError for an
        unsupported architecture, activation, rope scaling, sliding window or MLP bias.
        """
        archs = hf_config.get("architectures") or []
        model_type = hf_config.get("model_type")
        known = [a for a in archs if a in SUPPORTED_ARCHITECTURES]
        if archs and not known:
            raise ValueError(
                f"unsupported architecture {archs}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if known:
            family, bias_default = SUPPORTED_ARCHITECTURES[known[0]]
        else:
            by_type = {t: b for t, b in SUPPORTED_ARCHITECTURES.values()}
            if model_type not in by_type:
                raise ValueError(
                    f"unsupported model_type {model_type!r} (no architectures given); "
                    f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
                )
            family, bias_default = model_type, by_type[model_type]

        act = hf_config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' (SwiGLU) is implemented")
        if hf_config.get("mlp_bias"):
            raise ValueError("unsupported mlp_bias=True; only bias-free MLPs are implemented")
        if hf_config.get("use_sliding_window"):
            raise ValueError(
                "unsupported use_sliding_window=True; only full attention is implemented"
            )
        if hf_config.get("rope_interleaved"):
            raise ValueError("unsupported rope_interleaved=True; only the rotate_half layout")
        layer_types = set(hf_config.get("layer_types") or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(
                f"unsupported layer_types {sorted(layer_types)}; only 'full_attention'"
            )

        # transformers >= 5 writes `rope_parameters`; older files write rope_theta / rope_scaling.
        rope = dict(hf_config.get("rope_parameters") or {})
        scaling = hf_config.get("rope_scaling") or {}
        rope_type = (
            rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        )
        if rope_type != "default":
            raise ValueError(
                f"unsupported rope scaling {rope_type!r}; only 'default' rotary "
                "embeddings are implemented"
            )
        rope_theta = rope.get("rope_theta", hf_config.get("rope_theta", 10000.0))

        defaults = _HF_DEFAULTS[family]
        num_heads = hf_config["num_attention_heads"]
        fields = dict(
            vocab_size=hf_config["vocab_size"],
            hidden_size=hf_config["hidden_size"],
            intermediate_size=hf_config["intermediate_size"],
            num_layers=hf_config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf_config.get("num_key_value_heads") or num_heads,
            # (a bad num_heads is reported by __post_init__, not as a ZeroDivisionError here)
            head_dim=hf_config.get("head_dim") or hf_config["hidden_size"] // max(num_heads, 1),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf_config.get("rms_norm_eps", defaults["rms_norm_eps"])),
            attention_bias=bool(hf_config.get("attention_bias", bias_default)),
            tie_word_embeddings=bool(
                hf_config.get("tie_word_embeddings", defaults["tie_word_embeddings"])
            ),
            max_position_embeddings=hf_config.get(
                "max_position_embeddings", defaults["max_position_embeddings"]
            ),
            initializer_range=float(hf_config.get("initializer_range", 0.02)),
        )
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig override(s) {sorted(unknown)}")
        return cls(**{**fields, **overrides})
