"""A toy multi-turn game for learning checks: FrozenLake on one fixed 2x2 map without slipping,
start top left, a hole below it, the goal bottom right ("S F / H G"), two turns of one action
each. Only Right then Down wins (Down first falls in the hole, a second Right hits the wall), so
the second reply has to differ from the first. Random moves win 1 in 16; a policy that learns
only its first reply (its later turns given no credit) wins at most 1 in 4.

    sft_start(workdir)                      # tiny-random taught the format: random moves
    config = rl_config(workdir, "grpo")     # StarPO from it on the toy game

Both register the game under TOY first; importing this module registers nothing (a test that
calls them keeps the registry its own: monkeypatch a copy of envs_jax.registry._REGISTRY).
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp

import envs_jax
from envs_jax.catalog import EnvSettings
from envs_jax.frozen_lake.env import FrozenLake
from envs_jax.frozen_lake.generator import RandomMapGenerator
from envs_jax.frozen_lake.types import FROZEN, GOAL, HOLE
from starpo_jax import api
from starpo_jax.run import loop as runner, sft

from helpers.tiny import SHORT_TURN

TOY = "toy_lake_2x2"
SFT_STEPS = 100


class _OneMap(RandomMapGenerator):
    """Every draw is the same map: start top left, a hole below it, the goal bottom right."""

    def draw(self, key):
        tiles = jnp.array([[FROZEN, FROZEN], [HOLE, GOAL]], jnp.int32)
        return tiles, jnp.zeros(2, jnp.int32)


def _toy_lake() -> FrozenLake:
    env = FrozenLake(size=2, p=1.0, slippery=False)
    env.generator = _OneMap(2, 1.0, 1)
    return env


def register() -> None:
    """Registers the game under TOY, once."""
    if TOY not in envs_jax.names():
        envs_jax.register(TOY, _toy_lake, settings=EnvSettings(
            max_turns=2, max_actions_per_turn=1, max_actions_per_traj=2))


def _short(c: api.ConfigDict) -> api.ConfigDict:
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.check_memory = False
    c.eval_every = c.sample_every = 0
    return c


def sft_start(workdir: str | Path) -> None:
    """The format, not the task: SFT_STEPS steps on `random` demonstrations into workdir."""
    register()
    c = _short(sft.sft_config(TOY, "random", groups=4, group_size=4, reply_tokens=8))
    c.optim.actor_lr = 1e-2
    c.steps = c.checkpoint_every = SFT_STEPS
    assert runner.train(sft.build(c), Path(workdir)) == SFT_STEPS


def rl_config(start: str | Path, algo: str = "grpo", seed: int = 0) -> api.ConfigDict:
    """GRPO (or `algo`) on the toy game from the SFT workdir `start`: 8 x 4 rollouts, no
    filter, the group mean as baseline (the win, not its rarity, sets the advantage's size)."""
    register()
    c = _short(api.config_for(TOY, algo, groups=8, group_size=4, reply_tokens=8))
    c.seed = seed
    c.model.init_from = str(start)
    c.filter.keep_ratio = 1.0
    c.advantage.grpo_mode = "mean"
    c.loss.entropy_coef = 0.0
    c.optim.actor_lr = 2e-3
    return c
