"""SFT warm start on Sokoban for a 2-core CPU: SmolLM2 learns the answer format.

Demonstrations by the `random` policy (1 to 5 uniformly random moves a turn: the format, not
the task), NoThink, the env's 5 turns and 10-action budget, replies of up to 24 tokens. Each
step trains on 8 demonstrations from 8 fresh initial states (groups of one: 10 steps see 80
levels), all weights at lr 2e-4 (AdamW), rematerialised layers in 2 micro-batches, 10 steps:
sized for a 2-core CPU. Before step 1 and after the last, 16 held-out states are evaluated greedily:
the valid-reply rate (action_is_valid), success and the loss on their demonstrations (a
CPU-sized evaluation of the run's own seed, not the validation protocol of record: 512 states of
a fixed seed, sampled; docs/evaluation-and-monitoring.md). RL then starts from it:
    python experiments/run.py --config sokoban_grpo.py --config.model.init_from=<this workdir>
"""

from starpo_jax.run.sft import sft_config

SFT_LR = 2e-4


def get_config():
    c = sft_config("sokoban", "random", groups=8, group_size=1, reply_tokens=24)
    c.nothink = True
    c.steps = 10
    c.optim.actor_lr = SFT_LR
    c.optim.update(remat=True, micro_batches=2)
    c.rollout.update(cache_dtype="float32", chunks=1)  # rollout-only knobs: nothing to choose
    c.eval_every = c.steps  # once, after the last step (experiments/sft.py also evaluates before)
    c.eval.update(envs="sokoban", episodes=16, modes="greedy", seed=None)  # CPU-sized
    c.sample_every = c.checkpoint_every = 5
    return c
