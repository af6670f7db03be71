"""Training on a host env through run.py: reasoning-gym's chain_sum on the tiny model, and a
resumed run repeating an unstopped one (the host rollout's seeds come from the step's key)."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("reasoning_gym")

from starpo_jax import api  # noqa: E402
from starpo_jax.run import host_train, loop as runner  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402


SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."
_EXP = {}


def _experiment() -> api.Experiment:
    if "exp" not in _EXP:
        c = api.config_for("rg_chain_sum", "grpo", groups=2, group_size=2, reply_tokens=4)
        c.model.source = "tiny-random"
        c.nothink = True
        c.host.workers = 2
        c.prompt.update(system="", intro="", turn=SHORT_TURN)
        c.eval.update(episodes=2, pass_k=2)  # evaluated after the last step (eval_every 10)
        _EXP["exp"] = api.build(c)
    return _EXP["exp"]


def _metrics(workdir: Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in lines]


def _train(workdir: Path, steps: int, **kw) -> int:
    exp = _experiment()
    exp.config.steps = steps
    return runner.train(exp, workdir, **kw)


def test_host_env_trains_in_run_and_resumes_exactly(tmp_path):
    exp = _experiment()
    assert isinstance(exp.train_step, host_train.HostTrainStep)
    assert exp.train.rollout.max_turns == 1  # the env's own defaults
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert _train(straight, 2) == 2
    assert _train(stopped, 1) == 1
    assert _train(stopped, 2, resume=True) == 2
    rows = _metrics(straight)
    resumed = _metrics(stopped)
    # Both evaluated their initial weights first (val_before_train: step 0), alike.
    assert rows[0] == resumed[0] and rows[0]["step"] == 0
    assert "val/rg_chain_sum/sampled/success" in rows[0]
    rows, resumed = rows[1:], resumed[1:]
    # The stopped run also evaluated after its last step, 1: the rest of step 1 is the same.
    assert "val/rg_chain_sum/greedy/success" in resumed[0]
    assert {k: v for k, v in resumed[0].items() if not k.startswith("val/")} == rows[0]
    assert resumed[1] == rows[1]
    assert [r["step"] for r in rows] == [1, 2]
    for name in ("train/success", "rollout/reward_std", "actor/entropy", "actor/grad_norm",
                 "host/failed_rows", "host/truncated_observations"):
        assert name in rows[0], name
    assert rows[0]["host/failed_rows"] == 0
    assert rows[0]["rollout/num_turns"] == 1
    assert Checkpoints(straight / "checkpoints", 1, 3).manager.all_steps()[-1] == 2
    # Held-out evaluation after the last step, in both runs alike (deterministic).
    assert rows[1]["val/rg_chain_sum/greedy/success"] in (0.0, 0.5, 1.0)
    assert 0 <= rows[1]["val/rg_chain_sum/sampled/pass@2"] <= 1
    assert "val/rg_chain_sum/greedy/success" not in rows[0]


def test_host_evaluation_is_held_out_and_reads_the_envs_questions():
    exp = _experiment()
    evaluator = api.build_evaluator(exp)
    try:
        assert isinstance(evaluator, host_train.HostEvaluator)
        result = evaluator.evaluate(exp.state.actor)
        again = evaluator.evaluate(exp.state.actor)
        assert result.metrics == again.metrics
        greedy = result.rollouts["rg_chain_sum", "greedy"]
        sampled = result.rollouts["rg_chain_sum", "sampled"]
        assert greedy.tokens.shape[0] == 2 and sampled.tokens.shape[0] == 4
        env = exp.env
        for i, seed in enumerate(evaluator.seeds.tolist()):
            question = env.reset(seed)
            text = exp.tokenizer.decode(greedy.tokens[i, : int(greedy.prompt_lengths[i])])
            assert question in text
            assert question in exp.tokenizer.decode(
                sampled.tokens[2 * i, : int(sampled.prompt_lengths[2 * i])])
        # Success and pass@k from the rollouts (plain numpy, independent of eval_metrics).
        m = result.metrics
        assert m["val/rg_chain_sum/greedy/success"] == float(greedy.success.mean())
        assert m["val/rg_chain_sum/sampled/pass@2"] == float(
            sampled.success.reshape(2, 2).any(axis=1).mean())
        # Greedy rows are argmax: the same seed and params give the same reply under any key.
        other = evaluator.evaluate(exp.state.actor, sample_key=jax.random.PRNGKey(7))
        assert (other.rollouts["rg_chain_sum", "greedy"].tokens == greedy.tokens).all()
        assert "##### rg_chain_sum / greedy: 2 of 2" in evaluator.samples_text(result)
    finally:
        evaluator.close()


def test_host_env_config_mistakes_are_named():
    c = api.config_for("rg_chain_sum", "grpo")
    c.eval.envs = "bandit"
    with pytest.raises(ValueError, match="eval.envs = 'bandit' is invalid; valid: "
                                         r"comma-separated names from \(.*'rg_chain_sum'"):
        api.train_config(c)
    c.eval.envs = ""
    c.host.timeout = -1.0
    with pytest.raises(ValueError, match="host.timeout = -1.0 is invalid"):
        api.train_config(c)
