"""The reproduction report: run histories in, report.md / results.csv / PNG figures out.

    runs = {"vanilla": {0: rows, 1: rows}, "starpo_s": {...}}   # setting -> seed -> rows
    exp = ExperimentResult("echo_trap", "Echo Trap on Bandit", "echo_trap", "...", runs,
                           labels={"vanilla": "StarPO", "starpo_s": "StarPO-S"})
    paths = write_report(directory, [exp], {"commit": "abc", "machine": "2 CPUs"})

A run's rows are its metrics.jsonl lines (dicts with "step" and metric names; val/ metrics only
on the steps that evaluated) and, for an evaluation before training, a row with step 0 holding
val/ metrics only. Everything here is a pure function of those rows (figures are built as
matplotlib Figure objects, then saved), so the report of a suite can be written again from
its run directories without training anything (experiments/reproduce.py --report-only).

Statistics over seeds are the mean and the population std (numpy's default, as
starpo_jax.analysis.sweep). The Echo-Trap step of a curve is the first step after its peak at which
it is below half that peak (`half_peak_step`); the paper's collapse signature is reward std and
entropy falling while the mean reward holds.

Figures of record: an evaluation of fewer than RECORD_STATES (256) held-out initial states
(val/<env>/<mode>/states, logged with every evaluation) is marked "not a figure of record" in
the held-out tables and figures, as is one whose number of states was not logged (the protocol,
starpo_jax.run.evaluation, evaluates 512).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from starpo_jax.algo.failures import FAILURE_KINDS
from starpo_jax.analysis.gradient_figure import gradient_figure
from starpo_jax.config import RECORD_STATES, VAL_STATES
from starpo_jax.run.writers import format_duration

Row = Mapping[str, float]
Runs = dict[str, dict[int, list[Row]]]  # setting -> seed -> rows (metrics.jsonl lines)
# Over training steps, one figure each (when the runs logged them): the paper's figures.
CURVES = ("rollout/reward_mean", "rollout/reward_std", "actor/entropy", "actor/grad_norm",
          "train/success", "rollout/action_is_valid", "rollout/response_length",
          "rollout/think_length")
# The final-numbers table: mean over each seed's last `final_steps` steps.
FINAL = ("train/success", "rollout/action_is_valid", "rollout/reward_mean",
         "rollout/reward_std", "actor/entropy", "rollout/response_length",
         "rollout/anchor_share")
ECHO_TRAP = ("rollout/reward_std", "actor/entropy")
_VAL = re.compile(r"^val/([^/]+)/([^/]+)/(.+)$")


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """One experiment of a suite: its settings' runs and how to report them.

    kind: "echo_trap" adds the half-peak table, "table4" the before/after evaluation table,
    anything else only the common parts. labels: setting -> legend text (default the name);
    config: setting -> the config keys it sets (shown in the report); wall_seconds: setting ->
    seed -> seconds the run took; references: label -> val/ metrics of one evaluation shown
    above the settings in "table4" (the random policy, the solver, an SFT start).
    """

    name: str
    title: str
    kind: str
    about: str
    runs: Runs
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    config: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    wall_seconds: Mapping[str, Mapping[int, float]] = dataclasses.field(default_factory=dict)
    final_steps: int = 3
    references: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)

    def label(self, setting: str) -> str:
        return self.labels.get(setting, setting)

    @property
    def seeds(self) -> list[int]:
        return sorted({seed for runs in self.runs.values() for seed in runs})


def train_curve(rows: Sequence[Row], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps [T] int, values [T] float64) of `metric` over the training steps (step >= 1)
    that logged it; a val/ metric from step 0 (its evaluation before training) on."""
    first = 0 if metric.startswith("val/") else 1
    kept = [(row["step"], row[metric]) for row in rows if row["step"] >= first and metric in row]
    return (np.array([s for s, _ in kept], dtype=int),
            np.array([v for _, v in kept], dtype=np.float64))


