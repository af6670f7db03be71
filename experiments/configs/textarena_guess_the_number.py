"""TextArena's GuessTheNumber-v0 with GRPO, CPU-sized (the textarena extra).

    python experiments/run.py --config textarena_guess_the_number.py --workdir runs/ta_guess

A number between 1 and 20, found in up to 6 guesses with TextArena's "higher" / "lower"
answers (the game's own limit is 10): one guess a turn, written like <answer>[7]</answer> or
<answer>7</answer>. Reward and success are TextArena's (1 for the number; the fraction of the
way there when the turns run out); an invalid guess (out of range, repeated) counts as an
invalid action (docs/environments.md, "TextArena"). Any offline single-player game runs with
--config.env.name=textarena:<game id>; textarena comes with pip install "starpo-jax[textarena]".
CPU-sized as quickstart.py: NoThink replies of up to 12 tokens, 4 groups x 8 rollouts; 8
held-out games evaluated greedy after the last step (a CPU-sized greedy evaluation, not the
validation protocol of record).
"""

from starpo_jax.run.schema import config_for


def get_config():
    c = config_for("textarena:GuessTheNumber-v0", "grpo", max_turns=6, max_actions_per_traj=6,
                   groups=4, group_size=8, reply_tokens=12)
    c.env.kwargs = {"observation_tokens": 192}  # the rules (~130 tokens) and each answer fit
    c.nothink = True
    c.steps = 16
    c.optim.actor_lr = 5e-6
    # A CPU-sized evaluation, not the protocol of record (schema.paper_eval): 8 held-out games
    # of the run's own seed, greedy, after the last step only.
    c.eval_every = c.steps
    c.eval.update(episodes=8, modes="greedy", seed=None)
    c.val_before_train = False
    c.sample_every = c.checkpoint_every = 8
    c.keep_checkpoints = 1
    return c
