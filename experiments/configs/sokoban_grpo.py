"""StarPO-S with GRPO on Sokoban, up to 5 turns (keys and switches: api.default_config)."""

from starpo_jax.api import config_for


def get_config():
    return config_for("sokoban", "grpo")
