"""Training on a host env through run.py: reasoning-gym's chain_sum on the tiny model, and a
resumed run repeating an unstopped one (the host rollout's seeds come from the step's key)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

pytest.importorskip("reasoning_gym")

from starpo_jax import api, host_train  # noqa: E402
from starpo_jax.checkpoint import Checkpoints  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import run  # noqa: E402

SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."
_EXP = {}


def _experiment() -> api.Experiment:
    if "exp" not in _EXP:
        c = host_train.config_for("rg_chain_sum", "grpo", groups=2, group_size=2,
                                  reply_tokens=4)
        c.model.source = "tiny-random"
        c.nothink = True
        c.host.workers = 2
        c.prompt.update(system="", intro="", turn=SHORT_TURN)
        _EXP["exp"] = api.build(c)
    return _EXP["exp"]


def _metrics(workdir: Path) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in lines]


def _train(workdir: Path, steps: int, **kw) -> int:
    exp = _experiment()
    exp.config.steps = steps
    return run.train(exp, workdir, **kw)


def test_host_env_trains_in_run_and_resumes_exactly(tmp_path):
    exp = _experiment()
    assert isinstance(exp.train_step, host_train.HostTrainStep)
    assert exp.train.rollout.max_turns == 1  # the env's own defaults
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert _train(straight, 2) == 2
    assert _train(stopped, 1) == 1
    assert _train(stopped, 2, resume=True) == 2
    rows = _metrics(straight)
    assert _metrics(stopped) == rows
    assert [r["step"] for r in rows] == [1, 2]
    for name in ("train/success", "rollout/reward_std", "actor/entropy", "actor/grad_norm",
                 "host/failed_rows", "host/truncated_observations"):
        assert name in rows[0], name
    assert rows[0]["host/failed_rows"] == 0
    assert rows[0]["rollout/num_turns"] == 1
    assert Checkpoints(straight / "checkpoints", 1, 3).manager.all_steps()[-1] == 2


def test_host_env_config_mistakes_are_named():
    c = host_train.config_for("rg_chain_sum", "grpo")
    c.eval_every = 5
    with pytest.raises(ValueError, match="config.eval_every = 5 is invalid; valid: 0 for host "
                                         "env 'rg_chain_sum'"):
        api.train_config(c)
    c.eval_every = 0
    c.host.timeout = -1.0
    with pytest.raises(ValueError, match="host.timeout = -1.0 is invalid"):
        api.train_config(c)
