"""StarPO-S with GRPO on FrozenLake, up to 5 turns (keys and switches: api.default_config)."""

from starpo_jax.api import config_for


def get_config():
    c = config_for("frozen_lake", "grpo")
    c.eval_every = c.sample_every = 10  # held-out + OOD evaluation, sample conversations
    return c
