"""The tests' tiny shapes, shared by the test files: tiny_config (Bandit on the tiny-random
model), tiny_experiment (built and compiled once per process) and the reproduction suites at
that scale (what the suite's tests run through starpo_jax.analysis.reproduce)."""

from __future__ import annotations

import functools

from starpo_jax import api
from starpo_jax.analysis.suite import Setting, Spec, Suite, grid_base, grid_sft_base

SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."
ISSUE_METRICS = ("train/success", "rollout/reward_std", "actor/entropy", "actor/grad_norm")


def tiny_config() -> api.ConfigDict:
    """Bandit, GRPO, tiny-random, 2 x 2 rows, 4-token nothink replies, a short prompt."""
    c = api.config_for("bandit", "grpo", groups=2, group_size=2, max_turns=1, reply_tokens=4)
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.optim.actor_lr = 1e-3
    c.checkpoint_every = 1
    c.steps, c.eval_every, c.sample_every = 30, 0, 0
    return c


@functools.cache
def tiny_experiment() -> api.Experiment:
    """Built (and its step compiled) once per process; tests reset its state."""
    return api.build(tiny_config())


def tiny_suite() -> Suite:
    """tiny_config with 2 steps, one setting and 2 seeds (one compile, the step other tests
    compile)."""
    def base() -> api.ConfigDict:
        c = tiny_config()
        c.steps = 2
        return c
    setting = Setting("tiny_starpo_s", "StarPO-S (tiny-random)", base, {}, step_seconds=0.5)
    spec = Spec("echo_trap", "Echo Trap (tiny smoke run)", "echo_trap",
                "A tiny-random smoke run of the suite's machinery.", (setting,), (0, 1))
    return Suite((spec,), build_seconds=30.0, eval_row_seconds=0.1)


# The tiny multi-turn suite's shape, over experiment 2's configs: tiny-random, 2 x 2 rows, 2
# turns, 4 held-out states, 2 steps evaluated after each.
TINY_GRID = {"model.source": "tiny-random", "rollout.groups": 2, "rollout.group_size": 2,
             "rollout.max_turns": 2, "steps": 2, "eval_every": 1, "sample_every": 0,
             "eval.episodes": 4, "checkpoint_every": 1, "check_memory": False,
             "prompt.system": "", "prompt.intro": "", "prompt.turn": SHORT_TURN,
             "prompt.verify": 20}


def tiny_multi_turn_suite() -> Suite:
    """Experiment 2's machinery at tiny-random scale: Sokoban's SFT start (seed 0) and
    StarPO-S GRPO from it with seeds 0 and 1, evaluated on Sokoban only."""
    sft = Setting("sokoban_sft", "SFT start (sokoban)", grid_sft_base("sokoban"), {}, 0.5,
                  sft=True, final_eval={"modes": "greedy,sampled"})
    grpo = Setting("sokoban_grpo_s", "sokoban StarPO-S GRPO", grid_base("sokoban", "grpo"), {},
                   0.5, eval_before=True, start=sft, final_eval={"modes": "greedy,sampled"})
    spec = Spec("multi_turn", "Multi-turn from an SFT start (tiny)", "table4",
                "A tiny-random run of experiment 2's machinery.", (grpo,), (0, 1))
    return Suite((spec,), build_seconds=30.0, eval_row_seconds=0.1).with_overrides(TINY_GRID)
