"""Multi-turn learning end to end on a toy game (helpers/toy_lake.py: a fixed 2x2 FrozenLake,
two turns, only Right then Down wins): the SFT warm start teaches the format from `random`
demonstrations, then GRPO through the product's own path (model.init_from the SFT workdir,
api.build, the compiled step) learns the two-turn plan, which no single reply carries: a policy
whose later turns get no credit (their tokens masked out, the environment's message prefilled
wrongly) wins at most 1 in 4."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from envs_jax import registry  # noqa: E402
from starpo_jax import api  # noqa: E402
from helpers.toy_lake import rl_config, sft_start  # noqa: E402


@pytest.fixture
def toy_game(monkeypatch):
    """The helpers register the toy game into a copy of the registry that this test's end
    drops (as test_first_hour does for host envs): other tests compare envs_jax.names() with
    the shipped envs."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


@pytest.mark.slow  # minutes on a 2-core CPU: the slow tier (README)
@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_grpo_learns_a_two_turn_plan_from_an_sft_start(tmp_path, toy_game):
    sft_start(tmp_path / "sft")
    exp = api.build(rl_config(tmp_path / "sft"))
    success, valid, turns = [], [], []
    for _ in range(60):
        metrics = exp.step()
        success.append(float(metrics["train/success"]))
        valid.append(float(metrics["rollout/action_is_valid"]))
        turns.append(float(metrics["rollout/num_turns"]))
    print("success per step:", np.round(success, 2).tolist())
    print("turns per step:", np.round(turns, 2).tolist())
    assert np.mean(valid[:5]) > 0.8, "the SFT start did not teach the answer format"
    assert np.mean(success[:5]) < 0.25, "the toy game is won before any RL"
    # Above what first replies alone can win (1 in 4): the second reply learnt its own move.
    assert np.mean(success[-5:]) > 0.7, success
    assert np.mean(turns[-5:]) > 1.8, turns  # few first moves into the hole
