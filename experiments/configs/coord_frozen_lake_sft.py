"""World-model SFT warm start on CoordFrozenLake (SPA's recipe) for a 2-core CPU.

coord_sokoban_sft.py's recipe on RAGEN's CoordFrozenLake (4x4, slippery,
success_rate 0.8): `random` behaviour moves, SPA's world-model replies (the coordinate lines of
the state, the moves, the lines of the state they led to: on the slippery lake, the state the
slips made), replies of up to 160 tokens (the hole list is written twice: up to ~150). RL
starts from it:

    python experiments/sft.py --config coord_frozen_lake_sft.py \
        --workdir runs/coord_frozen_lake_sft
    python experiments/run.py --config coord_frozen_lake_cpu.py \
        --config.model.init_from=runs/coord_frozen_lake_sft --workdir runs/coord_frozen_lake_rl
"""

from starpo_jax.run.sft import sft_config

SFT_LR = 2e-4
REPLY_TOKENS = 160


def get_config():
    c = sft_config("coord_frozen_lake", "random", groups=8, group_size=1,
                   reply_tokens=REPLY_TOKENS)
    c.sft.reply_format = "world_model"
    c.steps = 60
    c.optim.actor_lr = SFT_LR
    c.optim.update(remat=True, micro_batches=2)
    c.rollout.update(cache_dtype="float32", chunks=1)  # rollout-only knobs: nothing to choose
    c.eval_every = c.steps  # once, after the last step (experiments/sft.py also evaluates before)
    c.eval.update(envs="coord_frozen_lake", episodes=256, modes="sampled", pass_k=1,
                  temperature=0.5, batch=32)
    c.sample_every = c.checkpoint_every = 10
    return c
