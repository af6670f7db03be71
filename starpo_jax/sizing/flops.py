"""Useful model FLOPs of a train step's phases, for model-FLOPs utilisation (MFU).

    flops = phase_flops(model.config, train_config, lengths, kept_lengths)
    mfu = flops["update"] / update_seconds / matmul_peak_flops_per_second

"Useful" is the work the step's result needs, counted on real (non-pad) tokens only, the
standard way: a forward costs 2 multiply-adds' worth of FLOPs per weight per token (2 x the
matmul weights x tokens) plus causal attention, 2 x 2 x layers x heads x head_dim FLOPs per
(query, visible key) pair (the q.k scores and the probability-weighted sum of values; a row of n
real tokens has n (n + 1) / 2 such pairs); forward + backward costs 3 forwards (the "6 x params
x tokens" rule, attention included). The rows of a group share their first prompt, which the
result needs computed once: with the groups' prefix lengths given, a group's prefix tokens and
the (query, key) pairs among them count once, not once per row. The matmul weights are the
layers' projections and the output head on every token: the language-model head [hidden, vocab]
for the policy and the reference, the value head [hidden, 1] for the critic. Not counted:
embedding lookups, norms, softmax, sampling, the environment, and the work the step does beyond
the useful (padding, rows of groups the filter did not keep, remat's recomputed forward, a
shared prefix run per row or per micro-batch), which is why MFU is not hardware utilisation.
"""

from __future__ import annotations

import numpy as np

from starpo_jax.config import TrainConfig
from starpo_jax.models.config import ModelConfig

HEADS = ("lm", "value")


def matmul_weights(config: ModelConfig, head: str = "lm") -> int:
    """Weights a token goes through as matmuls: every layer's q, k, v, o and gate, up, down
    projections, plus the output head ("lm": hidden x vocab; "value": hidden x 1)."""
    if head not in HEADS:
        raise ValueError(f"head = {head!r} is invalid; valid: one of {HEADS}")
    d, hd = config.hidden_size, config.head_dim
    attention = d * hd * (2 * config.num_heads + 2 * config.num_kv_heads)
    mlp = 3 * d * config.intermediate_size
    out = config.vocab_size * d if head == "lm" else d
    return config.num_layers * (attention + mlp) + out


def forward_flops(config: ModelConfig, lengths: np.ndarray, head: str = "lm",
                  prefix: np.ndarray | None = None) -> float:
    """FLOPs of one causal forward over rows of `lengths` real tokens: 2 x matmul_weights per
    token, plus 4 x layers x heads x head_dim per (query, key) pair. lengths: [rows] int, or
    [groups, N] with prefix [groups]: the first prefix[g] tokens of group g's N rows are the
    same, and count once."""
    n = np.asarray(lengths, np.float64)
    if n.ndim not in (1, 2) or (n < 0).any():
        raise ValueError(f"lengths must be a [rows] or [groups, N] array of token counts >= 0; "
                         f"got {lengths!r}")
    tokens, pairs = float(n.sum()), float(np.sum(n * (n + 1) / 2))
    if prefix is not None:
        p = np.asarray(prefix, np.float64)
        if n.ndim != 2 or p.shape != n.shape[:1] or (p > n.min(axis=1, initial=np.inf)).any():
            raise ValueError(f"prefix must be [groups] = {n.shape[:1]} counts no longer than "
                             f"any of its group's rows (lengths {n.shape}); got {prefix!r}")
        repeats = n.shape[1] - 1  # each group's prefix beyond its one useful computation
        tokens -= repeats * float(p.sum())
        pairs -= repeats * float(np.sum(p * (p + 1) / 2))
    per_pair = 4.0 * config.num_layers * config.num_heads * config.head_dim
    return 2.0 * matmul_weights(config, head) * tokens + per_pair * pairs


def phase_flops(model: ModelConfig, train: TrainConfig, lengths: np.ndarray,
                kept_lengths: np.ndarray, prefix: np.ndarray | None = None,
                kept_prefix: np.ndarray | None = None) -> dict[str, float]:
    """Useful FLOPs of each phase of one step (the phases of bench/step.py's table).

    lengths: real tokens of every rolled-out row; kept_lengths: those of the rows the update
    trains on (groups the filter really kept); [rows], or [groups, N] with prefix / kept_prefix
    [groups] the groups' shared first prompts (forward_flops). "rollout": one policy forward of
    every row's tokens. "old_logprobs" (up to the first round's old-log-prob mark): the reference
    forward when kl_coef > 0, the policy's unless the step makes one update only
    (TrainConfig.single_update), the critic's for PPO. "update" (everything after): per Online-k
    round ppo_epochs forward+backward passes of the policy (and critic), and the later rounds'
    policy (and critic) forwards."""
    ppo = train.algo == "ppo"
    policy = forward_flops(model, kept_lengths, "lm", kept_prefix)
    critic = forward_flops(model, kept_lengths, "value", kept_prefix)
    first = (policy if train.loss.kl_coef > 0 else 0.0) + (critic if ppo else 0.0)
    first += 0.0 if train.single_update else policy
    rounds = train.optim.rollout_reuse
    passes = 3.0 * (policy + (critic if ppo else 0.0)) * train.optim.ppo_epochs * rounds
    later = (rounds - 1) * (policy + (critic if ppo else 0.0))
    return {"rollout": forward_flops(model, lengths, "lm", prefix), "old_logprobs": first,
            "update": passes + later}
