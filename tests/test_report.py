"""The reproduction report (starpo_jax/analysis/report.py) on hand-made run histories, checked
against values computed here by hand or with numpy: the Echo-Trap half-peak step, mean ± std over
seeds,
the Table-4 before/after table, the CSV round trip, and the figures' lines and bands (inspected
as matplotlib objects before saving). Then the suite itself (starpo_jax.analysis.reproduce on the
tiny suite: tiny-random, 1 setting x 2 seeds x 2 steps, one compile: the step of
tests/helpers/tiny.py's
tiny_experiment, which other test files compile too): run directories, the log, the report, a
re-run that skips finished runs, and an unfinished run resumed from its checkpoint with the same
numbers."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from starpo_jax.analysis import report, reproduce, suite as suites  # noqa: E402
from starpo_jax.algo.failures import FAILURE_KINDS  # noqa: E402
from helpers.tiny import tiny_config, tiny_experiment, tiny_suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _rows(**curves) -> list[dict]:
    """Training rows from metric -> values per step (step 1 first)."""
    length = len(next(iter(curves.values())))
    return [{"step": t + 1, **{m.replace("__", "/"): float(v[t]) for m, v in curves.items()}}
            for t in range(length)]


@pytest.mark.parametrize("values, expected", [
    ([1, 3, 4, 3, 2.5, 1.9, 2.5, 1], 6),      # peak 4 at step 3; 1.9 < 2 at step 6
    ([1, 3, 4, 3, 2.0, 2.5], None),            # 2.0 is half, not below it
    ([0.1, 5, 6], None),                       # the peak is the last step
    ([6, 1, 7, 3.4], 4),                       # the first maximum is 7 (step 3), not 6
    ([0, 0, 0], None),                         # no positive peak
    ([2, 2, 0.5], 3),                          # ties: the first maximum
])
def test_half_peak_step(values, expected):
    steps = np.arange(1, len(values) + 1)
    assert report.half_peak_step(steps, values) == expected
    # On other step numbers (a run logged every 5 steps) the answer is the step, not the index.
    found = report.half_peak_step(steps * 5, values)
    assert found == (None if expected is None else expected * 5)


def _echo_experiment() -> report.ExperimentResult:
    # vanilla: reward std and entropy collapse (seed 2's entropy never halves);
    # StarPO-S: they hold.
    vanilla = {
        0: _rows(rollout__reward_std=[0.4, 0.5, 0.3, 0.2, 0.1],
                 actor__entropy=[2, 1.5, 0.9, 0.5, 0.4],
                 train__success=[0.1, 0.2, 0.3, 0.4, 0.5]),
        1: _rows(rollout__reward_std=[0.6, 0.4, 0.35, 0.29, 0.1],
                 actor__entropy=[2, 2.2, 1.2, 1.0, 0.2],
                 train__success=[0.1, 0.2, 0.3, 0.2, 0.3]),
        2: _rows(rollout__reward_std=[0.2, 0.2, 0.2, 0.05, 0.0],
                 actor__entropy=[1, 0.9, 0.8, 0.7, 0.6],
                 train__success=[0.0, 0.0, 0.1, 0.1, 0.1]),
    }
    starpo_s = {s: _rows(rollout__reward_std=[0.4, 0.4, 0.4, 0.4, 0.4], actor__entropy=[2] * 5,
                         train__success=[0.1 * s] * 5) for s in range(3)}
    return report.ExperimentResult("echo", "Echo", "echo_trap", "about",
                                   {"vanilla": vanilla, "starpo_s": starpo_s},
                                   labels={"vanilla": "StarPO"}, final_steps=2)


def test_echo_trap_table_steps_and_final_success():
    lines = report.echo_trap_table(_echo_experiment()).splitlines()
    # reward std: seed 0 peak 0.5 at step 2 -> 0.2 < 0.25 at step 4; seed 1 peak 0.6 at step 1
    # -> 0.29 < 0.3 at step 4; seed 2 peak 0.2 at step 1 -> 0.05 at step 4.
    # entropy: seed 0 peak 2 at step 1 -> 0.9 < 1 at step 3; seed 1 peak 2.2 at step 2 ->
    # 1.0 < 1.1 at step 4; seed 2 peak 1 -> never below 0.5.
    mean, std = np.mean([3, 4]), np.std([3, 4])
    vanilla_success = [np.mean(v[-2:]) for v in ([0.4, 0.5], [0.2, 0.3], [0.1, 0.1])]
    assert lines[2] == (f"| StarPO | 3/3 seeds: 4.0 ± 0.0 (4, 4, 4) | 2/3 seeds: {mean:.1f} ± "
                        f"{std:.1f} (3, 4, -) | {np.mean(vanilla_success):.3f} ± "
                        f"{np.std(vanilla_success):.3f} |")
    s = [0.0, 0.1, 0.2]
    assert lines[3] == ("| starpo_s | not reached (0/3 seeds) | not reached (0/3 seeds) | "
                        f"{np.mean(s):.3f} ± {np.std(s):.3f} |")


def test_final_table_is_mean_and_population_std_over_seeds():
    rng = np.random.default_rng(0)
    curves = rng.uniform(size=(3, 6))  # 3 seeds x 6 steps
    runs = {s: _rows(train__success=curves[s], actor__entropy=curves[s] * 2) for s in range(3)}
    exp = report.ExperimentResult("e", "E", "ablation", "", {"a": runs}, final_steps=4)
    per_seed = curves[:, -4:].mean(axis=1)
    line = report.final_table(exp, ("train/success", "actor/entropy", "critic/vf_loss"))
    head, _, row = line.splitlines()
    assert head == "| setting | seeds | train/success | actor/entropy |"  # no vf_loss logged
    assert row == (f"| a | 3 | {per_seed.mean():.3f} ± {per_seed.std():.3f} | "
                   f"{2 * per_seed.mean():.3f} ± {2 * per_seed.std():.3f} |")


def _eval_row(step: int, env: str, success: float, valid: float) -> dict:
    kinds = dict.fromkeys(FAILURE_KINDS, 0.0)
    kinds.update(success=success, out_of_budget=1 - success)
    return {"step": step, f"val/{env}/greedy/success": success,
            f"val/{env}/greedy/action_is_valid": valid, f"val/{env}/greedy/states": 512.0,
            **{f"val/{env}/greedy/failure/{k}": v for k, v in kinds.items()}}


def _table4_experiment() -> report.ExperimentResult:
    runs = {}
    for seed, (b, a) in enumerate([(0.1, 0.5), (0.3, 0.7)]):
        rows = [{**_eval_row(0, "sokoban", b, 0.2), **_eval_row(0, "sokoban_large", b / 2, 0.1)}]
        rows += _rows(train__success=[0.2, 0.4], rollout__action_is_valid=[0.5, 0.6])
        rows[-1].update({**_eval_row(2, "sokoban", a, 0.9), **_eval_row(2, "sokoban_large", 0, 1)})
        runs[seed] = rows
    return report.ExperimentResult("mt", "Multi", "table4", "", {"sokoban_ppo": runs})


def test_table4_before_and_after_per_env():
    exp = _table4_experiment()
    assert report.eval_envs_modes(exp) == [("sokoban", "greedy"), ("sokoban_large", "greedy")]
    head, _, row = report.table4(exp).splitlines()
    assert head == ("| setting (greedy, before -> after) | sokoban success | sokoban valid actions"
                    " | sokoban_large success | sokoban_large valid actions |")
    assert row == ("| sokoban_ppo | 0.20 ± 0.10 -> 0.60 ± 0.10 | 0.20 ± 0.00 -> 0.90 ± 0.00 | "
                   "0.10 ± 0.05 -> 0.00 ± 0.00 | 0.10 ± 0.00 -> 1.00 ± 0.00 |")
    assert report.table4(exp, mode="sampled") == "(no sampled evaluations logged)\n"
    # A setting evaluated on an env before training only (the start's evaluation) shows '-'.
    for rows in exp.runs["sokoban_ppo"].values():
        rows[-1] = {k: v for k, v in rows[-1].items() if not k.startswith("val/sokoban_large/")}
    _, _, row = report.table4(exp).splitlines()
    assert row == ("| sokoban_ppo | 0.20 ± 0.10 -> 0.60 ± 0.10 | 0.20 ± 0.00 -> 0.90 ± 0.00 | "
                   "- | - |")
    # Reference rows (one evaluation each) above the settings; '-' where one has no metric.
    exp = dataclasses.replace(exp, references={
        "random policy (sokoban)": {"val/sokoban/greedy/success": 0.125,
                                    "val/sokoban/greedy/action_is_valid": 1.0},
        "SFT start (sokoban)": {"val/sokoban/greedy/success": 0.25}})
    _, _, random_row, sft_row, _ = report.table4(exp).splitlines()
    assert random_row == "| random policy (sokoban) | 0.12 | 1.00 | - | - |"
    assert sft_row == "| SFT start (sokoban) | 0.25 | - | - | - |"


def test_results_csv_round_trip():
    experiments = [_echo_experiment(), _table4_experiment()]
    table = list(csv.DictReader(io.StringIO(report.results_csv(experiments))))
    expected = [(e.name, setting, seed, row) for e in experiments
                for setting, runs in e.runs.items() for seed, rows in sorted(runs.items())
                for row in rows]
    assert len(table) == len(expected) == 2 * 3 * 5 + 2 * 3
    for line, (name, setting, seed, row) in zip(table, expected):
        assert (line["experiment"], line["setting"], int(line["seed"]), int(line["step"])) == \
            (name, setting, seed, row["step"])
        for metric, cell in line.items():
            if "/" in metric:  # floats read back exactly; empty where the row lacks one
                assert (float(cell) == row[metric]) if metric in row else cell == ""


def test_figures_have_a_line_and_band_per_setting_and_the_failure_classes():
    exp = _echo_experiment()
    made = report.figures(exp)
    assert set(made) == {"echo_reward_std.png", "echo_entropy.png", "echo_success.png"}
    axes = made["echo_entropy.png"].axes[0]
    assert [line.get_label() for line in axes.get_lines()] == ["StarPO", "starpo_s"]
    mean = np.mean([[2, 1.5, 0.9, 0.5, 0.4], [2, 2.2, 1.2, 1.0, 0.2], [1, 0.9, 0.8, 0.7, 0.6]], 0)
    np.testing.assert_allclose(axes.get_lines()[0].get_ydata(), mean)
    assert len(axes.collections) == 2  # a min-max band per setting

    table4 = report.figures(_table4_experiment())
    assert set(table4) == {"mt_success.png", "mt_action_is_valid.png",
                           "mt_failures_sokoban_greedy.png", "mt_failures_sokoban_large_greedy.png",
                           "mt_heldout_sokoban_greedy_success.png",
                           "mt_heldout_sokoban_large_greedy_success.png"}
    (heldout,) = table4["mt_heldout_sokoban_greedy_success.png"].axes
    np.testing.assert_array_equal(heldout.get_lines()[0].get_xdata(), [0, 2])  # from step 0
    np.testing.assert_allclose(heldout.get_lines()[0].get_ydata(), [0.2, 0.6])
    (panel,) = table4["mt_failures_sokoban_greedy.png"].axes  # one setting: one panel
    lines = {line.get_label(): line for line in panel.get_lines()}
    assert list(lines) == list(FAILURE_KINDS)
    np.testing.assert_array_equal(lines["success"].get_xdata(), [0, 2])  # before, after step 2
    np.testing.assert_allclose(lines["success"].get_ydata(), [0.2, 0.6])
    np.testing.assert_allclose(lines["out_of_budget"].get_ydata(), [0.8, 0.4])


def test_train_failure_figure_and_think_length_only_when_thinking():
    runs = {s: _rows(**{f"train__failure__{k}": [1 / 6] * 3 for k in FAILURE_KINDS},
                     rollout__think_length=[0, 0, 0]) for s in range(2)}
    exp = report.ExperimentResult("t", "T", "ablation", "", {"a": runs, "b": runs})
    made = report.figures(exp)
    assert set(made) == {"t_failures_train.png"}  # think_length all zero: no figure
    assert [len(a.get_lines()) for a in made["t_failures_train.png"].axes] == [6, 6]


def test_seed_band_keeps_the_steps_every_seed_has():
    runs = {0: _rows(x=[1, 2, 3]), 1: _rows(x=[3, 4])}
    steps, values = report.seed_band(runs, "x")
    np.testing.assert_array_equal(steps, [1, 2])
    np.testing.assert_array_equal(values, [[1, 2], [3, 4]])
    assert report.seed_band(runs, "y") is None


def test_write_report_files(tmp_path):
    paths = report.write_report(tmp_path, [_echo_experiment(), _table4_experiment()],
                                {"commit": "abc1234"})
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# Reproduction report\n\n- commit: abc1234\n")
    assert "## Echo" in text and "## Multi" in text
    assert report.echo_trap_table(_echo_experiment()) in text
    assert report.table4(_table4_experiment()) in text
    pngs = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert pngs == sorted(p.name for p in paths[2:]) and len(pngs) == 9
    for name in pngs:
        assert (tmp_path / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name}](figures/{name})" in text


def test_an_experiment_without_finished_runs_says_so_and_draws_nothing(tmp_path):
    empty = report.ExperimentResult("multi_turn", "2. Multi", "table4", "About it.", {})
    report.write_report(tmp_path, [_echo_experiment(), empty], {"commit": "abc1234"})
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## 2. Multi"):]
    assert section == ("## 2. Multi\n\nAbout it.\n\nNo run of this experiment has finished "
                       "yet: the suite's command continues it.\n")
    assert not any(p.name.startswith("multi_turn") for p in (tmp_path / "figures").iterdir())


# --- the suite (one compile) -----------------------------------------------------------------

def test_plan_estimates_the_cpu_suites_multi_turn_part_within_ten_hours():
    suite = suites.cpu_suite()
    text = suites.plan_text(suite, "cpu")
    estimate = {s.name: suites.estimate_seconds(suite, s, len(seeds))
                for s, seeds in suite.settings()}
    multi_turn = sum(v for name, v in estimate.items() if not name.startswith("bandit"))
    assert 3 * 3600 < multi_turn <= 10 * 3600  # ~6.4 h at the measured step times
    assert text.rstrip().endswith(f"35 runs; estimated wall time "
                                  f"{suites.format_duration(sum(estimate.values()))}")
    # Experiment 3's keep 0.25 is experiment 1's StarPO-S: trained once, with seeds 0, 1, 2;
    # experiment 4's GRPO is experiment 2's. The SFT starts come first, seed 0 only.
    settings = suite.settings()
    seeds = {s.name: seeds for s, seeds in settings}
    assert seeds["bandit_starpo_s"] == (0, 1, 2) and seeds["bandit_std_rev"] == (0, 1)
    assert seeds["sokoban_grpo_s"] == (0, 1, 2) and seeds["sokoban_gigpo_s"] == (0, 1, 2)
    assert [s.name for s, _ in settings[:2]] == ["sokoban_sft", "frozen_lake_sft"]
    assert seeds["sokoban_sft"] == (0,)
    # Every multi-turn run meets the SFT run's held-out states.
    assert {s.config(seed).eval.seed for s, ss in settings for seed in ss
            if not s.name.startswith("bandit")} == {0}


def test_plan_of_a_resumed_suite_counts_finished_runs_and_what_is_left():
    """Finished runs are counted per setting and the estimate of the unfinished ones is shown
    beside the total (a setting with every seed done adds nothing to it)."""
    suite = suites.cpu_suite()
    done = {("sokoban_sft", 0), ("sokoban_grpo_s", 0), ("sokoban_grpo_s", 2)}
    text = suites.plan_text(suite, "cpu", lambda s, seed: (s, seed) in done)
    estimate = {s.name: (s, seeds) for s, seeds in suite.settings()}
    grpo, seeds = estimate["sokoban_grpo_s"]
    assert seeds == (0, 1, 2)
    line = next(x for x in text.splitlines() if x.startswith("  sokoban_grpo_s:"))
    assert line.endswith(f"-> {suites.format_duration(suites.estimate_seconds(suite, grpo, 3))}"
                         " (2 of 3 finished)")
    total = sum(suites.estimate_seconds(suite, s, len(ss)) for s, ss in suite.settings())
    left = total - suites.estimate_seconds(suite, estimate["sokoban_sft"][0], 1) \
        - suites.estimate_seconds(suite, grpo, 3) + suites.estimate_seconds(suite, grpo, 1)
    assert text.rstrip().endswith(f"35 runs, 3 finished; estimated wall time "
                                  f"{suites.format_duration(total)}, "
                                  f"{suites.format_duration(left)} of it left")


def test_only_trains_the_named_experiments_and_refuses_unknown_names(tmp_path):
    ablation = suites.cpu_suite().only(["filter_ablation"])
    assert [(s.name, seeds) for s, seeds in ablation.settings()] == [
        ("bandit_keep_1.0", (0, 1)), ("bandit_keep_0.5", (0, 1)), ("bandit_starpo_s", (0, 1)),
        ("bandit_std_rev", (0, 1))]
    with pytest.raises(ValueError, match="'echo'.*valid: echo_trap, multi_turn, "
                       "echo_trap_sokoban, filter_ablation, gigpo"):
        reproduce.reproduce(suites.cpu_suite(), "cpu", tmp_path, only=["echo"],
                            stream=io.StringIO())
    assert not any(tmp_path.iterdir()), "nothing is trained or written"


class _Clock:
    """time.monotonic stand-in that a stop Event's wait advances (no real sleeping)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Stop:
    def __init__(self, clock, set_after=None):
        self.clock, self.set_after, self.waits = clock, set_after, []

    def wait(self, seconds):
        self.waits.append(seconds)
        self.clock.now += seconds
        return self.set_after is not None and len(self.waits) >= self.set_after

    def is_set(self):
        return False


