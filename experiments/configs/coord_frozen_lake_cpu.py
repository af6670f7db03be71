"""CoordFrozenLake StarPO-S PPO for a 2-core CPU, after the world-model SFT start.

coord_sokoban_cpu.py's shape (read from that file, so the two stay one shape) on RAGEN's
CoordFrozenLake (4x4, slippery: the intended move with probability 0.8, the coordinate lines
and then the grid map), with replies of up to 160 tokens: the lake's world-model replies write
its hole list twice and take up to ~150. RL starts from coord_frozen_lake_sft.py's warm start:

    python experiments/sft.py --config coord_frozen_lake_sft.py \
        --workdir runs/coord_frozen_lake_sft
    python experiments/run.py --config coord_frozen_lake_cpu.py \
        --config.model.init_from=runs/coord_frozen_lake_sft --workdir runs/coord_frozen_lake_rl
"""

from starpo_jax.run.cli import load_config

REPLY_TOKENS = 160


def get_config():
    c = load_config("coord_sokoban_cpu.py")
    c.env.name = c.eval.envs = "coord_frozen_lake"
    c.rollout.reply_tokens = REPLY_TOKENS
    c.model.require_init_from = "coord_frozen_lake_sft.py"  # refused without model.init_from
    return c
