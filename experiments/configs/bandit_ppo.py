"""StarPO-S with PPO on single-turn Bandit (keys and switches: api.default_config)."""

from starpo_jax.api import config_for


def get_config():
    return config_for("bandit", "ppo", max_turns=1)
