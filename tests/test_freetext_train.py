"""Countdown and Sudoku train by name: `api.build` compiles a tiny-model StarPO step on each,
the step's metrics are finite, and a hand-written right answer earns the game's reward through
the built experiment's own codec and env."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from starpo_jax import api  # noqa: E402

SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."


def tiny(name: str, turns: int, actions: int):
    c = api.config_for(name, "grpo", groups=2, group_size=2, max_turns=turns, reply_tokens=6,
                       max_actions_per_turn=actions, max_actions_per_traj=turns * actions)
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.check_memory = False
    c.progress_after = 0
    return c


def _answer(exp, text: str):
    tok = exp.tokenizer
    ids = tok.encode(codec_prefix(exp) + text, add_special_tokens=False)
    parsed = exp.codec.parse_reply(jnp.array([ids]), jnp.array([len(ids)]))
    assert bool(parsed.format_ok[0])
    return jax.tree.map(lambda a: a[0], parsed.actions), int(parsed.num_actions[0])


def codec_prefix(exp) -> str:
    return exp.tokenizer.decode(list(exp.codec.forced_prefix_ids))


@pytest.mark.parametrize("name, turns, actions", [
    pytest.param("countdown", 1, 1, marks=pytest.mark.slow),  # the slow tier (README)
    pytest.param("sudoku_4x4", 2, 2, marks=pytest.mark.slow),  # the slow tier (README)
])
def test_trains_by_name(name, turns, actions):
    exp = api.build(tiny(name, turns, actions))
    metrics = exp.step()
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert exp.steps_done == 1 and "train/success" in metrics

    state, _ = jax.jit(exp.env.reset)(jax.random.PRNGKey(9))
    if name == "countdown":
        nums = [int(x) for x in state.nums[: int(state.count)]]
        signs = next(s for s in np.ndindex(*(2,) * len(nums))
                     if sum(x if b else -x for x, b in zip(nums, s)) == int(state.target))
        text = "".join(("+" if b else "-") + str(x) for x, b in zip(nums, signs)).lstrip("+")
        moves, count = _answer(exp, f" {text} </answer>")
        _, ts = exp.env.step(state, jax.tree.map(lambda a: a[0], moves))
        assert count == 1 and float(ts.reward) == 1.0 and bool(ts.extras["success"])
    else:
        solution, initial = np.asarray(state.solution), np.asarray(state.initial)
        (r1, c1), (r2, c2) = np.argwhere(initial == 0)[:2]
        moves, count = _answer(
            exp, f" place {solution[r1, c1]} at row {r1 + 1} col {c1 + 1} || "
                 f"{r2 + 1},{c2 + 1},{solution[r2, c2]} </answer>")
        rewards = []
        for k in range(count):
            state, ts = exp.env.step(state, jax.tree.map(lambda a, k=k: a[k], moves))
            rewards.append(float(ts.reward))
        assert rewards == [1.0, 1.0]
