"""reasoning-gym's chain_sum with GRPO, CPU-sized (a host env: the envs extra).

    python experiments/run.py --config rg_chain_sum_grpo.py --workdir runs/rg_chain_sum

CPU-sized (quickstart.py's shapes); reasoning-gym comes with pip install "starpo-jax[envs]".
One question per episode ("State the final answer to the following arithmetic problem: 4 - 1 -
7 =", the problem on its own line), one answer, reward = reasoning-gym's score. Keys:
api.default_config; the env pool: host.workers / host.processes / host.timeout.
"""

from starpo_jax.run.host_train import config_for


def get_config():
    # CPU-sized as quickstart.py: NoThink answers of up to 16 tokens, 4 groups x 8 rollouts.
    c = config_for("rg_chain_sum", "grpo", groups=4, group_size=8, reply_tokens=16)
    c.nothink = True
    c.steps = 16
    c.optim.actor_lr = 5e-6
    return c
