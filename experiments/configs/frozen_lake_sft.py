"""SFT warm start on FrozenLake for a 2-core CPU: sokoban_sft.py's shape.

Demonstrations by the `random` policy, NoThink, 5 turns, 10 actions, replies of up to 24
tokens; 8 rows a step (8 initial states) at lr 2e-4, 10 steps; 16 held-out maps of the run's
own seed evaluated greedily before and after (CPU-sized, not the validation protocol of
record: 512 states of a fixed seed, sampled; docs/evaluation-and-monitoring.md). RL starts
from it with --config.model.init_from=<this workdir>.
"""

from starpo_jax.run.sft import sft_config

SFT_LR = 2e-4


def get_config():
    c = sft_config("frozen_lake", "random", groups=8, group_size=1, reply_tokens=24)
    c.nothink = True
    c.steps = 10
    c.optim.actor_lr = SFT_LR
    c.optim.update(remat=True, micro_batches=2)
    c.rollout.update(cache_dtype="float32", chunks=1)  # rollout-only knobs: nothing to choose
    c.eval_every = c.steps
    c.eval.update(envs="frozen_lake", episodes=16, modes="greedy", seed=None)  # CPU-sized
    c.sample_every = c.checkpoint_every = 5
    return c
