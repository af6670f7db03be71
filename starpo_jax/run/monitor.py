"""The collapse monitor ("Echo Trap"): early warnings read off a run's metric stream.

RAGEN's diagnosis of collapse: the reward std and the policy's output entropy fall first, while
the mean reward still holds; then the mean reward plateaus or drops and the gradient norm
spikes. The monitor alerts on the early signs and on the spikes, from host floats only:

    monitor = CollapseMonitor(MonitorConfig(drop=0.5))
    for step, metrics in enumerate(stream, start=1):
        alerts = monitor.update(step, metrics)      # usually []
        metrics.update(monitor.metrics())           # monitor/* keys for the logs

The rules. Each watched series x is smoothed, s_t = a * s_{t-1} + (1 - a) * x_t with
a = `smoothing` (0: raw), so that one noisy step does not fire; its peak is the running maximum
of s over the steps after the first `warmup` (no alert comes before).
- "echo_trap", for rollout/reward_std and for actor/entropy: s < (1 - drop) * peak while the
  smoothed rollout/reward_mean r still holds, r >= r_peak - reward_drop * |r_peak| (|.| so that
  the rule also reads right for negative rewards). When the reward has fallen as well there is
  no alert: the warning would no longer be early, and the reward curve shows the fall.
- "grad_spike": the raw actor/grad_norm g > spike * the median of the GRAD_WINDOW raw grad
  norms before it (a median, so one spike does not raise the bar for the next), or g is not
  finite.
- "skipped_update": the step dropped updates whose loss or gradients were not finite
  (actor/skipped_updates or critic/skipped_updates > 0, train.apply_if); no warmup.
- "no_valid_reply": no reply was valid (rollout/action_is_valid = 0) in `no_valid_steps` steps
  in a row: the model does not answer in the env's format, and nothing is learned; no warmup.
  The run's first step with no valid reply is announced at once, as a notice (acts=False: it
  takes no action), when no_valid_steps > 1.
An alert fires once per episode of its condition: an echo-trap alert re-arms when its series
has climbed back half way, to (1 - drop / 2) * peak (hysteresis, so a series hovering at the
threshold does not fire every other step); a spike alert when g is back under its threshold;
a skipped-update alert after a step that skipped none; a no-valid-reply alert after a step
with a valid reply.

RunMonitor is the run's side (starpo_jax.run.loop.train): alerts on the console and in alerts.jsonl,
the configured action, and the state rebuilt from metrics.jsonl when a run is resumed.
EmptyFilterStop, beside it (with the monitor on or off), is the original's
rollout_filter_empty_stop_steps: filter.empty_stop_steps steps in a row whose filter kept no
group (rollout/kept_groups = 0: nothing to train on) save and stop the run.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any, Mapping, TextIO

# MonitorConfig lives with the other configs (no JAX there).
from starpo_jax.config import ACTIONS, MonitorConfig  # noqa: F401
from starpo_jax.algo.filtering import num_kept_groups
from starpo_jax.run.writers import METRICS_FILE, JsonlWriter
from starpo_jax.train.step import SKIPPED_UPDATES

REWARD_MEAN = "rollout/reward_mean"
VALID = "rollout/action_is_valid"
FALLING = ("rollout/reward_std", "actor/entropy")  # watched for an echo-trap fall
GRAD_NORM = "actor/grad_norm"
GRAD_WINDOW = 10  # grad norms in the spike reference's median
ALERTS_FILE = "alerts.jsonl"
SUGGESTION_FILE = "suggested_overrides.json"


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert. value: the smoothed series (echo_trap) or the raw grad norm (grad_spike);
    reference: the peak it fell from, or the median it spiked over (None if there was none);
    acts: False for a notice, which monitor.action does not act on."""

    kind: str  # "echo_trap" | "grad_spike" | "skipped_update" | "no_valid_reply"
    step: int
    metric: str
    value: float
    reference: float | None
    message: str
    acts: bool = True


@dataclasses.dataclass
class _Series:
    """An EMA-smoothed series and its running peak."""

    smoothed: float | None = None
    peak: float | None = None

    def observe(self, value: float, smoothing: float, track_peak: bool) -> None:
        if not math.isfinite(value):  # a NaN would poison the EMA for good
            return
        self.smoothed = value if self.smoothed is None else (
            smoothing * self.smoothed + (1.0 - smoothing) * value)
        if track_peak:
            self.peak = self.smoothed if self.peak is None else max(self.peak, self.smoothed)


