"""Sokoban, GRPO, at the paper's scale (8 x 16 rollouts, 200 steps): for a GPU.

8 groups x 16 rollouts, thinking replies, actor lr 1e-6 (critic 1e-5), the uncertainty filter
keeping 25% of the groups, clip 0.2 / 0.28, no KL, mini-batches of 32 rows, 200 steps,
validated before training and every 10 steps on 512 held-out sokoban states of the fixed val
seed 123, sampled at temperature 0.5 (the original's validation protocol), then greedy. Every
value is api.default_config()'s; turns and action budgets are the env's own. On a 2-core CPU
this is hours per step with SmolLM2: quickstart.py is the CPU run.
"""

from starpo_jax.run.schema import config_for, paper_eval


def get_config():
    return paper_eval(config_for("sokoban", "grpo"))
