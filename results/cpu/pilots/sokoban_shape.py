"""Shape pilots of the CPU suite's Sokoban StarPO-S GRPO setting (README.md here): the suite's
setting (starpo_jax.analysis.suite.grid_base("sokoban", "grpo")) from the suite's SFT start with
the learning rate, rollout shape, keep ratio, steps and (optionally) the method given after the
colon as "lr,groups,group_size,keep_ratio,steps[,method]" (method: an advantage estimator of
GRPO's, e.g. gigpo; `ppo`, the suite's StarPO-S PPO with its critic at 10x the actor's rate,
the original's ratio (1e-5 against 1e-6); or `vanilla`, vanilla StarPO's GRPO: KL 0.001, clip
0.2, no filter, so keep_ratio must be 1.0, as vanilla=True checks); held-out evaluations
every 10 steps on the SFT start's 64 states (eval.seed 0):

    python experiments/run.py --config results/cpu/pilots/sokoban_shape.py:2e-5,4,8,0.5,20 \
        --workdir results/cpu/pilots/sokoban_grpo_s_2e-5_4x8_keep0.5_20/seed_0
"""
from pathlib import Path

from starpo_jax.analysis.suite import grid_base

SFT_START = Path(__file__).resolve().parents[1] / "runs" / "sokoban_sft" / "seed_0"


def get_config(arg="2e-5,4,8,0.5,20"):
    lr, groups, group_size, keep, steps, *method = arg.split(",")
    method = method[0] if method else "grpo"
    c = grid_base("sokoban", "ppo" if method == "ppo" else "grpo")()
    if method == "vanilla":
        c.vanilla = True
    elif method not in ("grpo", "ppo"):
        c.advantage.estimator = method
    c.optim.actor_lr = float(lr)
    if method == "ppo":
        c.optim.critic_lr = 10 * float(lr)
    c.rollout.update(groups=int(groups), group_size=int(group_size))
    c.filter.keep_ratio = float(keep)
    c.steps = int(steps)
    c.eval_every = c.sample_every = 10
    c.model.init_from = str(SFT_START)
    c.checkpoint_every, c.keep_checkpoints = 5, 1
    return c
