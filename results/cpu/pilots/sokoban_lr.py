"""Learning-rate pilots of the CPU suite's Sokoban StarPO-S GRPO setting (README.md here).

The suite's setting (starpo_jax.analysis.suite.grid_base("sokoban", "grpo"): 4 x 4 rollouts,
keep 0.25, clip 0.2 / 0.28, 24-token NoThink replies, 10 steps, 64 held-out states greedy every
5 steps with eval.seed 0, the SFT start's own states) from the suite's SFT start, at the actor
learning rate given after the colon:

    python experiments/run.py --config results/cpu/pilots/sokoban_lr.py:3e-5 \
        --workdir results/cpu/pilots/sokoban_grpo_s_lr3e-5/seed_0
"""
from pathlib import Path

from starpo_jax.analysis.suite import grid_base

SFT_START = Path(__file__).resolve().parents[1] / "runs" / "sokoban_sft" / "seed_0"


def get_config(arg="1e-4"):
    c = grid_base("sokoban", "grpo")()
    c.optim.actor_lr = float(arg)
    c.model.init_from = str(SFT_START)
    c.checkpoint_every, c.keep_checkpoints = 5, 1
    return c
