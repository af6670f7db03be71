"""The README's first run: SmolLM2 learns Bandit on a 2-core CPU in minutes.

StarPO-S with GRPO on single-turn Bandit, sized for a laptop: NoThink replies of at most 12
tokens, 4 groups x 8 rollouts per step. The actor's learning rate is raised from the paper's
1e-6 (200 steps of a 0.5B model) to QUICK_LR, so that a 135M model moves visibly within 16
steps (1e-5 learns the format faster, then settles on the safe arm: entropy and reward std
collapse by step 10); everything else is StarPO-S as in the other config files. At the end,
held-out and BanditTest (unseen arm names) games are evaluated, greedy: 8 states of the run's
own seed, a CPU-sized evaluation, not the validation protocol of record (512 states of a fixed
seed, sampled; docs/evaluation-and-monitoring.md). Only the newest checkpoint is kept.
"""

from starpo_jax.run.schema import config_for

QUICK_LR = 5e-6


def get_config():
    c = config_for("bandit", "grpo", max_turns=1, groups=4, group_size=8, reply_tokens=12)
    c.nothink = True
    c.steps = 16
    c.optim.actor_lr = QUICK_LR
    c.eval_every = c.steps  # once, after the last step
    # A CPU-sized evaluation, not the protocol of record (the defaults, schema.paper_eval: 512
    # states of the fixed val seed, sampled then greedy, also before step 1): 8 held-out states of
    # the run's own seed, greedy, after the last step only.
    c.eval.update(episodes=8, modes="greedy", seed=None)
    c.val_before_train = False
    c.sample_every = c.checkpoint_every = 8
    c.keep_checkpoints = 1  # a checkpoint of SmolLM2 with its Adam moments is 1.4 GiB
    return c