class CollapseMonitor:
    """Fed one metrics dict per step (`update`), returns that step's alerts (rules: module doc).
    Metrics it watches that are missing from a step are skipped; a missing mean reward counts
    as holding."""

    def __init__(self, config: MonitorConfig):
        self.config = config
        self._seen = 0
        self._series = {name: _Series() for name in (*FALLING, REWARD_MEAN)}
        self._armed = {name: True for name in (*FALLING, GRAD_NORM, *SKIPPED_UPDATES, VALID)}
        self._invalid_since: int | None = None  # first step of the current run of no valid reply
        self._grad_norms: collections.deque[float] = collections.deque(maxlen=GRAD_WINDOW)
        self._grad_ref: float | None = None
        self._alerted = False

    def update(self, step: int, metrics: Mapping[str, float]) -> list[Alert]:
        """Takes step `step`'s metrics; returns the alerts that fire on it."""
        self._seen += 1
        past_warmup = self._seen > self.config.warmup
        for name, series in self._series.items():
            if name in metrics:
                series.observe(float(metrics[name]), self.config.smoothing, past_warmup)
        alerts = [self._echo_trap(step, name) for name in FALLING]
        if GRAD_NORM in metrics:
            alerts.append(self._grad_spike(step, float(metrics[GRAD_NORM]), past_warmup))
        alerts += [self._skipped(step, name, float(metrics[name])) for name in SKIPPED_UPDATES
                   if name in metrics]
        if VALID in metrics:
            alerts.append(self._no_valid(step, float(metrics[VALID])))
        fired = [alert for alert in alerts if alert is not None]
        self._alerted = bool(fired)
        return fired

    def metrics(self) -> dict[str, float]:
        """The monitor's view of the last step, for the logs: monitor/alert (1.0 if an alert
        fired), monitor/<series>_smoothed and _peak, monitor/grad_norm_ref (the median)."""
        out = {"monitor/alert": float(self._alerted)}
        for name, series in self._series.items():
            short = name.split("/")[-1]
            if series.smoothed is not None:
                out[f"monitor/{short}_smoothed"] = series.smoothed
            if series.peak is not None:
                out[f"monitor/{short}_peak"] = series.peak
        if self._grad_ref is not None:
            out["monitor/grad_norm_ref"] = self._grad_ref
        return out

    def _reward_holds(self) -> bool:
        reward = self._series[REWARD_MEAN]
        if reward.peak is None:
            return True
        return reward.smoothed >= reward.peak - self.config.reward_drop * abs(reward.peak)

    def _echo_trap(self, step: int, name: str) -> Alert | None:
        series, drop = self._series[name], self.config.drop
        if series.peak is None:
            return None
        if series.smoothed >= (1.0 - drop / 2) * series.peak:
            self._armed[name] = True
        if not (self._armed[name] and series.smoothed < (1.0 - drop) * series.peak
                and self._reward_holds()):
            return None
        self._armed[name] = False
        reward = self._series[REWARD_MEAN]
        holds = (f"while {REWARD_MEAN} holds at {reward.smoothed:.3g} (peak {reward.peak:.3g})"
                 if reward.peak is not None else f"({REWARD_MEAN} not logged)")
        message = (f"{name} fell to {series.smoothed:.3g} (smoothed), "
                   f"{1 - series.smoothed / series.peak:.0%} under its peak {series.peak:.3g}, "
                   f"{holds}: early sign of collapse (Echo Trap)")
        return Alert("echo_trap", step, name, series.smoothed, series.peak, message)

    def _grad_spike(self, step: int, norm: float, past_warmup: bool) -> Alert | None:
        self._grad_ref = (statistics.median(self._grad_norms)
                          if past_warmup and self._grad_norms else None)
        finite, ref, window = math.isfinite(norm), self._grad_ref, len(self._grad_norms)
        spiking = not finite or (ref is not None and ref > 0 and norm > self.config.spike * ref)
        if finite:
            self._grad_norms.append(norm)
        if not spiking:
            self._armed[GRAD_NORM] = True
            return None
        if not self._armed[GRAD_NORM]:
            return None
        self._armed[GRAD_NORM] = False
        if not finite:
            message = f"{GRAD_NORM} = {norm} is not finite"
        else:
            message = (f"{GRAD_NORM} = {norm:.3g} is {norm / ref:.1f}x the median {ref:.3g} of "
                       f"the last {window} steps (threshold {self.config.spike:g}x)")
        return Alert("grad_spike", step, GRAD_NORM, norm, ref, message)


    def _skipped(self, step: int, name: str, count: float) -> Alert | None:
        if count <= 0:
            self._armed[name] = True
            return None
        if not self._armed[name]:
            return None
        self._armed[name] = False
        message = (f"{name} = {count:g}: the loss or gradients were not finite, so those "
                   f"updates were dropped (weights and optimiser state kept)")
        return Alert("skipped_update", step, name, count, None, message)


    def _no_valid(self, step: int, valid: float) -> Alert | None:
        needed = self.config.no_valid_steps
        if not math.isfinite(valid):  # no turn to count: neither valid nor not
            return None
        if valid > 0 or not needed:
            self._invalid_since = None
            self._armed[VALID] = True
            return None
        if self._invalid_since is None:
            self._invalid_since = step
        steps = step - self._invalid_since + 1
        if self._armed[VALID] and steps >= needed:
            self._armed[VALID] = False
            since = f" (steps {self._invalid_since}-{step})" if steps > 1 else ""
            return Alert("no_valid_reply", step, VALID, valid, None,
                         f"no reply was valid in {steps} step{'s' * (steps > 1)} in a row{since}, "
                         f"{VALID} = 0: the model does not answer in the env's format, so nothing "
                         "is learned; an SFT warm start teaches it (model.init_from, "
                         "experiments/sft.py)")
        if self._seen == 1:
            return Alert("no_valid_reply", step, VALID, valid, None,
                         f"no reply of the first step was valid ({VALID} = 0): the model may "
                         f"not answer in the env's format; {needed} such steps in a row alert "
                         "(monitor.no_valid_steps), and an SFT warm start teaches the format "
                         "(model.init_from, experiments/sft.py)", acts=False)
        return None


