"""CoordSokoban StarPO-S PPO for a 2-core CPU, after the world-model SFT start.

The RL half of issue 60's chain (SmolLM2 -> world-model SFT -> StarPO-S), shaped so that each
rollout gives several updates, as the original's do (ppo_mini_batch_size 32 of 128 rows): 4
groups x 8 rollouts of RAGEN's CoordSokoban (5 turns of at most 2 actions, 10 a trajectory),
thinking replies of up to 96 tokens (the world-model replies take at most 90), the uncertainty
filter keeping the 2 groups of highest reward std (16 rows), mini-batches of 4 rows: 4 Adam
steps a rollout, one epoch; clip 0.2 / 0.28, token-mean loss (the original's default), actor
and critic lr 1e-5 on all weights, 30 steps. The world-model probe scores each reply's
<observation> and <prediction> (rollout.world_model: rollout/observation_acc, prediction_acc).
Validation as the original validates, sized for this CPU: 256 held-out levels of the fixed val
seed, one rollout each at temperature 0.5, every 10 steps; the start's numbers are the SFT
run's last evaluation (the same levels, seed and program). The untrained SmolLM2-135M writes
no valid reply here, so RL starts from the warm start (model.require_init_from):

    python experiments/sft.py --config coord_sokoban_sft.py --workdir runs/coord_sokoban_sft
    python experiments/run.py --config coord_sokoban_cpu.py \
        --config.model.init_from=runs/coord_sokoban_sft --workdir runs/coord_sokoban_rl

GRPO (the group mean): --config.algo=grpo --config.advantage.grpo_mode=mean.
"""

from starpo_jax.run.schema import config_for

RL_LR = 1e-5


def get_config():
    c = config_for("coord_sokoban", "ppo", groups=4, group_size=8, reply_tokens=96,
                   world_model=True)
    c.rollout.update(cache_dtype="float32", chunks=1)  # as coord_sokoban_sft.py's evaluations
    c.steps = 30
    c.filter.keep_ratio = 0.5
    c.optim.update(actor_lr=RL_LR, critic_lr=RL_LR, minibatch_rows=4, ppo_epochs=1, remat=True,
                   micro_batches=2)
    c.val_before_train = False  # the start is coord_sokoban_sft's last evaluation
    c.eval_every = 10
    c.eval.update(envs="coord_sokoban", episodes=256, modes="sampled", pass_k=1,
                  temperature=0.5, batch=32)
    c.sample_every = c.checkpoint_every = 10
    c.keep_checkpoints = 1
    c.model.require_init_from = "coord_sokoban_sft.py"  # refused without model.init_from
    return c
