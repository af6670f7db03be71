"""starpo_jax.run.monitor on synthetic metric streams: a healthy run stays quiet; an Echo Trap
(reward std and entropy fall while the mean reward holds) alerts at the step a plain numpy
reference predicts, before the reward falls; a reward falling with the std does not alert;
grad-norm spikes; once per episode; warmup; config errors. Then runner.train with a scripted
Experiment: "stop" saves and stops, --resume goes on; "raise_filter" writes its suggestion."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from starpo_jax import api
from starpo_jax.run import loop as runner
from starpo_jax.run.checkpoint import Checkpoints
from starpo_jax.run.monitor import (ALERTS_FILE, GRAD_NORM, REWARD_MEAN, SUGGESTION_FILE, VALID,
                                    CollapseMonitor, MonitorConfig, suggest_keep_ratio)


STD, ENTROPY = "rollout/reward_std", "actor/entropy"
NAMES = {"reward": REWARD_MEAN, "std": STD, "entropy": ENTROPY, "grad": GRAD_NORM, "valid": VALID}
HEALTHY = {"reward": 0.6, "std": 0.4, "entropy": 2.0, "grad": 1.0}


def _rows(n: int, **series) -> list[dict[str, float]]:
    """n steps of metrics; each series (reward, std, entropy, grad) is a constant, a function
    of the 1-based step, or a list; unnamed ones are HEALTHY constants."""
    def value(v, t):
        return v(t) if callable(v) else v[t - 1] if isinstance(v, (list, np.ndarray)) else v

    merged = {**HEALTHY, **series}
    return [{NAMES[k]: float(value(v, t)) for k, v in merged.items()} for t in range(1, n + 1)]


def _decay(base: float, start: int, rate: float):
    """base until step `start`, then base * rate ** (step - start)."""
    return lambda t: base * rate ** max(0, t - start)


def _feed(config: MonitorConfig, rows: list[dict]) -> tuple[list, list[dict]]:
    """(every alert as (kind, step, metric), monitor.metrics() after each step)."""
    monitor, alerts, logged = CollapseMonitor(config), [], []
    for step, row in enumerate(rows, start=1):
        alerts += [(a.kind, a.step, a.metric) for a in monitor.update(step, row)]
        logged.append(monitor.metrics())
    return alerts, logged


def _ema(x, a: float) -> np.ndarray:
    """s_1 = x_1, s_t = a s_{t-1} + (1 - a) x_t, written as one weighted sum (no recursion)."""
    x = np.asarray(x, float)
    t = np.arange(len(x))
    diff = t[:, None] - t[None, :]
    weights = np.where(diff >= 0, (1 - a) * a ** np.maximum(diff, 0), 0.0)
    weights[:, 0] = a ** t
    return weights @ x


def _first_fall(x, a: float, warmup: int, drop: float) -> int:
    """The 1-based step at which the smoothed x first falls below (1 - drop) x its peak."""
    s = _ema(x, a)
    tracked = np.arange(len(s)) >= warmup
    peak = np.maximum.accumulate(np.where(tracked, s, -np.inf))
    return int(np.nonzero(tracked & (s < (1 - drop) * peak))[0][0]) + 1


def test_healthy_run_does_not_alert():
    rng = np.random.default_rng(0)
    n = 80
    rows = _rows(n, reward=np.linspace(0.1, 0.8, n) + rng.normal(0, 0.05, n),
                 std=0.35 + rng.normal(0, 0.05, n), entropy=np.linspace(2.0, 1.7, n),
                 grad=np.exp(rng.normal(0, 0.3, n)))
    alerts, logged = _feed(MonitorConfig(), rows)
    assert alerts == []
    assert all(m["monitor/alert"] == 0.0 for m in logged)


@pytest.mark.parametrize("smoothing", [0.0, 0.5, 0.7])
def test_echo_trap_alerts_before_the_reward_falls(smoothing):
    config = MonitorConfig(smoothing=smoothing)
    std, entropy = _decay(0.4, 10, 0.85), _decay(2.0, 12, 0.9)
    rows = _rows(60, std=std, entropy=entropy, reward=_decay(0.6, 40, 0.8))
    alerts, logged = _feed(config, rows)
    steps = range(1, 61)
    expected = sorted([("echo_trap", _first_fall([std(t) for t in steps], smoothing, 5, 0.5), STD),
                       ("echo_trap", _first_fall([entropy(t) for t in steps], smoothing, 5, 0.5),
                        ENTROPY)], key=lambda a: a[1])
    assert alerts == expected
    assert all(step < 40 for _, step, _ in alerts), "the warning comes before the reward falls"
    np.testing.assert_allclose([m["monitor/reward_std_smoothed"] for m in logged],
                               _ema([std(t) for t in steps], smoothing), rtol=1e-12)
    assert "monitor/reward_std_peak" not in logged[4] and "monitor/reward_std_peak" in logged[5]
    assert logged[expected[0][1] - 1]["monitor/alert"] == 1.0


def test_alert_fields():
    monitor = CollapseMonitor(MonitorConfig(smoothing=0.0))
    rows = _rows(16, std=_decay(0.4, 10, 0.85))
    fired = [a for step, row in enumerate(rows, 1) for a in monitor.update(step, row)]
    [alert] = fired
    assert (alert.kind, alert.step, alert.metric) == ("echo_trap", 15, STD)
    assert alert.value == pytest.approx(0.4 * 0.85 ** 5) and alert.reference == 0.4
    assert "rollout/reward_std fell to 0.177" in alert.message and "56% under" in alert.message


@pytest.mark.parametrize("reward_drop, alerts", [
    (0.2, []),  # the reward falls past 20% (step 12) before the std halves (step 15): no alert
    (1.0, [("echo_trap", 15, STD)]),  # the reward only "drops" below 0: the std fall alerts
])
def test_reward_falling_with_the_std(reward_drop, alerts):
    """Documented rule: when the mean reward has dropped too, the fall is no longer an early
    warning, so it does not alert."""
    fall = _decay(0.4, 10, 0.85)
    rows = _rows(30, std=fall, reward=lambda t: 1.5 * fall(t))
    config = MonitorConfig(smoothing=0.0, reward_drop=reward_drop)
    assert _feed(config, rows)[0] == alerts


@pytest.mark.parametrize("reward, holds", [(-0.11, True), (-0.13, False)])
def test_negative_reward_holds_within_reward_drop_of_its_peak(reward, holds):
    """Peak -0.1, reward_drop 0.2: the reward holds down to -0.1 - 0.2 * 0.1 = -0.12."""
    rows = _rows(20, reward=lambda t: -0.1 if t <= 10 else reward, std=_decay(0.4, 10, 0.5))
    alerts = _feed(MonitorConfig(smoothing=0.0), rows)[0]
    assert alerts == ([("echo_trap", 12, STD)] if holds else [])


def test_grad_norm_spikes():
    rng = np.random.default_rng(1)
    grad = list(1.0 + rng.uniform(-0.1, 0.1, 40))
    grad[2] = 50.0  # in the warmup: no reference yet
    grad[19] = 8.0  # step 20: 8x the median
    grad[29] = math.nan  # step 30: not finite
    alerts, logged = _feed(MonitorConfig(), _rows(40, grad=grad))
    assert alerts == [("grad_spike", 20, GRAD_NORM), ("grad_spike", 30, GRAD_NORM)]
    assert logged[19]["monitor/grad_norm_ref"] == pytest.approx(np.median(grad[9:19]))
    assert "monitor/grad_norm_ref" not in logged[4]


@pytest.mark.parametrize("series, expected_steps", [
    # std halves at step 15 and stays low: one alert
    ({"std": _decay(0.4, 10, 0.85)}, [15]),
    # hovering around the threshold 0.2 does not re-arm (re-arming needs 0.3)
    ({"std": lambda t: 0.4 if t <= 10 else (0.21, 0.19)[t % 2]}, [11]),
    # back to the peak for steps 21-30, then a second fall: a second alert
    ({"std": lambda t: 0.1 if 10 < t <= 20 or t > 30 else 0.4}, [11, 31]),
    # a spike lasting 3 steps, then another one
    ({"grad": lambda t: 9.0 if t in (20, 21, 22, 30) else 1.0}, [20, 30]),
])
def test_alerts_fire_once_per_episode(series, expected_steps):
    alerts = _feed(MonitorConfig(smoothing=0.0), _rows(40, **series))[0]
    assert [step for _, step, _ in alerts] == expected_steps


@pytest.mark.parametrize("warmup, expected", [(0, [6]), (3, [6]), (5, [])])
def test_warmup(warmup, expected):
    """std 1.0 for 5 steps, then 0.3: an alert only if some 1.0 steps come after the warmup."""
    rows = _rows(20, std=lambda t: 1.0 if t <= 5 else 0.3)
    alerts = _feed(MonitorConfig(smoothing=0.0, warmup=warmup), rows)[0]
    assert [step for _, step, _ in alerts] == expected


@pytest.mark.parametrize("steps, valid, expected", [
    # none valid from the start: a notice at once, the alert at the 2nd step in a row, again
    # after a step with a valid reply re-armed it
    (2, [0, 0, 0, 0.5, 0, 0, 0], [(1, False), (2, True), (6, True)]),
    (3, [0.2, 0, 0, 0, 0], [(4, True)]),  # a first step with valid replies: no notice
    (1, [0, 0.1, 0, 0], [(1, True), (3, True)]),  # the alert itself at the first step
    (0, [0, 0, 0], []),  # off
])
def test_no_valid_reply_alerts_at_once(steps, valid, expected):
    """rollout/action_is_valid = 0 for monitor.no_valid_steps steps in a row alerts, with no
    warmup; the first step of a run with none is a notice (acts=False) at once."""
    monitor = CollapseMonitor(MonitorConfig(no_valid_steps=steps))
    fired = [a for step, row in enumerate(_rows(len(valid), valid=valid), 1)
             for a in monitor.update(step, row)]
    assert [(a.step, a.acts) for a in fired] == expected
    assert all((a.kind, a.metric, a.value) == ("no_valid_reply", VALID, 0.0) for a in fired)
    if steps == 2:
        assert fired[0].message.startswith("no reply of the first step was valid "
                                           "(rollout/action_is_valid = 0): the model may not")
        assert fired[1].message.startswith("no reply was valid in 2 steps in a row (steps 1-2), "
                                           "rollout/action_is_valid = 0: the model does not answer")
        assert "SFT warm start" in fired[1].message


@pytest.mark.parametrize("keep_ratio, groups, expected", [
    (1.0, 8, 0.5), (0.25, 8, 0.125), (0.5, 6, 0.25), (0.25, 4, None), (0.5, 3, None)])
def test_suggest_keep_ratio(keep_ratio, groups, expected):
    assert suggest_keep_ratio(keep_ratio, groups) == expected


@pytest.mark.parametrize("key, value, message", [
    ("drop", 1.0, "monitor.drop = 1.0 is invalid; valid: a number in (0.0, 1.0)"),
    ("reward_drop", -0.1, "monitor.reward_drop = -0.1 is invalid; valid: a number in [0.0, 1.0]"),
    ("spike", 1.0, "monitor.spike = 1.0 is invalid; valid: a number in (1.0, 1000000.0]"),
    ("warmup", -1, "monitor.warmup = -1 is invalid; valid: an int >= 0"),
    ("smoothing", 1.0, "monitor.smoothing = 1.0 is invalid; valid: a number in [0.0, 1.0)"),
    ("no_valid_steps", -1, "monitor.no_valid_steps = -1 is invalid; valid: an int >= 0"),
    ("action", "halt", "monitor.action = 'halt' is invalid; valid: one of ('warn', 'stop', "
                       "'raise_filter')"),
    ("enabled", "yes", "monitor.enabled = 'yes' is invalid; valid: True or False"),
])
def test_config_errors_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        MonitorConfig(**{key: value})


@pytest.mark.parametrize("section, message", [
    ({"drop": 1.5}, "monitor.drop = 1.5 is invalid; valid: a number in (0.0, 1.0)"),
    ({"action": "halt"}, "monitor.action = 'halt' is invalid"),
    ({"enabled": "yes"}, "config.monitor.enabled = 'yes' is invalid; valid: True or False"),
    ({"dorp": 0.5}, "unknown config key 'monitor.dorp' (did you mean 'monitor.drop'?)"),
])
def test_train_config_checks_the_monitor_section(section, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        api.train_config({"monitor": section})


class _State(flax.struct.PyTreeNode):
    step: jax.Array


class _ScriptedExperiment:
    """What runner.train uses of an api.Experiment, stepping through scripted metrics."""

    sizes_its_step = False  # no compiled step to size

    def __init__(self, rows: list[dict], **monitor):
        self.rows = rows
        self.config = api.default_config()
        self.config.steps, self.config.checkpoint_every = len(rows), 0
        self.config.eval_every = self.config.sample_every = 0
        self.config.rollout.groups, self.config.filter.keep_ratio = 8, 0.5
        self.config.monitor.update({"smoothing": 0.0, **monitor})
        self.state = self.fresh_state()

    def fresh_state(self) -> _State:
        return _State(step=jnp.zeros((), jnp.int32))

    def estimated_step_seconds(self) -> None:
        return None  # no step-time model of a scripted step

    def step(self) -> dict[str, float]:
        metrics = dict(self.rows[self.steps_done])
        self.state = self.state.replace(step=self.state.step + 1)
        return metrics

    @property
    def steps_done(self) -> int:
        return int(self.state.step)


def _lines(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("timing/")} for row in rows]


TRAP = _rows(30, std=_decay(0.4, 10, 0.85))  # alerts at step 15 (smoothing 0)


@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_stop_saves_stops_and_resume_goes_on(tmp_path, capsys):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert runner.train(_ScriptedExperiment(TRAP), straight) == 30, "'warn' only logs"
    assert runner.train(_ScriptedExperiment(TRAP, action="stop"), stopped) == 15
    out = capsys.readouterr().out
    assert "monitor: echo_trap at step 15: rollout/reward_std fell to" in out
    assert "action 'stop': saving a checkpoint and stopping" in out
    assert Checkpoints(stopped / "checkpoints", 0, 3).latest_step == 15
    rows = _lines(stopped / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 16)) and rows[-1]["monitor/alert"] == 1.0
    [alert] = _lines(stopped / ALERTS_FILE)
    assert (alert["step"], alert["kind"], alert["metric"]) == (15, "echo_trap", STD)

    resumed = _ScriptedExperiment(TRAP, action="stop")
    assert runner.train(resumed, stopped, resume=True) == 30, "the alert that stopped it is spent"
    assert _lines(stopped / "metrics.jsonl") == _lines(straight / "metrics.jsonl")
    assert _lines(stopped / ALERTS_FILE) == _lines(straight / ALERTS_FILE) == [alert]


def test_raise_filter_stops_with_a_suggestion_to_resume_with(tmp_path, capsys):
    assert runner.train(_ScriptedExperiment(TRAP, action="raise_filter"), tmp_path) == 15
    suggestion = json.loads((tmp_path / SUGGESTION_FILE).read_text())
    assert suggestion["override"] == {"filter.keep_ratio": 0.25} and suggestion["step"] == 15
    assert "--resume --config.filter.keep_ratio=0.25 (also in" in capsys.readouterr().out
    resumed = _ScriptedExperiment(TRAP, action="raise_filter")
    resumed.config.filter.keep_ratio = 0.25  # a change --resume accepts, unlike e.g. the seed
    assert runner.train(resumed, tmp_path, resume=True) == 30


def test_no_valid_reply_is_printed_written_and_acted_on_not_its_notice(tmp_path, capsys):
    rows = _rows(4, valid=0.0)
    assert runner.train(_ScriptedExperiment(rows, action="stop"), tmp_path) == 2
    out = capsys.readouterr().out
    assert "monitor: no_valid_reply at step 1: no reply of the first step was valid" in out
    assert "monitor: no_valid_reply at step 2: no reply was valid in 2 steps in a row" in out
    assert "action 'stop': saving a checkpoint and stopping" in out
    written = _lines(tmp_path / ALERTS_FILE)
    assert [(a["step"], a["kind"], a["metric"], a["acts"]) for a in written] == [
        (1, "no_valid_reply", VALID, False), (2, "no_valid_reply", VALID, True)]


def test_disabled_monitor_logs_nothing(tmp_path):
    assert runner.train(_ScriptedExperiment(TRAP, enabled=False, action="stop"), tmp_path) == 30
    assert not any(k.startswith("monitor/") for k in _lines(tmp_path / "metrics.jsonl")[0])
    assert not (tmp_path / ALERTS_FILE).exists()
