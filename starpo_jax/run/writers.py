"""Metric writers for a run's workdir: JSONL, TensorBoard, a console progress line and, as
the optional extra `wandb`, Weights & Biases.

    writer = open_writers(workdir, total_steps=30, first_step=0)
    writer.write(step, {"train/success": 0.25, ...})    # step counts from 1
    writer.close()

Step 0 is the evaluation before training (val/ metrics only): in JSONL, TensorBoard and W&B, not
on the console line (nor in its trend).

Metric names carry their TensorBoard section as a prefix (train/, rollout/, actor/, critic/,
timing/). A resumed run (first_step > 0) first drops the JSONL lines after `first_step`, which
an interrupted run may have written after its last checkpoint, so the file stays one line per
step in order.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, TextIO

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_run_id"  # the workdir's Weights & Biases run, continued by --resume
# Shown on the console line, in this order, when present.
CONSOLE_KEYS = ("train/success", "rollout/action_is_valid", "rollout/reward_mean",
                "rollout/reward_std", "actor/entropy", "actor/grad_norm", "critic/vf_loss",
                "sft/loss")
# Summarised when a process ends: mean over the run's first third of steps -> over its last
# third (a resumed run's earlier steps read back from metrics.jsonl).
TREND_KEYS = ("train/success", "rollout/action_is_valid", "rollout/reward_mean",
              "rollout/reward_std", "actor/entropy")


class MetricWriter(Protocol):
    def write(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlWriter:
    """One JSON object per step: {"step": step, **metrics}, flushed line by line."""

    def __init__(self, path: Path, first_step: int = 0):
        kept = []
        if path.exists():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            if lines and not _is_json(lines[-1]):
                # Cut short by a kill or a full disk; it was written after the last checkpoint,
                # whose step lines all ended before the checkpoint was saved.
                lines.pop()
            kept = [line for line in lines if json.loads(line)["step"] <= first_step]
        path.write_text("".join(line + "\n" for line in kept))
        self._file = path.open("a")

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


class TensorBoardWriter:
    """Scalars via tensorboardX; purge_step discards events after a resumed run's start."""

    def __init__(self, logdir: Path, first_step: int = 0):
        from tensorboardX import SummaryWriter  # imported here: only runs that log need it

        self._writer = SummaryWriter(str(logdir), purge_step=first_step + 1 if first_step else None)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbWriter:
    """Weights & Biases (`pip install -e ".[wandb]"`): one W&B run per workdir, its files under
    <workdir>/wandb, its id kept in <workdir>/wandb_run_id so that a resumed run logs into the
    same W&B run. WANDB_MODE=offline logs without a network (`wandb sync` uploads later)."""

    def __init__(self, workdir: Path, project: str, name: str, config: Mapping[str, Any]):
        import wandb  # imported here: an optional extra, only runs that log to it need it

        id_path = workdir / WANDB_ID_FILE
        run_id = id_path.read_text().strip() if id_path.exists() else secrets.token_hex(4)
        id_path.write_text(run_id + "\n")
        self._run = wandb.init(project=project, name=name or workdir.name, id=run_id,
                               resume="allow", dir=str(workdir), config=dict(config))

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's start time against
    /proc/uptime), None where that cannot be read."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))  # field 22
    except (OSError, ValueError, IndexError):
        return None


