"""Running a seeded sweep (experiments/sweep.py): every (setting, seed) of a grid of config
overrides, each setting one compile, its seeds in one vmapped program (or one after another),
into a workdir of finished runs, results.csv, plots and summary.txt (experiments/sweep.py's
docstring lists the files). The grid, the batched step and the tables: starpo_jax.analysis.sweep.

    from starpo_jax.analysis.sweep_run import sweep
    runs = sweep(config, ["filter.keep_ratio=0.25,1.0"], (0, 1, 2), Path("sweeps/keep_ratio"))
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

import jax
import numpy as np
from ml_collections import config_dict

from starpo_jax.run import cli, experiment
from starpo_jax.run.cli import CONFIG_DIR
from starpo_jax.analysis import sweep as lib
from starpo_jax.run.writers import format_duration
from starpo_jax.run.workdir import flat_keys, write_atomically

PLOT_METRICS = ("rollout/reward_mean", "rollout/reward_std", "actor/entropy", "actor/grad_norm",
                "train/success")
RESULTS_FILE, SUMMARY_FILE = "results.csv", "summary.txt"
# Keys that do not change any number: a finished run is reused when only these differ.
OUTPUT_ONLY = ("log_every", "checkpoint_every", "keep_checkpoints")


class Progress:
    """Console lines: the setting, seeds, step, time per step and the sweep's ETA.

    The ETA counts seed-steps (a vmapped step of S seeds is S of them) at the rate measured
    after each setting's first step, plus the mean build-and-compile time for each setting
    still to come.
    """

    def __init__(self, seed_steps: int, programs: int, stream: TextIO):
        self._left, self._programs, self._stream = seed_steps, programs, stream
        self._compiles: list[float] = []
        self._run_time, self._run_seed_steps = 0.0, 0

    def start(self, label: str, steps: int, log_every: int, seeds: Sequence[int]) -> None:
        """A setting (one build and compile) begins: its label, step count, console period."""
        self._label, self._steps, self._every = label, steps, log_every
        self._programs -= 1
        self._last, self._first = time.perf_counter(), True
        print(f"{label} | seeds {','.join(map(str, seeds))} | building and compiling",
              file=self._stream, flush=True)

    def compiled(self) -> None:
        """The setting's batched step is built and compiled ahead of time (its first step is
        then a plain step)."""
        now = time.perf_counter()
        self._compiles.append(now - self._last)
        print(f"{self._label} | built and compiled in {now - self._last:.1f}s",
              file=self._stream, flush=True)
        self._last, self._first = now, False

    def step(self, seeds: tuple[int, ...], t: int, metrics: list[lib.Metrics]) -> None:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        self._left -= len(seeds)
        if self._first:  # compile and step together: the step's share is unknown yet
            self._compiles.append(seconds)
            timing = f"{seconds:.1f}s incl. build and compile"
        else:
            self._run_time += seconds
            self._run_seed_steps += len(seeds)
            timing = f"{seconds:.2f}s/step"
        self._first = False
        if t % self._every and t not in (1, self._steps):
            return
        eta = "?"
        if self._run_seed_steps:
            rate = self._run_time / self._run_seed_steps
            compile_time = float(np.mean(self._compiles)) if self._compiles else 0.0
            eta = format_duration(self._left * rate + self._programs * compile_time)
        shown = " ".join(f"{name.split('/')[-1]}={np.mean([m[name] for m in metrics]):.3g}"
                         for name in PLOT_METRICS if name in metrics[0])
        who = f"seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else f"seed {seeds[0]}"
        print(f"{self._label} | {who} | step {t}/{self._steps} | {timing} | sweep ETA {eta} | "
              f"{shown}", file=self._stream, flush=True)


def _free_bytes() -> int | None:
    """Memory free for a new program on the default device (host RAM on CPU), None if unknown."""
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return None if limit is None else limit - stats.get("bytes_in_use", 0)
    try:  # MemAvailable counts reclaimable page cache, which MemFree does not
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    kib = [int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")]
    return kib[0] * 1024 if kib else None


def _unfit_reason(compiled: Any) -> str | None:
    """Why a compiled batched step would not fit in memory, or None (also when unknown)."""
    stats, free = compiled.memory_analysis(), _free_bytes()
    if stats is None or free is None:
        return None
    need = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
            - stats.alias_size_in_bytes)
    if need <= free:
        return None
    return f"it needs {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are free"


def run_setting(exp: experiment.Experiment, seeds: Sequence[int], *, vmap: bool, progress: Progress,
                save: Callable[[int, list[lib.Metrics]], None], stream: TextIO) -> None:
    """All `seeds` of one built setting, vmapped if asked and possible, else one by one;
    save(seed, metrics per step) as each run finishes (all at once when vmapped)."""
    steps = exp.config.steps
    if vmap:
        try:
            step = lib.compile_batched_step(exp, seeds)
            reason = _unfit_reason(step)
        except Exception as error:  # any failure to vmap or compile: the sequential path remains
            first_line = (str(error).strip().splitlines() or [""])[0]
            reason = f"{type(error).__name__}: {first_line}"
        if reason is None:
            progress.compiled()
            for seed, metrics in lib.run_batched(exp, step, seeds, steps, progress.step).items():
                save(seed, metrics)
            return
        print(f"seeds not vmapped for this setting, running them one after another: {reason}",
              file=stream, flush=True)
    for seed in seeds:
        save(seed, lib.run_sequential(exp, (seed,), steps, progress.step)[seed])


def _run_path(workdir: Path, setting: dict[str, Any], seed: int) -> Path:
    name = lib.setting_name(setting).replace(os.sep, "_")
    return workdir / "runs" / name / f"seed_{seed}.json"


def load_run(path: Path, config: dict) -> list[lib.Metrics] | None:
    """A finished run's metrics, None if it has not finished; ValueError if it was run with a
    config that differs in a key other than OUTPUT_ONLY."""
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    # Compared as JSON text: a tuple in memory is the list it was saved as.
    before, now = ({key: json.dumps(value) for key, value in flat_keys(tree).items()}
                   for tree in (saved["config"], config))
    changed = sorted(key for key in before.keys() | now.keys()
                     if key not in OUTPUT_ONLY and before.get(key) != now.get(key))
    if changed:
        raise ValueError(f"{path} was run with a config that differs in {changed}; use another "
                         "--workdir, or delete that run to redo it")
    return saved["metrics"]


def _saver(workdir: Path, base: config_dict.ConfigDict, setting: dict[str, Any],
           done: dict[int, list[lib.Metrics]]) -> Callable[[int, list[lib.Metrics]], None]:
    """save(seed, metrics): the finished run's file (with its config), and into `done`."""

    def save(seed: int, metrics: list[lib.Metrics]) -> None:
        config = lib.setting_config(base, setting, seed).to_dict()
        path = _run_path(workdir, setting, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written whole or not at all: a sweep killed mid-write leaves no half file behind.
        write_atomically(path, json.dumps({"config": config, "metrics": metrics}) + "\n")
        done[seed] = metrics

    return save


def write_plots(runs: Sequence[lib.Run], seeds: Sequence[int], directory: Path) -> list[Path]:
    """plots/<metric>.png for each of PLOT_METRICS that the runs have: per setting the mean
    over seeds and a shaded min-max band, over steps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in PLOT_METRICS:
        curves = [(run, lib.seed_curves(run.history, seeds, metric)) for run in runs]
        curves = [(run, c) for run, c in curves if c is not None]
        if not curves:
            continue
        figure = Figure(figsize=(6.4, 4.0), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for run, curve in curves:
            steps = np.arange(1, curve.shape[1] + 1)
            label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in run.setting.items())
            (line,) = axes.plot(steps, curve.mean(axis=0), marker=".", label=label or "base")
            axes.fill_between(steps, curve.min(axis=0), curve.max(axis=0),
                              color=line.get_color(), alpha=0.2, linewidth=0)
        axes.set(xlabel="step", ylabel=metric,
                 title=f"{metric}: mean over seeds {','.join(map(str, seeds))}, band min-max")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        path = directory / f"{metric.split('/')[-1]}.png"
        figure.savefig(path, metadata={"Software": None})
        paths.append(path)
    return paths


def _without_phase_marks(config: config_dict.ConfigDict) -> config_dict.ConfigDict:
    config = config.copy_and_resolve_references()
    config.progress_after = 0
    return config


def sweep(base: config_dict.ConfigDict, grid_specs: Sequence[str], seeds: Sequence[int],
          workdir: Path, *, vmap: bool = True, final_steps: int = 5,
          build: Callable[[config_dict.ConfigDict], experiment.Experiment] = experiment.build,
          stream: TextIO = sys.stdout) -> list[lib.Run]:
    """Runs every (setting, seed) of the grid not yet finished in `workdir`, then writes
    results.csv, the plots and summary.txt there. Every setting's config is checked before
    anything is built. Returns the runs in CSV order."""
    grid = lib.parse_grid(grid_specs, base)
    settings = [(s, lib.setting_config(base, s)) for s in lib.settings(grid)]
    finished: list[dict[int, list[lib.Metrics]]] = []
    for setting, _ in settings:
        runs = {seed: load_run(_run_path(workdir, setting, seed),
                               lib.setting_config(base, setting, seed).to_dict())
                for seed in seeds}
        finished.append({seed: m for seed, m in runs.items() if m is not None})
    todo = [[seed for seed in seeds if seed not in done] for done in finished]
    progress = Progress(sum(len(t) * c.steps for t, (_, c) in zip(todo, settings)),
                        sum(1 for t in todo if t), stream)
    for index, ((setting, config), done, left) in enumerate(zip(settings, finished, todo)):
        label = f"setting {index + 1}/{len(settings)} {lib.setting_name(setting)}"
        if not left:
            print(f"{label}: all seeds finished earlier, skipped", file=stream, flush=True)
            continue
        progress.start(label, config.steps, config.log_every, left)
        # The sweep shows its own progress; phase marks (host callbacks) stay out of the
        # vmapped step.
        exp = build(_without_phase_marks(config))
        run_setting(exp, left, vmap=vmap, progress=progress, stream=stream,
                    save=_saver(workdir, base, setting, done))
    runs = [lib.Run(setting, done) for (setting, _), done in zip(settings, finished)]
    workdir.mkdir(parents=True, exist_ok=True)
    write_atomically(workdir / RESULTS_FILE, lib.results_csv([k for k, _ in grid], runs, seeds))
    write_plots(runs, seeds, workdir / "plots")
    steps = min(final_steps, min(c.steps for _, c in settings))
    table = lib.summary_table(runs, seeds, PLOT_METRICS, steps)
    write_atomically(workdir / SUMMARY_FILE, table)
    print(f"\nfinal {steps} steps, mean ± std over seeds {','.join(map(str, seeds))}:\n{table}"
          f"wrote {workdir / RESULTS_FILE}, {workdir / 'plots'}", file=stream, flush=True)
    return runs


def resolve_config_arg(argv: list[str]) -> list[str]:
    """experiments/sweep.py's arguments for absl: as run.py's, a bare --config file name that
    does not exist here points into configs/; --no-vmap is absl's --novmap."""
    return cli.resolve_config_arg(["--novmap" if a == "--no-vmap" else a for a in argv],
                                  CONFIG_DIR)
