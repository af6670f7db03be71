"""reasoning-gym's chain_sum with GRPO, CPU-sized (a host env: the envs extra).

    python experiments/run.py --config rg_chain_sum_grpo.py --workdir runs/rg_chain_sum

CPU-sized (quickstart.py's shapes, and a CPU-sized evaluation: 8 held-out questions, not the
validation protocol of record); reasoning-gym comes with pip install "starpo-jax[envs]".
One question per episode ("State the final answer to the following arithmetic problem: 4 - 1 -
7 =", the problem on its own line), one answer, reward = reasoning-gym's score. Keys:
api.default_config; the env pool: host.workers / host.processes / host.timeout.
"""

from starpo_jax.run.schema import config_for


def get_config():
    # CPU-sized as quickstart.py: NoThink answers of up to 16 tokens, 4 groups x 8 rollouts.
    c = config_for("rg_chain_sum", "grpo", groups=4, group_size=8, reply_tokens=16)
    c.nothink = True
    c.steps = 16
    c.optim.actor_lr = 5e-6
    # A CPU-sized evaluation, not the protocol of record (the defaults, schema.paper_eval: 512
    # states of the fixed val seed, sampled then greedy, also before step 1): 8 held-out questions
    # of the run's own seed, greedy and sampled (pass@4), at steps 10 and 16.
    c.eval.update(episodes=8, modes="greedy,sampled", pass_k=4, seed=None)
    c.val_before_train = False
    return c