def seed_band(runs: Mapping[int, Sequence[Row]], metric: str,
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps [T], values [S, T]) of `metric` over the steps every seed logged it (a seed
    with fewer steps cuts the band short); None when some seed never logged it."""
    curves = [train_curve(rows, metric) for _, rows in sorted(runs.items())]
    if not curves or any(len(steps) == 0 for steps, _ in curves):
        return None
    common = sorted(set.intersection(*(set(steps.tolist()) for steps, _ in curves)))
    values = [[dict(zip(steps.tolist(), v))[s] for s in common] for steps, v in curves]
    return np.array(common, dtype=int), np.array(values, dtype=np.float64)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, population std) of per-seed values."""
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), float(array.std())


def fmt(stat: tuple[float, float] | None, digits: int = 3) -> str:
    """'0.250 ± 0.050', or '-' for a missing value."""
    return "-" if stat is None else f"{stat[0]:.{digits}f} ± {stat[1]:.{digits}f}"


def final_value(rows: Sequence[Row], metric: str, final_steps: int) -> float | None:
    """The mean of `metric` over a run's last `final_steps` logged training steps."""
    _, values = train_curve(rows, metric)
    return float(values[-final_steps:].mean()) if len(values) else None


def final_stat(runs: Mapping[int, Sequence[Row]], metric: str, final_steps: int,
               ) -> tuple[float, float] | None:
    """mean_std over seeds of final_value; None if a seed lacks the metric."""
    values = [final_value(rows, metric, final_steps) for rows in runs.values()]
    return None if not values or None in values else mean_std(values)


