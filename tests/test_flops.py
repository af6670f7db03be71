"""Useful-FLOP counting (starpo_jax/sizing/flops.py) against hand computations for SmolLM2-135M."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from starpo_jax.config import FilterConfig, OptimConfig, RolloutConfig, TrainConfig
from starpo_jax.sizing.flops import forward_flops, matmul_weights, phase_flops
from starpo_jax.models.config import ModelConfig

# SmolLM2-135M-Instruct's shape (its Hugging Face config.json).
SMOLLM2 = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                      num_heads=9, num_kv_heads=3, head_dim=64)
# Per layer: q and o 576 x 576, k and v 576 x 192, gate, up, down 576 x 1536.
LAYER = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536  # 3,538,944
LM = 30 * LAYER + 49152 * 576  # 134,479,872
VALUE = 30 * LAYER + 576
PAIR = 4 * 30 * 9 * 64  # FLOPs per (query, key) pair: q.k and p.v, 2 each per head dim


def test_matmul_weights_are_the_projections_and_the_head():
    assert matmul_weights(SMOLLM2) == LM == 134_479_872
    assert matmul_weights(SMOLLM2, "value") == VALUE
    # The published 134.5 M parameters = these + the norms (2 per layer + the final one).
    assert SMOLLM2.num_params == LM + 576 * (2 * 30 + 1)
    with pytest.raises(ValueError, match="head = 'critic' is invalid"):
        matmul_weights(SMOLLM2, "critic")


def test_forward_counts_real_tokens_and_causal_pairs():
    # Rows of 3 and 5 real tokens: 8 tokens, 3*4/2 + 5*6/2 = 21 (query, key) pairs.
    assert forward_flops(SMOLLM2, np.array([3, 5])) == 2 * LM * 8 + PAIR * 21
    assert forward_flops(SMOLLM2, np.array([3, 5]), "value") == 2 * VALUE * 8 + PAIR * 21
    assert forward_flops(SMOLLM2, np.array([0, 0])) == 0
    with pytest.raises(ValueError, match="lengths must be"):
        forward_flops(SMOLLM2, np.array([-1, 2]))


def _train(algo: str, **optim) -> TrainConfig:
    return TrainConfig(algo=algo, rollout=RolloutConfig(groups=4, group_size=2),
                       filter=FilterConfig(keep_ratio=0.5), optim=OptimConfig(**optim))


def test_phase_flops_by_hand():
    lengths = np.array([10, 20, 30, 40, 50, 60, 70, 80])
    kept = np.array([10, 20, 70, 80])  # 2 of 4 groups x 2 rows
    pairs_all = sum(n * (n + 1) // 2 for n in lengths)
    pairs_kept = sum(n * (n + 1) // 2 for n in kept)
    policy = 2 * LM * 180 + PAIR * pairs_kept
    critic = 2 * VALUE * 180 + PAIR * pairs_kept
    # PPO, one mini-batch, one epoch: no old-log-prob forward, the critic's values only.
    ppo = phase_flops(SMOLLM2, _train("ppo"), lengths, kept)
    assert ppo == {"rollout": 2 * LM * 360 + PAIR * pairs_all, "old_logprobs": critic,
                   "update": 3 * (policy + critic)}
    # GRPO, 2 mini-batches, 2 epochs, Online-2, with KL: reference + policy forwards first;
    # then 2 rounds x 2 epochs of forward+backward and the second round's policy forward.
    config = _train("grpo", minibatch_rows=2, ppo_epochs=2, rollout_reuse=2)
    config = dataclasses.replace(config, loss=dataclasses.replace(config.loss, kl_coef=0.01))
    grpo = phase_flops(SMOLLM2, config, lengths, kept)
    assert grpo["old_logprobs"] == 2 * policy
    assert grpo["update"] == 3 * policy * 2 * 2 + policy


def test_a_groups_shared_prefix_counts_once():
    # Independent count: every (row, position) a forward must compute, the prefix positions of a
    # group once; each computed position t attends to t + 1 keys.
    lengths, prefix = np.array([[10, 12, 9], [20, 25, 30]]), np.array([8, 15])
    positions = []
    for row_lengths, p in zip(lengths, prefix):
        positions += list(range(p))
        for n in row_lengths:
            positions += list(range(p, n))
    expected = 2 * LM * len(positions) + PAIR * sum(t + 1 for t in positions)
    assert forward_flops(SMOLLM2, lengths, prefix=prefix) == expected
    assert forward_flops(SMOLLM2, lengths, prefix=np.zeros(2)) == forward_flops(
        SMOLLM2, lengths.ravel())
    with pytest.raises(ValueError, match="prefix must be"):
        forward_flops(SMOLLM2, lengths, prefix=np.array([8, 21]))  # longer than a row of 20
    with pytest.raises(ValueError, match="prefix must be"):
        forward_flops(SMOLLM2, lengths.ravel(), prefix=prefix)  # rows not grouped