def _fails(times):
    calls = []

    def train():
        calls.append(1)
        if len(calls) <= times:
            raise MemoryError("the compiled train step would not fit: 9 GiB of 4 GiB free. "
                              "Settings that shrink it: ...")
        return 7
    return train, calls


def test_a_run_waits_for_free_memory_and_says_so():
    clock, lines = _Clock(), []
    train, calls = _fails(2)
    stop = _Stop(clock)
    assert reproduce.waiting_for_memory(train, stop, lines.append, 600, 60, clock) == 7
    assert len(calls) == 3 and stop.waits == [60, 60]
    assert lines[0] == ("  not enough free memory now (the compiled train step would not fit: "
                        "9 GiB of 4 GiB free); waiting 60 s and trying again (waited 0 s of up "
                        "to 10 min)")
    assert "(waited 60 s of up to 10 min)" in lines[1] and len(lines) == 2


def test_the_wait_is_bounded_and_a_stop_ends_it():
    clock = _Clock()
    train, calls = _fails(100)
    with pytest.raises(MemoryError, match=r"9 GiB of 4 GiB free.*\(waited 5 min for free "
                                          r"memory, --memory-wait 5 min\)"):
        reproduce.waiting_for_memory(train, _Stop(clock), lambda _: None, 300, 60, clock)
    assert len(calls) == 6, "tried at 0, 1, .., 5 minutes"
    train, calls = _fails(100)
    with pytest.raises(MemoryError, match=r"free. Settings that shrink it: \.\.\.$"):
        reproduce.waiting_for_memory(train, _Stop(clock), lambda _: None, 0, 60, clock)
    assert len(calls) == 1, "--memory-wait 0: today's stop at once"
    train, calls = _fails(100)
    assert reproduce.waiting_for_memory(train, _Stop(_Clock(), set_after=2), lambda _: None,
                                        3600, 60) is None
    assert len(calls) == 2, "a stop during the wait: the suite stops, resumable"


