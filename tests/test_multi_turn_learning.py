"""Multi-turn learning end to end on a toy game: the SFT warm start teaches the format from
`random` demonstrations, then GRPO through the product's own path (model.init_from the SFT
workdir, api.build, the compiled step) learns a two-turn plan that no single reply can carry.

The game is FrozenLake on one fixed 2x2 map without slipping, start top left, a hole below it,
the goal bottom right ("S F / H G"), two turns of one action each: only Right then Down wins
(Down first falls in the hole, a second Right hits the wall), so the second reply has to differ
from the first, answering the turn (or board) that the environment's message shows. Random
moves win 1 in 16; a policy that learns only its first reply (its later turns given no credit:
their tokens masked out, the environment's message prefilled wrongly) wins at most 1 in 4, and
less as "Right" carries over to its second reply.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import envs_jax  # noqa: E402
from envs_jax.catalog import EnvSettings  # noqa: E402
from envs_jax.frozen_lake.env import FrozenLake  # noqa: E402
from envs_jax.frozen_lake.generator import RandomMapGenerator  # noqa: E402
from envs_jax.frozen_lake.types import FROZEN, GOAL, HOLE  # noqa: E402
from starpo_jax import api  # noqa: E402
from starpo_jax.run import loop as runner, sft  # noqa: E402
from helpers.tiny import SHORT_TURN  # noqa: E402

TOY = "toy_lake_2x2"


class _OneMap(RandomMapGenerator):
    """Every draw is the same map: start top left, a hole below it, the goal bottom right."""

    def draw(self, key):
        tiles = jnp.array([[FROZEN, FROZEN], [HOLE, GOAL]], jnp.int32)
        return tiles, jnp.zeros(2, jnp.int32)


def _toy_lake() -> FrozenLake:
    env = FrozenLake(size=2, p=1.0, slippery=False)
    env.generator = _OneMap(2, 1.0, 1)
    return env


if TOY not in envs_jax.names():
    envs_jax.register(TOY, _toy_lake, settings=EnvSettings(
        max_turns=2, max_actions_per_turn=1, max_actions_per_traj=2))


def _short(c):
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.check_memory = False
    c.eval_every = c.sample_every = 0
    return c


@pytest.mark.slow  # minutes on a 2-core CPU: the slow tier (README)
@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_grpo_learns_a_two_turn_plan_from_an_sft_start(tmp_path):
    warm = _short(sft.sft_config(TOY, "random", groups=4, group_size=4, reply_tokens=8))
    warm.optim.actor_lr = 1e-2
    warm.steps, warm.checkpoint_every = 100, 100
    assert runner.train(sft.build(warm), tmp_path / "sft") == 100

    c = _short(api.config_for(TOY, "grpo", groups=8, group_size=4, reply_tokens=8))
    c.model.init_from = str(tmp_path / "sft")
    c.filter.keep_ratio = 1.0
    c.advantage.grpo_mode = "mean"  # the win, not its rarity, sets the advantage's size
    c.loss.entropy_coef = 0.0
    c.optim.actor_lr = 2e-3
    exp = api.build(c)
    success, valid, turns = [], [], []
    for _ in range(60):
        metrics = exp.step()
        success.append(float(metrics["train/success"]))
        valid.append(float(metrics["rollout/action_is_valid"]))
        turns.append(float(metrics["rollout/num_turns"]))
    print("success per step:", np.round(success, 2).tolist())
    print("valid per step:", np.round(valid, 2).tolist())
    print("turns per step:", np.round(turns, 2).tolist())
    assert np.mean(valid[:5]) > 0.8, "the SFT start did not teach the answer format"
    assert np.mean(success[:5]) < 0.25, "the toy game is won before any RL"
    # Above what first replies alone can win (1 in 4): the second reply learnt its own move.
    assert np.mean(success[-5:]) > 0.7, success
    assert np.mean(turns[-5:]) > 1.8, turns  # few first moves into the hole