def human_duration(seconds: float) -> str:
    """A rough duration as people say it: "0.31 s", "40 s", "18 min", "5.2 h", "4.7 days"."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def format_duration(seconds: float) -> str:
    """3725.0 -> "1:02:05"."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ConsoleProgress:
    """A line every `every` steps: step/total, percent, s/step, ETA and the key metrics.

    The first step of a process includes compilation: it is always shown, with its own time,
    and the rate (and ETA) counts only the steps after it. `close` prints the elapsed time,
    since `started` (a time.perf_counter() value: the process's start for experiments/run.py)
    or else since this object was made, and, after 3 steps or more, `trend_line`: did the run
    learn? `history`: the (step, metrics) of the steps before `first_step` (a resumed run's,
    read_history), so that the trend covers the whole run, as a run never stopped prints it.
    """

    def __init__(self, total_steps: int, first_step: int = 0, every: int = 1,
                 stream: TextIO = sys.stdout, started: float | None = None,
                 history: list[tuple[int, Mapping[str, float]]] = ()):
        self._total, self._first, self._every, self._stream = total_steps, first_step, every, stream
        self._start = time.perf_counter() if started is None else started
        self._since = "this process's start" if started is not None else "logging began"
        self._after_first: tuple[int, float] | None = None
        self._history = [(step, _trend_values(m)) for step, m in history
                         if 0 < step <= first_step]

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if step == 0:  # the evaluation before training (its table is printed): not a step
            return
        now = time.perf_counter()
        self._history.append((step, _trend_values(metrics)))
        if self._after_first is None:
            self._after_first = (step, now)
            timing = f"{now - self._start:.1f}s incl. compile"
        else:
            rate = (now - self._after_first[1]) / max(step - self._after_first[0], 1)
            timing = f"{rate:.2f}s/step ETA {format_duration(rate * (self._total - step))}"
        if step % self._every and step != self._total and step != self._after_first[0]:
            return
        shown = " ".join(f"{k.split('/')[-1]}={metrics[k]:.3g}"
                         for k in CONSOLE_KEYS if k in metrics)
        print(f"step {step}/{self._total} [{100 * step // self._total:3d}%] {timing} | {shown}",
              file=self._stream, flush=True)

    def close(self) -> None:
        elapsed = format_duration(time.perf_counter() - self._start)
        print(f"done in {elapsed} (since {self._since})", file=self._stream, flush=True)
        trend = trend_line(self._history)
        if trend:
            print(trend, file=self._stream, flush=True)


def _trend_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key in TREND_KEYS:
        try:
            out[key] = float(metrics[key])
        except (KeyError, TypeError, ValueError):
            pass
    return out


def read_history(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(step, metrics) of each line of a metrics.jsonl; a line that is not a step's JSON object
    (cut short by a kill) is skipped."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
            out.append((int(row.pop("step")), row))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return out


def trend_line(history: list[tuple[int, Mapping[str, float]]]) -> str:
    """"trend, steps 1-4 -> 9-12: success 0.06 -> 0.41, ..." from (step, metrics) pairs: each
    key's mean over the first third of the steps and over the last third ("" under 3 steps;
    thirds of one step read "trend, step 1 -> step 3: ...")."""
    third = len(history) // 3
    if third == 0:
        return ""
    head, tail = history[:third], history[-third:]
    parts = []
    for key in TREND_KEYS:
        if all(key in m for _, m in head + tail):
            before = sum(m[key] for _, m in head) / third
            after = sum(m[key] for _, m in tail) / third
            parts.append(f"{key.split('/')[-1]} {before:.3g} -> {after:.3g}")
    steps = (f"step {head[0][0]} -> step {tail[0][0]}" if third == 1 else
             f"steps {head[0][0]}-{head[-1][0]} -> {tail[0][0]}-{tail[-1][0]}")
    return f"trend, {steps}: " + ", ".join(parts) if parts else ""


class Writers:
    """Fans each write out to several writers."""

    def __init__(self, writers: list[MetricWriter]):
        self._writers = writers

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        for writer in self._writers:
            writer.write(step, metrics)

    def close(self) -> None:
        for writer in self._writers:
            writer.close()


def open_writers(workdir: Path, total_steps: int, first_step: int = 0, console_every: int = 1,
                 started: float | None = None, more: tuple[MetricWriter, ...] = ()) -> Writers:
    """JSONL + TensorBoard under `workdir`, the console line every `console_every` steps (its
    closing time since `started`, see ConsoleProgress; its trend counts a resumed run's earlier
    steps, read back from metrics.jsonl) and the writers in `more`."""
    workdir.mkdir(parents=True, exist_ok=True)
    jsonl = JsonlWriter(workdir / METRICS_FILE, first_step)  # a resumed run's steps <= first_step
    earlier = read_history(workdir / METRICS_FILE) if first_step else []
    return Writers([jsonl, TensorBoardWriter(workdir / TENSORBOARD_DIR, first_step),
                    ConsoleProgress(total_steps, first_step, console_every, started=started,
                                    history=earlier),
                    *more])
