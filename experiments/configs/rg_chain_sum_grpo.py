"""StarPO-S with GRPO on reasoning-gym's chain_sum, a host env (pip install "starpo-jax[envs]").

    python experiments/run.py --config rg_chain_sum_grpo.py --workdir runs/rg_chain_sum

One question per episode ("State the final answer to the following arithmetic problem:
4 - 1 - 7 ="), one answer, reward = reasoning-gym's score. Keys: api.default_config; the env
pool: host.workers / host.processes / host.timeout.
"""

from starpo_jax.host_train import config_for


def get_config():
    return config_for("rg_chain_sum", "grpo")  # max_turns = max_actions_per_traj = 1