def half_peak_step(steps: Sequence[int], values: Sequence[float]) -> int | None:
    """The first step after the curve's peak (its first maximum) at which the value is below
    half the peak; None when it never is, or the peak is not positive."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return None
    peak = int(np.argmax(values))
    if values[peak] <= 0:
        return None
    below = np.nonzero(values[peak + 1:] < values[peak] / 2)[0]
    return int(steps[peak + 1 + below[0]]) if len(below) else None


def _steps_cell(found: Sequence[int | None]) -> str:
    """'3/3 seeds: 7.0 ± 1.6 (5, 8, 8)' or 'not reached (0/3 seeds)'."""
    hit = [s for s in found if s is not None]
    shown = ", ".join("-" if s is None else str(s) for s in found)
    if not hit:
        return f"not reached (0/{len(found)} seeds)"
    return f"{len(hit)}/{len(found)} seeds: {fmt(mean_std(hit), 1)} ({shown})"


def echo_trap_table(exp: ExperimentResult) -> str:
    """Markdown: per setting, the half-peak step of reward std and of entropy (per seed, and
    mean ± std over the seeds that reached it), and success at the end."""
    head = ("| setting | reward std below half its peak at step | entropy below half its peak "
            f"at step | success, last {exp.final_steps} steps |")
    lines = [head, "|---|---|---|---|"]
    for setting, runs in exp.runs.items():
        cells = [_steps_cell([half_peak_step(*train_curve(runs[s], metric)) for s in sorted(runs)])
                 for metric in ECHO_TRAP]
        success = fmt(final_stat(runs, "train/success", exp.final_steps))
        lines.append(f"| {exp.label(setting)} | {cells[0]} | {cells[1]} | {success} |")
    return "\n".join(lines) + "\n"


def final_table(exp: ExperimentResult, metrics: Sequence[str] = FINAL) -> str:
    """Markdown: per setting, mean ± std over seeds of each metric's last-steps mean."""
    shown = [m for m in metrics if any(final_stat(r, m, exp.final_steps) for r in
                                       exp.runs.values())]
    lines = ["| setting | seeds | " + " | ".join(shown) + " |",
             "|---|---|" + "---|" * len(shown)]
    for setting, runs in exp.runs.items():
        cells = [fmt(final_stat(runs, m, exp.final_steps)) for m in shown]
        lines.append(f"| {exp.label(setting)} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evaluations(rows: Sequence[Row]) -> dict[int, dict[str, float]]:
    """step -> the val/ metrics logged at that step (step 0: before training)."""
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        val = {k: v for k, v in row.items() if k.startswith("val/")}
        if val:
            out.setdefault(int(row["step"]), {}).update(val)
    return out


def eval_envs_modes(exp: ExperimentResult) -> list[tuple[str, str]]:
    """The (env, mode) pairs any run evaluated, in first-seen order."""
    return list(dict.fromkeys(pair for runs in exp.runs.values() for pair in _evaluated(runs)))


def _evaluated(runs: Mapping[int, Sequence[Row]]) -> list[tuple[str, str]]:
    """The (env, mode) pairs one setting's runs evaluated, in first-seen order."""
    found: dict[tuple[str, str], None] = {}
    for rows in runs.values():
        for metrics in evaluations(rows).values():
            for name in metrics:
                match = _VAL.match(name)
                found[match.group(1), match.group(2)] = None
    return list(found)


def _seed_ends(per_seed: Sequence[dict[int, dict[str, float]]], name: str,
               ) -> list[tuple[float | None, float | None]]:
    """Per seed (its `evaluations`), val metric `name` before training (step 0) and at the
    run's last evaluation that logged it; None where it lacks one."""
    ends = []
    for evals in per_seed:
        last = [s for s in evals if s > 0 and name in evals[s]]
        ends.append((evals.get(0, {}).get(name), evals[max(last)][name] if last else None))
    return ends


def _before_after(runs: Mapping[int, Sequence[Row]], name: str,
                  ) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """mean_std over seeds of val metric `name` before training (step 0) and at each run's
    last evaluation; None where a seed lacks it."""
    ends = _seed_ends([evaluations(rows) for rows in runs.values()], name)
    stat = [None if not v or None in v else mean_std(v)
            for v in ([b for b, _ in ends], [a for _, a in ends])]
    return stat[0], stat[1]


def heldout_states(exp: ExperimentResult, env: str, mode: str) -> int | None:
    """The fewest held-out initial states any evaluation of `env` in `mode` averaged over
    (val/<env>/<mode>/states); None when one did not log it (a run before it was logged)."""
    name, found = f"val/{env}/{mode}/states", []
    for runs in exp.runs.values():
        for rows in runs.values():
            for metrics in evaluations(rows).values():
                if f"val/{env}/{mode}/success" in metrics:
                    found.append(metrics.get(name))
    return None if not found or None in found else int(min(found))


def record_note(exp: ExperimentResult, pairs: Sequence[tuple[str, str]]) -> str:
    """"" when every evaluation of the (env, mode) `pairs` is of record (RECORD_STATES held-out
    states or more), else a line saying it is not a figure of record, and why."""
    counts = {pair: heldout_states(exp, *pair) for pair in pairs}
    low = {p: n for p, n in counts.items() if n is None or n < RECORD_STATES}
    if not low:
        return ""
    shown = ", ".join(f"{env} {mode}: {'not logged' if n is None else n}"
                      for (env, mode), n in low.items())
    return (f"**Not a figure of record**: held-out initial states {shown} (a figure of record "
            f"evaluates {RECORD_STATES} or more; the protocol {VAL_STATES}).\n\n")


def table4(exp: ExperimentResult, mode: str = "greedy") -> str:
    """Markdown in the layout of RAGEN's Table 4: a row per setting, per evaluated env (the
    training env and its out-of-distribution variants) success and valid-action rate before
    -> after training, mean ± std over seeds, on the held-out initial states ('-' where a
    setting was not evaluated after training on that env: its before is the start's row);
    first the reference rows (exp.references: one evaluation each, '-' where it lacks the
    metric)."""
    envs = [env for env, m in eval_envs_modes(exp) if m == mode]
    if not envs:
        return f"(no {mode} evaluations logged)\n"
    head = " | ".join(f"{env} success | {env} valid actions" for env in envs)
    note = record_note(exp, [(env, mode) for env in envs])
    lines = [f"{note}| setting ({mode}, before -> after) | {head} |",
             "|---|" + "---|---|" * len(envs)]
    for label, metrics in exp.references.items():
        cells = [f"{metrics[name]:.2f}" if name in metrics else "-" for env in envs
                 for name in (f"val/{env}/{mode}/success", f"val/{env}/{mode}/action_is_valid")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for setting, runs in exp.runs.items():
        cells = []
        for env in envs:
            for metric in ("success", "action_is_valid"):
                before, after = _before_after(runs, f"val/{env}/{mode}/{metric}")
                cells.append("-" if after is None else f"{fmt(before, 2)} -> {fmt(after, 2)}")
        lines.append(f"| {exp.label(setting)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def heldout_steps_table(exp: ExperimentResult, env: str, mode: str = "greedy") -> str:
    """Markdown: held-out success on `env` (`mode`) at every evaluated step (step 0: before
    training), a row per setting that evaluated it, mean ± std over the seeds that evaluated
    that step, then each seed's value in seed order ('-' where none did), and last the gain:
    each seed's last evaluation minus its step 0. When each setting reaches a level, not only
    where it ends, and whether every seed gains."""
    name = f"val/{env}/{mode}/success"
    per_setting = {s: [evaluations(rows) for rows in runs.values()] for s, runs in exp.runs.items()}
    per_setting = {s: evals for s, evals in per_setting.items()
                   if any(name in e[t] for e in evals for t in e)}
    steps = sorted({step for evals in per_setting.values() for e in evals for step in e
                    if name in e[step]})
    if not steps:
        return f"(no {env} {mode} evaluations logged)\n"

    def cell(found: list[float]) -> str:
        seeds = f" ({', '.join(f'{v:.2f}' for v in found)})" if len(found) > 1 else ""
        return fmt(mean_std(found), 2) + seeds if found else "-"

    lines = [f"{record_note(exp, [(env, mode)])}| {env} {mode} success at step | "
             + " | ".join(map(str, steps))
             + " | gain (last - step 0) |", "|---|" + "---|" * (len(steps) + 1)]
    for setting, evals in per_setting.items():
        cells = [cell([e[t][name] for e in evals if name in e.get(t, {})]) for t in steps]
        gains = [a - b for b, a in _seed_ends(evals, name) if None not in (a, b)]
        lines.append(f"| {exp.label(setting)} | " + " | ".join(cells + [cell(gains)]) + " |")
    return "\n".join(lines) + "\n"


def training_envs(exp: ExperimentResult, mode: str = "greedy") -> list[str]:
    """Each setting's training env (the first env its runs evaluated in `mode`: evaluations
    list the training env before its variants), distinct, in first-seen order."""
    firsts = (next((env for env, m in _evaluated(runs) if m == mode), None)
              for runs in exp.runs.values())
    return list(dict.fromkeys(env for env in firsts if env is not None))


def _new_figure(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(figure)
    return figure


def curve_figure(exp: ExperimentResult, metric: str) -> Any | None:
    """A Figure of `metric` over steps: per setting the mean over seeds (a line) and the
    min-max over seeds (a band); None when no setting logged it."""
    from matplotlib.ticker import MaxNLocator

    bands = [(s, seed_band(runs, metric)) for s, runs in exp.runs.items()]
    bands = [(s, b) for s, b in bands if b is not None]
    if not bands:
        return None
    figure = _new_figure((6.4, 4.0))
    axes = figure.add_subplot()
    for setting, (steps, values) in bands:
        (line,) = axes.plot(steps, values.mean(axis=0), marker=".", label=exp.label(setting))
        axes.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(),
                          alpha=0.2, linewidth=0)
    match = _VAL.match(metric)
    low = ""
    if match:
        states = heldout_states(exp, match.group(1), match.group(2))
        if states is None or states < RECORD_STATES:
            low = f"\nnot a figure of record: {states or 'unlogged'} held-out states"
    axes.set(xlabel="step", ylabel=metric, title=f"{exp.title}: {metric} (mean, min-max band "
             f"over seeds {','.join(map(str, exp.seeds))}){low}")
    axes.title.set_fontsize("small")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


def failure_series(runs: Mapping[int, Sequence[Row]], prefix: str,
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """(steps [T], {kind: mean over seeds [T]}) of the `prefix + kind` fractions (prefix
    "train/failure/" or "val/<env>/<mode>/failure/"), over the steps every seed logged them
    (eval rows included: step 0 is before training)."""
    curves = {}
    for kind in FAILURE_KINDS:
        per_seed = [{int(r["step"]): r[prefix + kind] for r in rows if prefix + kind in r}
                    for rows in runs.values()]
        if not per_seed or not all(per_seed):
            return None
        common = sorted(set.intersection(*(set(p) for p in per_seed)))
        curves[kind] = (common, np.array([[p[s] for s in common] for p in per_seed]).mean(0))
    steps = curves[FAILURE_KINDS[0]][0]
    return np.array(steps, dtype=int), {k: v for k, (_, v) in curves.items()}


def failure_figure(exp: ExperimentResult, prefix: str) -> Any | None:
    """A Figure with one panel per setting: each failure class's fraction over steps (mean
    over seeds), from the `prefix + kind` metrics; None when no setting logged them."""
    series = [(s, failure_series(runs, prefix)) for s, runs in exp.runs.items()]
    series = [(s, f) for s, f in series if f is not None]
    if not series:
        return None
    figure = _new_figure((4.0 * len(series), 3.6))
    for i, (setting, (steps, fractions)) in enumerate(series):
        axes = figure.add_subplot(1, len(series), i + 1)
        for kind in FAILURE_KINDS:
            axes.plot(steps, fractions[kind], marker=".", label=kind)
        axes.set(xlabel="step", ylim=(-0.02, 1.02), title=exp.label(setting))
        axes.grid(alpha=0.3)
        if i == 0:
            axes.set_ylabel(f"{prefix}<kind> (mean over seeds)")
            axes.legend(fontsize="x-small")
    figure.tight_layout()
    return figure


def figures(exp: ExperimentResult) -> dict[str, Any]:
    """file name -> Figure of every figure the experiment's runs have data for: the CURVES
    (think_length only when some run thought), held-out success over the evaluated steps and
    val/ failure fractions per evaluated (env, mode), train/ failure fractions, and the
    gradient analysis' norms per reward-std bucket (analysis/gradient_figure.py)."""
    out = {}
    for metric in CURVES:
        if metric == "rollout/think_length" and not any(
                row.get(metric, 0) > 0 for runs in exp.runs.values() for rows in runs.values()
                for row in rows):
            continue
        figure = curve_figure(exp, metric)
        if figure is not None:
            out[f"{exp.name}_{metric.split('/')[-1]}.png"] = figure
    for env, mode in eval_envs_modes(exp):
        figure = curve_figure(exp, f"val/{env}/{mode}/success")
        if figure is not None:
            out[f"{exp.name}_heldout_{env}_{mode}_success.png"] = figure
    prefixes = [("train", "train/failure/")]
    prefixes += [(f"{env}_{mode}", f"val/{env}/{mode}/failure/")
                 for env, mode in eval_envs_modes(exp)]
    for tag, prefix in prefixes:
        figure = failure_figure(exp, prefix)
        if figure is not None:
            out[f"{exp.name}_failures_{tag}.png"] = figure
    figure = gradient_figure(exp)  # RAGEN-2's gradient analysis, when a run logged it
    if figure is not None:
        out[f"{exp.name}_gradient_analysis.png"] = figure
    return out


def results_csv(experiments: Sequence[ExperimentResult]) -> str:
    """Long format, every logged metric of every run: one row per (experiment, setting, seed,
    step) in the given order, columns experiment, setting, seed, step, then every metric name
    sorted (empty where a row lacks it; floats as repr, which reads back exactly)."""
    names = sorted({k for e in experiments for runs in e.runs.values() for rows in runs.values()
                    for row in rows for k in row if k != "step"})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["experiment", "setting", "seed", "step", *names])
    for exp in experiments:
        for setting, runs in exp.runs.items():
            for seed, rows in sorted(runs.items()):
                for row in rows:
                    writer.writerow([exp.name, setting, seed, int(row["step"]),
                                     *(repr(float(row[k])) if k in row else "" for k in names)])
    return out.getvalue()


def experiment_markdown(exp: ExperimentResult, figure_names: Sequence[str]) -> str:
    """One experiment's section of report.md (figures referenced under figures/)."""
    if not exp.runs:  # a suite stopped before any of its runs finished
        return (f"## {exp.title}\n\n{exp.about.strip()}\n\nNo run of this experiment has "
                "finished yet: the suite's command continues it.\n")
    total = sum(s for seeds in exp.wall_seconds.values() for s in seeds.values())
    seeds = ", ".join(map(str, exp.seeds))
    parts = [f"## {exp.title}\n", exp.about.strip() + "\n",
             f"Seeds {seeds}; wall time of its runs {format_duration(total)}.\n",
             "| setting | config | seeds | steps | wall time |", "|---|---|---|---|---|"]
    for setting, runs in exp.runs.items():
        keys = ", ".join(f"`{k}={v}`" for k, v in exp.config.get(setting, {}).items())
        steps = sorted({len([r for r in rows if r["step"] >= 1]) for rows in runs.values()})
        wall = sum(exp.wall_seconds.get(setting, {}).values())
        parts.append(f"| {exp.label(setting)} | {keys or '-'} | {len(runs)} | "
                     f"{'/'.join(map(str, steps))} | {format_duration(wall)} |")
    parts.append(f"\nFinal numbers (mean ± std over seeds of each run's last {exp.final_steps} "
                 "training steps):\n")
    parts.append(final_table(exp))
    if exp.kind == "echo_trap":
        parts.append("Echo Trap: the first step after its peak at which each curve is below half "
                     "that peak (per seed in brackets):\n")
        parts.append(echo_trap_table(exp))
    if exp.kind == "table4":
        parts.append("Held-out initial states, before -> after training (the layout of "
                     "RAGEN's Table 4):\n")
        pairs = eval_envs_modes(exp)
        modes = dict.fromkeys(m for _, m in pairs) or {"greedy": None}
        parts += [table4(exp, mode) for mode in modes]
        trained = training_envs(exp)
        if trained:
            parts.append("Held-out greedy success over training (mean ± std over seeds, each "
                         "seed in brackets; the gain: each seed's last evaluation minus its "
                         "start):\n")
            parts += [heldout_steps_table(exp, env) for env in trained]
    parts += [f"![{name}](figures/{name})" for name in figure_names]
    return "\n".join(parts) + "\n"


def write_report(directory: Path, experiments: Sequence[ExperimentResult],
                 meta: Mapping[str, str]) -> list[Path]:
    """Writes directory/report.md, results.csv and figures/*.png; returns their paths. `meta`
    (commit, machine, suite, wall time, command...) heads the report as a list."""
    figure_dir = directory / "figures"
    figure_dir.mkdir(parents=True, exist_ok=True)
    paths, sections = [], []
    for exp in experiments:
        made = figures(exp)
        for name, figure in made.items():
            figure.savefig(figure_dir / name, metadata={"Software": None})
            paths.append(figure_dir / name)
        sections.append(experiment_markdown(exp, list(made)))
    head = ["# Reproduction report\n"] + [f"- {k}: {v}" for k, v in meta.items()]
    (directory / "report.md").write_text("\n".join(head) + "\n\n" + "\n".join(sections))
    (directory / "results.csv").write_text(results_csv(experiments))
    return [directory / "report.md", directory / "results.csv", *paths]