def test_the_suite_retries_a_run_that_found_too_little_memory(tmp_path, monkeypatch):
    """_train_one's wiring: runner.train raising MemoryError once, then training."""
    exp = tiny_experiment()
    train, calls = _fails(1)
    monkeypatch.setattr(reproduce.runner, "train", lambda *a, **k: (train(), exp.config.steps)[1])
    monkeypatch.setattr(reproduce, "MEMORY_POLL_SECONDS", 0.0)
    monkeypatch.setattr(reproduce.waiting_for_memory, "__defaults__", (0.0, time.monotonic))
    setting = suites.Setting("tiny", "tiny", tiny_config, {})
    lines = []
    assert reproduce._train_one(exp, tmp_path / "run", setting, threading.Event(),
                                lines.append, keep_checkpoints=True, memory_wait=60)
    assert len(calls) == 2 and "not enough free memory now" in lines[0]
    assert json.loads((tmp_path / "run" / "done.json").read_text())["steps"] == exp.config.steps


def test_tee_output_copies_both_file_descriptors_to_the_log(tmp_path):
    log = tmp_path / "suite.log"
    log.write_bytes(b"earlier\n")
    with reproduce.tee_output(log):
        os.write(1, b"to stdout\n")
        os.write(2, b"to stderr\n")
    os.write(1, b"after\n")
    assert log.read_bytes() == b"earlier\nto stdout\nto stderr\n"


