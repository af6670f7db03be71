"""World-model SFT warm start on CoordSokoban (SPA's recipe) for a 2-core CPU.

RAGEN's CoordSokoban (6x6, one box; the coordinate lines, then the grid map; 5 turns of at most
2 actions, 10 actions a trajectory). Demonstrations by the `random` behaviour policy (1 or 2
uniformly random moves a turn: it does not solve the level, so the task is still RL's), each
reply SPA's world-model reply (starpo_jax/rollout/world_model.py):

    <think> <observation>Targets: (4, 3)\nBoxes: (3, 2)\nPlayer: (2, 2)</observation> I will
    move Down || Left. <prediction>...the coordinates after the moves...</prediction></think>
    <answer>Down || Left</answer>

(at most 90 tokens with SmolLM2's tokenizer; replies get 96). 8 demonstrations a step from 8
fresh levels, all weights at lr 2e-4 (AdamW), rematerialised layers in 2 micro-batches. The
evaluations (before step 1 and after the last) sample at RAGEN's validation temperature 0.5 on
256 held-out levels: success, the valid-reply rate and the probe's observation_acc /
prediction_acc (how often the model's <observation> / <prediction> equal the env's). RL starts
from it:

    python experiments/sft.py --config coord_sokoban_sft.py --workdir runs/coord_sokoban_sft
    python experiments/run.py --config coord_sokoban_cpu.py \
        --config.model.init_from=runs/coord_sokoban_sft --workdir runs/coord_sokoban_rl
"""

from starpo_jax.run.sft import sft_config

SFT_LR = 2e-4


def get_config():
    c = sft_config("coord_sokoban", "random", groups=8, group_size=1, reply_tokens=96)
    c.sft.reply_format = "world_model"
    c.steps = 60
    c.optim.actor_lr = SFT_LR
    c.optim.update(remat=True, micro_batches=2)
    c.rollout.update(cache_dtype="float32", chunks=1)  # rollout-only knobs: nothing to choose
    c.eval_every = c.steps  # once, after the last step (experiments/sft.py also evaluates before)
    c.eval.update(envs="coord_sokoban", episodes=256, modes="sampled", pass_k=1, temperature=0.5,
                  batch=32)
    c.sample_every = c.checkpoint_every = 10
    return c
