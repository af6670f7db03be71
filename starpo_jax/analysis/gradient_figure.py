"""The report's figure of RAGEN-2's gradient analysis (config gradient_analysis.*,
starpo_jax.train.gradient_analysis): for each loss component, the gradient norm of each
reward-std bucket (grad_norm/<bucket>/<component>) at the last analysed step, one line per
setting (the mean over its seeds), the buckets' mean reward std in the x labels. A pure
function of the runs' rows, as the rest of starpo_jax.analysis.report."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

COMPONENTS = ("task", "entropy", "kl")
_BUCKET = re.compile(r"^grad_norm/(bucket_\d+|all)/task$")


def last_analysis(rows: Sequence[Mapping[str, float]]) -> tuple[int, dict[str, float]] | None:
    """(step, row) of the last training row holding the analysis' metrics, or None."""
    found = [row for row in rows if row.get("step", 0) >= 1 and any(_BUCKET.match(k) for k in row)]
    return (int(found[-1]["step"]), dict(found[-1])) if found else None


def buckets_of(row: Mapping[str, float]) -> list[str]:
    """The buckets a row logged, bucket_1 .. bucket_n then "all"."""
    names = [m.group(1) for k in row if (m := _BUCKET.match(k))]
    std = sorted((n for n in names if n != "all"), key=lambda n: int(n.split("_")[1]))
    return std + (["all"] if "all" in names else [])


def setting_series(runs: Mapping[int, Sequence[Mapping[str, float]]],
                   ) -> tuple[list[int], list[str], dict[str, np.ndarray], np.ndarray] | None:
    """(each seed's analysed step, the buckets every seed logged, {component: mean over seeds
    per bucket}, mean reward std per bucket) of one setting; None when a seed has none."""
    last = [last_analysis(rows) for _, rows in sorted(runs.items())]
    if not last or None in last:
        return None
    common = [b for b in buckets_of(last[0][1]) if all(f"grad_norm/{b}/task" in r for _, r in last)]
    series = {c: np.array([[r[f"grad_norm/{b}/{c}"] for b in common] for _, r in last]).mean(0)
              for c in COMPONENTS if all(f"grad_norm/{b}/{c}" in r for _, r in last
                                         for b in common)}
    std = np.array([[r.get(f"grad_norm/{b}/reward_std_mean", np.nan) for b in common]
                    for _, r in last]).mean(0)
    return [s for s, _ in last], common, series, std


def gradient_figure(exp: Any) -> Any | None:
    """A Figure, one panel per component, of an ExperimentResult's analysed runs; None when no
    setting ran the analysis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    series = [(s, setting_series(runs)) for s, runs in exp.runs.items()]
    series = [(s, x) for s, x in series if x is not None]
    if not series:
        return None
    components = [c for c in COMPONENTS if any(c in x[2] for _, x in series)]
    names = buckets_of({f"grad_norm/{b}/task": 0 for _, x in series for b in x[1]})
    where = {name: i for i, name in enumerate(names)}
    figure = Figure(figsize=(4.2 * len(components), 3.8), dpi=100)
    FigureCanvasAgg(figure)
    for i, component in enumerate(components):
        axes = figure.add_subplot(1, len(components), i + 1)
        for setting, (steps, buckets, values, std) in series:
            if component not in values:
                continue
            x = [where[b] for b in buckets]
            axes.plot(x, values[component], marker="o", label=f"{exp.label(setting)} (step "
                      f"{'/'.join(map(str, sorted(set(steps))))})")
            for xi, yi, si in zip(x, values[component], std):  # the bucket's mean reward std
                axes.annotate(f"{si:.2f}", (xi, yi), fontsize="xx-small",
                              textcoords="offset points", xytext=(0, 4), ha="center")
        axes.set_xticks(range(len(names)), names, fontsize="x-small")
        axes.set(xlabel="reward-std bucket (points: its mean std)",
                 title=f"grad_norm/<bucket>/{component}")
        axes.title.set_fontsize("small")
        axes.grid(alpha=0.3)
        if i == 0:
            axes.set_ylabel("gradient norm (mean over seeds)")
            axes.legend(fontsize="x-small")
    figure.tight_layout()
    return figure