def _without(config, *keys) -> dict:
    return {k: v for k, v in config.to_dict().items() if k not in keys}


def _shared_build(config):
    """api.build for the tiny suite: helpers.tiny's tiny_experiment (built and compiled once per
    process, by whichever test file needs it first), for the config's seed as reproduce.py
    derives it for its second seed. The suite's config must be tiny_config's: same program."""
    # (the suite evaluates step 0 itself: val_before_train off, which changes no program)
    ignored = ("seed", "steps", "val_before_train")
    assert _without(config, *ignored) == _without(tiny_config(), *ignored)
    return reproduce.for_seed(tiny_experiment(), config)


def _suite(workdir: Path, **options: bool) -> str:
    out = io.StringIO()
    tiny_experiment()  # built before experiment.build is patched (it calls it)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reproduce.experiment, "build", _shared_build)
        reproduce.reproduce(tiny_suite(), "tiny", workdir, stream=out, **options)
    return out.getvalue()


def _metrics(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # the suite's own run loop end to end: the slow tier (README)
def test_tiny_suite_runs_reports_skips_and_resumes(tmp_path):
    first = _suite(tmp_path, keep_checkpoints=True)
    runs = [tmp_path / "runs" / "tiny_starpo_s" / f"seed_{s}" for s in (0, 1)]
    assert "[run 2/2] tiny_starpo_s seed 1: done in" in first
    for path in runs:
        assert json.loads((path / "done.json").read_text())["steps"] == 2
        assert [r["step"] for r in _metrics(path)] == [1, 2]
    assert _metrics(runs[0]) != _metrics(runs[1]), "seeds differ"
    assert json.loads((runs[1] / "config.json").read_text())["seed"] == 1
    assert (tmp_path / "reproduce.log").exists()  # its content: test_tee_output_...
    table = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert [(r["seed"], r["step"]) for r in table] == [("0", "1"), ("0", "2"), ("1", "1"),
                                                       ("1", "2")]
    text = (tmp_path / "report.md").read_text()
    assert "over 1 invocation(s)" in text and "| setting | reward std below half" in text
    assert (tmp_path / "figures" / "echo_trap_reward_std.png").exists()

    again = _suite(tmp_path)  # nothing left to train: nothing is built
    assert "seed 0: finished earlier, skipped" in again and "seed 1: finished earlier" in again
    assert (tmp_path / "results.csv").read_text() == report.results_csv(
        reproduce.results(tiny_suite(), tmp_path))

    # Seed 1 cut short after step 1: the next invocation resumes it from that checkpoint and
    # gets the numbers of the run never stopped.
    before = _metrics(runs[1])
    (runs[1] / "done.json").unlink()
    shutil.rmtree(runs[1] / "checkpoints" / "2")
    resumed = _suite(tmp_path)
    assert "seed 1: resuming" in resumed and "seed 0: finished earlier" in resumed
    assert _metrics(runs[1]) == before
    assert not (runs[1] / "checkpoints").exists(), "a finished run's checkpoints are deleted"


def test_the_report_names_the_commit_and_ignores_the_suites_own_results(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.csv").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    monkeypatch.setattr(reproduce, "ROOT", tmp_path)
    clean = reproduce._commit()
    assert clean and "uncommitted" not in clean and "unknown" not in clean
    (tmp_path / "results" / "results.csv").write_text("a\nb\n")  # the run rewrote its results
    assert reproduce._commit() == clean
    (tmp_path / "code.py").write_text("x = 2\n")  # the code that ran was not the commit's
    assert reproduce._commit() == f"{clean} (with uncommitted changes)"


def test_heldout_steps_table_over_the_evaluated_steps():
    """Per setting, held-out success at each evaluated step, mean ± std over the seeds that
    evaluated it and each seed's value ('-' where none did), and each seed's gain (its last
    evaluation minus step 0); a table4 experiment's section holds one such table per training
    env, with the settings trained on it."""
    exp = _table4_experiment()
    runs = exp.runs["sokoban_ppo"]
    other = {0: [dict(r) for r in runs[0]]}
    other[0].append(_eval_row(4, "sokoban", 0.75, 1.0))
    exp = dataclasses.replace(exp, runs={"sokoban_ppo": runs, "gigpo": other})
    head, rule, ppo, gigpo = report.heldout_steps_table(exp, "sokoban").splitlines()
    assert head == "| sokoban greedy success at step | 0 | 2 | 4 | gain (last - step 0) |"
    assert rule == "|---|---|---|---|---|"
    assert ppo == ("| sokoban_ppo | 0.20 ± 0.10 (0.10, 0.30) | 0.60 ± 0.10 (0.50, 0.70) | - | "
                   "0.40 ± 0.00 (0.40, 0.40) |")
    assert gigpo == "| gigpo | 0.10 ± 0.00 | 0.50 ± 0.00 | 0.75 ± 0.00 | 0.65 ± 0.00 |"
    assert report.heldout_steps_table(exp, "frozen_lake") == \
        "(no frozen_lake greedy evaluations logged)\n"
    lake = {0: [_eval_row(0, "frozen_lake", 0.25, 1.0), _eval_row(3, "frozen_lake", 0.125, 1.0)]}
    exp = dataclasses.replace(exp, runs={**exp.runs, "lake": lake})
    assert report.training_envs(exp) == ["sokoban", "frozen_lake"]
    assert report.heldout_steps_table(exp, "frozen_lake").splitlines()[2:] == \
        ["| lake | 0.25 ± 0.00 | 0.12 ± 0.00 | -0.12 ± 0.00 |"]  # sokoban's settings left out
    section = report.experiment_markdown(exp, [])
    assert "| sokoban greedy success at step | 0 | 2 | 4 | gain (last - step 0) |" in section
    assert "| frozen_lake greedy success at step | 0 | 3 | gain (last - step 0) |" in section


@pytest.mark.parametrize("linked", [False, True])
def test_a_finished_runs_checkpoints_are_deleted_also_through_a_symlink(tmp_path, linked):
    run = tmp_path / "run"
    run.mkdir()
    store = (tmp_path / "elsewhere" if linked else run / "checkpoints") / "10"
    store.mkdir(parents=True)
    (store / "weights").write_bytes(b"x" * 100)
    if linked:
        (run / "checkpoints").symlink_to(tmp_path / "elsewhere")
    reproduce.delete_checkpoints(run / "checkpoints")
    assert not (run / "checkpoints").exists() and not (run / "checkpoints").is_symlink()
    assert not store.exists()
    (run / "kept.json").write_text("{}")
    reproduce.delete_checkpoints(run / "checkpoints")  # nothing there: nothing happens
    assert (run / "kept.json").exists()
