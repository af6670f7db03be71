"""The functional API: configs are checked (keys and values named) before anything loads, the
switches map onto TrainConfig, every shipped config file is valid, and a built experiment steps
deterministically with the metric names users rely on."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.config import LossConfig, RolloutConfig, TrainConfig  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[1] / "experiments" / "configs"
SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."
ISSUE_METRICS = ("train/success", "rollout/reward_std", "actor/entropy", "actor/grad_norm")


def tiny_config():
    """Bandit, GRPO, tiny-random, 2 x 2 rows, 4-token nothink replies, a short prompt."""
    c = api.config_for("bandit", "grpo", groups=2, group_size=2, max_turns=1, reply_tokens=4)
    c.model.source = "tiny-random"
    c.nothink = True
    c.prompt.update(system="", intro="", turn=SHORT_TURN, verify=20)
    c.optim.actor_lr = 1e-3
    c.checkpoint_every = 1
    return c


@functools.cache
def tiny_experiment() -> api.Experiment:
    """Built (and its step compiled) once per process; tests reset its state."""
    return api.build(tiny_config())


def _with(path: str, value):
    config = tiny_config().to_dict()
    *sections, key = path.split(".")
    target = config
    for name in sections:
        target = target[name]
    target[key] = value
    return config


@pytest.mark.parametrize("path, value, expected", [
    ("loss.clip_hgh", 0.3, "unknown config key 'loss.clip_hgh' (did you mean 'loss.clip_high'?)"),
    ("rolout", {}, "unknown config key 'rolout' (did you mean 'rollout'?)"),
    ("rollout.groups", 0, "rollout.groups = 0 is invalid; valid: an int >= 1"),
    ("filter.keep_ratio", 1.5, "filter.keep_ratio = 1.5 is invalid; valid: a number in (0.0, 1.0]"),
    ("algo", "dpo", "config.algo = 'dpo' is invalid; valid: one of ('ppo', 'grpo')"),
    ("env.name", "sokobam", "config.env.name = 'sokobam' is invalid; valid: one of ("),
    ("model.dtype", "float16", "config.model.dtype = 'float16' is invalid"),
    ("steps", 0, "config.steps = 0 is invalid; valid: an int >= 1"),
    ("eval_every", -1, "config.eval_every = -1 is invalid; valid: an int >= 0"),
    ("progress_after", -5, "config.progress_after = -5 is invalid; valid: an int >= 0"),
    ("loss.clip_low", "big", "config.loss.clip_low = 'big' is invalid; valid: a number"),
])
def test_bad_config_is_rejected_naming_the_key(path, value, expected):
    with pytest.raises(ValueError) as error:
        api.train_config(_with(path, value))
    assert expected in str(error.value)


@pytest.mark.parametrize("vanilla, nothink, keep, kl, clip, mode", [
    (False, False, 0.25, 0.0, (0.2, 0.28), "think"),
    (True, False, 1.0, 0.001, (0.2, 0.2), "think"),
    (False, True, 0.25, 0.0, (0.2, 0.28), "nothink"),
    (True, True, 1.0, 0.001, (0.2, 0.2), "nothink"),
])
def test_switches(vanilla, nothink, keep, kl, clip, mode):
    c = api.config_for("sokoban", "ppo")
    c.vanilla, c.nothink = vanilla, nothink
    t = api.train_config(c)
    clips = (t.loss.clip_low, t.loss.clip_high)
    assert (t.filter.keep_ratio, t.loss.kl_coef, clips) == (keep, kl, clip)
    assert t.rollout.mode == mode


@pytest.mark.parametrize("env", ["bandit", "sokoban", "frozen_lake"])
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_config_files(env, algo):
    spec = importlib.util.spec_from_file_location("cfg", CONFIG_DIR / f"{env}_{algo}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    train = api.train_config(config)
    assert (config.env.name, train.algo) == (env, algo)
    assert config.model.source == "smollm2-135m-instruct"
    assert train.filter.keep_ratio < 1 and train.loss.kl_coef == 0, "StarPO-S is the default"
    assert train.rollout.max_turns == (1 if env == "bandit" else 5)


def test_readme_main_command_names_a_valid_config():
    """The quickstart's first command (README) points at a config file that validates:
    StarPO-S with the embedded model, sized for a CPU."""
    readme = (CONFIG_DIR.parents[1] / "README.md").read_text()
    name = readme.split("python experiments/run.py --config ", 1)[1].split()[0]
    spec = importlib.util.spec_from_file_location("cfg", CONFIG_DIR / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    train = api.train_config(config)
    assert config.model.source == "smollm2-135m-instruct"
    assert train.filter.keep_ratio < 1 and train.loss.kl_coef == 0, "StarPO-S"
    assert train.rollout.groups * train.rollout.group_size <= 32 and config.steps <= 20


def test_train_config_round_trip():
    train = TrainConfig(algo="ppo", rollout=RolloutConfig(groups=3, group_size=2, mode="nothink"),
                        loss=LossConfig(dual_clip=None, kl_coef=0.05))
    config = api.config_from_train_config(train, steps=7, model={"source": "tiny-random"})
    assert api.train_config(config) == train
    assert (config.steps, config.model.source) == (7, "tiny-random")


def test_long_step_prints_its_phases(capsys):
    """A step past progress_after seconds says where it is at each phase's end; a shorter one
    prints nothing."""
    exp = tiny_experiment()
    exp.state = exp.fresh_state()
    try:
        exp.progress.after = 1e9  # no step is that long
        exp.step()
        assert capsys.readouterr().out == ""
        exp.progress.after = 0.0  # every step is long enough
        exp.step()
    finally:
        exp.progress.after = tiny_config().progress_after
    lines = capsys.readouterr().out.splitlines()
    total = tiny_config().steps
    assert [line.split(" done at ")[0] for line in lines] == [
        f"  step 2/{total}: rollout", f"  step 2/{total}: old_logprobs", f"  step 2/{total}: update"]
    assert all(re.fullmatch(r".* done at \d+m\d\ds", line) for line in lines), lines


def test_step_metrics_and_determinism():
    exp = tiny_experiment()
    runs = []
    for _ in range(2):
        exp.state = exp.fresh_state()
        runs.append([exp.step() for _ in range(2)])
    assert runs[0] == runs[1], "same config and seed must give the same numbers"
    first, second = runs[0]
    assert exp.steps_done == 2
    assert set(ISSUE_METRICS) <= set(first)
    assert all(isinstance(v, float) and np.isfinite(v) for v in first.values())
    assert first != second, "step 2 must use its own key (fold_in of the step counter)"
    other_key = exp.step(jax.random.PRNGKey(123))
    assert exp.steps_done == 3 and set(other_key) == set(first)
    assert exp.train == api.train_config(tiny_config())