def suggest_keep_ratio(keep_ratio: float, groups: int) -> float | None:
    """Half of `keep_ratio` (the paper's ladder 1.0 -> 0.5 -> 0.25), or None when the filter
    already keeps a single group of `groups` and cannot be raised."""
    if num_kept_groups(groups, keep_ratio) == 1:
        return None
    return keep_ratio / 2


class RunMonitor:
    """The collapse monitor of one run under `workdir`.

    `observe` feeds a step's metrics to a CollapseMonitor, prints each alert as one console
    line, appends it to alerts.jsonl, returns the monitor/* metrics to log and, when
    monitor.action is not "warn", sets `stop_reason`; the run then saves and stops. The
    compiled step cannot change its filter mid-run (keep_ratio is static), so "raise_filter"
    stops too and writes the halved keep_ratio to suggested_overrides.json:
    `--resume --config.filter.keep_ratio=<it>` continues from the saved step with it.

    A resumed run (first_step > 0) replays metrics.jsonl up to first_step first, so its
    monitor is in the state of a run never stopped: an alert that fired before the stop does
    not fire again on resuming.
    """

    def __init__(self, workdir: Path, config: Any, first_step: int = 0,
                 stream: TextIO | None = None):
        """config: the experiment's ConfigDict (its monitor, vanilla, filter and rollout keys);
        stream: where alerts are printed (None: sys.stdout at the time)."""
        self.config = MonitorConfig(**config.monitor.to_dict())
        self.stop_reason: str | None = None
        self._run, self._workdir, self._stream = config, workdir, stream
        self._monitor = CollapseMonitor(self.config)
        self._file = None
        if not self.config.enabled:
            return
        path = workdir / METRICS_FILE
        if first_step and path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for row in rows:
                if row["step"] <= first_step:
                    self._monitor.update(row["step"], row)
        self._file = JsonlWriter(workdir / ALERTS_FILE, first_step)

    def observe(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """Takes step `step`'s metrics; returns the monitor/* metrics to log with them."""
        if not self.config.enabled:
            return {}
        for alert in self._monitor.update(step, metrics):
            print(f"monitor: {alert.kind} at step {step}: {alert.message}", file=self._stream,
                  flush=True)
            self._file.write(step, {k: v for k, v in dataclasses.asdict(alert).items()
                                    if k != "step"})
            if alert.acts and self.config.action != "warn" and self.stop_reason is None:
                self.stop_reason = self._act(alert)
                print(f"monitor: {self.stop_reason}", file=self._stream, flush=True)
        return self._monitor.metrics()

    def _act(self, alert: Alert) -> str:
        stopping = f"action {self.config.action!r}: saving a checkpoint and stopping"
        if self.config.action == "stop":
            return f"{stopping}; --resume goes on (this alert does not fire again)"
        if self._run.vanilla:
            return (f"{stopping}; vanilla StarPO has no filter to raise (vanilla=True sets "
                    f"keep_ratio 1.0): a StarPO-S run (vanilla=False) filters")
        groups, keep_ratio = self._run.rollout.groups, self._run.filter.keep_ratio
        lower = suggest_keep_ratio(keep_ratio, groups)
        if lower is None:
            return (f"{stopping}; filter.keep_ratio={keep_ratio} already keeps 1 of "
                    f"rollout.groups={groups} groups and cannot be raised")
        flags = f"--resume --config.filter.keep_ratio={lower}"
        suggestion = {"step": alert.step, "alert": alert.kind, "reason": alert.message,
                      "override": {"filter.keep_ratio": lower}, "flags": flags}
        (self._workdir / SUGGESTION_FILE).write_text(json.dumps(suggestion, indent=2) + "\n")
        return (f"{stopping}; to go on with stronger filtering ({num_kept_groups(groups, lower)}"
                f" of {groups} groups kept): {flags} (also in {SUGGESTION_FILE})")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


KEPT_GROUPS = "rollout/kept_groups"
# The original's names (agent_trainer.py): logged every step, and on the step that stops.
EMPTY = "rollout/empty_after_filter"
EMPTY_STEPS = "rollout/consecutive_empty_after_filter_steps"
EMPTY_STOPPED = "early_stopped/empty_filtered_steps"


class EmptyFilterStop:
    """filter.empty_stop_steps (0 = never) of one run under `workdir`: `observe` counts the
    steps in a row whose filter kept no group, returns EMPTY and EMPTY_STEPS to log (and
    EMPTY_STOPPED on the step that stops) and sets `stop_reason` at the limit; the run then
    saves and stops. A resumed run (first_step > 0) counts on from metrics.jsonl, except after
    the step that stopped it: --resume goes on for up to that many such steps again. Steps
    without rollout/kept_groups (SFT) are not counted."""

    def __init__(self, workdir: Path, config: Any, first_step: int = 0, say: bool = True,
                 stream: TextIO | None = None):
        section = config.get("filter")
        self.limit = int(section.get("empty_stop_steps", 0)) if section is not None else 0
        self.count = 0
        self.stop_reason: str | None = None
        self._say, self._stream = say, stream
        path = workdir / METRICS_FILE
        if first_step and path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line) if line.strip() else {}
                if row and row["step"] <= first_step and KEPT_GROUPS in row:
                    self.count = 0 if row.get(EMPTY_STOPPED) else self._next(row)

    def _next(self, metrics: Mapping[str, float]) -> int:
        return self.count + 1 if float(metrics[KEPT_GROUPS]) == 0 else 0

    def observe(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """Takes step `step`'s metrics; returns the metrics to log with them."""
        if KEPT_GROUPS not in metrics:
            return {}
        self.count = self._next(metrics)
        out = {EMPTY: float(self.count > 0), EMPTY_STEPS: float(self.count)}
        if self.limit and self.count >= self.limit and self.stop_reason is None:
            out[EMPTY_STOPPED] = 1.0
            self.stop_reason = (
                f"filter.empty_stop_steps = {self.limit}: the filter kept no group in "
                f"{self.count} steps in a row (steps {step - self.count + 1}-{step}: "
                f"{KEPT_GROUPS} = 0, nothing to train on); saving a checkpoint and stopping. "
                f"--resume goes on for up to {self.limit} more such steps "
                "(--config.filter.empty_stop_steps=0 never stops for this); a filter that keeps "
                "more (filter.include_zero=True, a lower filter.top_p) needs a new run")
            if self._say:
                print(f"early stop: {self.stop_reason}", file=self._stream, flush=True)
        return out
