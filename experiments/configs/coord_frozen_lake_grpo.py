"""CoordFrozenLake, GRPO, at the paper's scale (8 x 16 rollouts): for a GPU.

RAGEN's CoordFrozenLake (its config/envs.yaml): FrozenLake (4x4, slippery with success_rate 0.8)
observed in RAGEN's grid_coord format, the coordinate lines and then the grid map
(docs/environments.md, observation formats), 5 turns of at most 2 actions, 10 actions per
trajectory, 120 tokens announced. 8 groups x 16 rollouts, thinking replies, actor lr 1e-6
(critic 1e-5), the uncertainty filter keeping 25% of the groups, clip 0.2 / 0.28, no KL,
mini-batches of 32 rows, 200 steps, validated every 10 steps on 512 held-out coord_frozen_lake
states sampled at temperature 0.5 (the original's validation). Every value is
api.default_config()'s; turns and action budgets are the env's own. On a 2-core CPU this is
hours per step with SmolLM2: coord_frozen_lake_cpu.py is the CPU run.
"""

from starpo_jax.run.schema import config_for, paper_eval


def get_config():
    return paper_eval(config_for("coord_frozen_lake", "grpo"))
