"""FrozenLake with GRPO for a 2-core CPU; start it from frozen_lake_sft's workdir.

FrozenLake (slippery) sized for a 2-core CPU, shaped like quickstart.py: the CPU run of
the game of frozen_lake_ppo.py / frozen_lake_grpo.py (the paper's setting: hours per step here).

StarPO-S with GRPO, NoThink replies of at most 16 tokens, 4 groups x 8 rollouts, the env's own
5 turns and action budgets, the quickstart's actor learning rate, 20 steps; at the end 8
held-out states of the run's own seed (and the game's out-of-distribution variants) are
evaluated, greedy: a CPU-sized evaluation, not the validation protocol of record (512 states
of a fixed seed, sampled; docs/evaluation-and-monitoring.md). One checkpoint is kept. The
untrained SmolLM2-135M does not answer this game in format (every group's reward std is 0:
nothing to learn), so RL starts from an SFT warm start that teaches it
(model.require_init_from: without --config.model.init_from the run is refused at once, with
these commands; --config.model.require_init_from= runs from the untrained model anyway):

    python experiments/sft.py --config frozen_lake_sft.py --workdir runs/frozen_lake_sft
    python experiments/run.py --config frozen_lake_cpu.py \
        --config.model.init_from=runs/frozen_lake_sft --workdir runs/frozen_lake_rl

(the CPU suite's experiment 2, results/cpu/report.md, at 4 x 4 rollouts and 24-token replies).
"""

from starpo_jax.run.schema import config_for

QUICK_LR = 5e-6  # quickstart.py's actor learning rate


def get_config():
    c = config_for("frozen_lake", "grpo", groups=4, group_size=8, reply_tokens=16)
    c.nothink = True
    c.steps = 20
    c.optim.actor_lr = QUICK_LR
    c.eval_every = c.steps  # once, after the last step
    # A CPU-sized evaluation, not the protocol of record (the defaults, schema.paper_eval: 512
    # states of the fixed val seed, sampled then greedy, also before step 1): 8 held-out states of
    # the run's own seed, greedy, after the last step only.
    c.eval.update(episodes=8, modes="greedy", seed=None)
    c.val_before_train = False
    c.sample_every = c.checkpoint_every = 10
    c.keep_checkpoints = 1
    c.model.require_init_from = "frozen_lake_sft.py"  # refused without model.init_from
    return c
