"""The tests' tiny shapes, shared by the test files: tiny_config (Bandit on the tiny-random
model), tiny_experiment (built and compiled once per process) and the reproduction suites at
that scale (what the suite's tests run through starpo_jax.analysis.reproduce)."""

from __future__ import annotations

import functools

import jax
import numpy as np

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


def assert_same_adam_weights(got, want, lr: float, steps: int, close: float,
                             share: float = 0.02) -> None:
    """Weights after the same `steps` Adam(W) steps at `lr` from the same start, from gradients
    computed two ways that agree up to float rounding. Adam moves each element by about lr
    whatever its gradient's size, so weights equal to `close` (a few % of lr) mean equal
    gradients, except where an element's gradient is a near-cancelling sum (terms of ~1e-2
    adding up to ~1e-8, near Adam's eps): float32 rounds its sum by ~1e-9, a tenth of it, and
    Adam's step follows. Which elements those are depends on the fusions XLA picks for each
    path (with YNNPACK's elementwise kernels, 0.3-0.5% of a tiny layer's elements were off by
    up to 16% of lr; the gradients themselves agreed to 5e-7 of their largest). At most `share`
    of an array may be off, each within what the steps can move it at all (about lr each); a
    gradient computed wrongly moves most elements' steps."""
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a), np.asarray(b)
        off = np.abs(a - b) > close
        assert off.mean() <= share, f"{off.sum()} of {off.size} weights differ by > {close}"
        np.testing.assert_allclose(a, b, rtol=0, atol=2 * lr * steps)


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
