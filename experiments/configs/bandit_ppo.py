"""StarPO-S with PPO on single-turn Bandit (keys and switches: api.default_config)."""

from starpo_jax.api import config_for


def get_config():
    c = config_for("bandit", "ppo", max_turns=1)
    c.eval_every = c.sample_every = 10  # held-out + OOD evaluation, sample conversations
    return c
