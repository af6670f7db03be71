"""Seeded sweeps (starpo_jax/analysis/sweep.py, experiments/sweep.py): the CSV's rows and columns,
the same command gives the same bytes, vmapped seeds == sequential seeds, PNG plots, grid and seed
mistakes named before anything builds, and a re-run skips finished runs. Tiny-random bandit,
2 settings x 2 seeds x 2 steps; compiling dominates the time, so each experiment is built once
and each batched step compiled once for the whole module."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.analysis import sweep as lib, sweep_run as sweep_runner  # noqa: E402
from helpers.tiny import ISSUE_METRICS, tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

GRID = ["filter.keep_ratio=0.5,1.0", "optim.actor_lr=0.001"]
SEEDS = (0, 1)
STEPS = 2
SETTINGS = [f"filter.keep_ratio={r},optim.actor_lr=0.001" for r in (0.5, 1.0)]
PNGS = ("reward_mean", "reward_std", "entropy", "grad_norm", "success")
_BUILT: dict[str, api.Experiment] = {}
_COMPILED: dict[tuple[int, tuple[int, ...]], object] = {}
_compile_batched_step = lib.compile_batched_step


def base_config():
    config = tiny_config()
    config.steps = STEPS
    return config


def cached_build(config) -> api.Experiment:
    """api.build once per distinct config in this process (the sweeps here share settings)."""
    key = config.to_json()
    if key not in _BUILT:
        _BUILT[key] = api.build(config)
    return _BUILT[key]


def cached_compile(exp, seeds):
    """compile_batched_step once per (built experiment, seeds): compiling dominates the time."""
    key = (id(exp), tuple(seeds))
    if key not in _COMPILED:
        _COMPILED[key] = _compile_batched_step(exp, seeds)
    return _COMPILED[key]


def _sweep(workdir: Path, *, build=cached_build, **kw):
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lib, "compile_batched_step", cached_compile)
        runs = sweep_runner.sweep(base_config(), GRID, SEEDS, workdir, build=build, stream=out,
                                  **kw)
    return runs, out.getvalue()


@pytest.fixture(scope="module")
def vmapped(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vmapped")
    runs, output = _sweep(workdir)
    return workdir, runs, output


def _csv(workdir: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO((workdir / sweep_runner.RESULTS_FILE).read_text())))


def test_csv_rows_and_columns(vmapped):
    workdir, runs, output = vmapped
    header, *rows = _csv(workdir)
    keys, metrics = header[:4], header[4:]
    assert keys == ["filter.keep_ratio", "optim.actor_lr", "seed", "step"]
    assert metrics == sorted(metrics) and set(ISSUE_METRICS) <= set(metrics)
    assert [row[:4] for row in rows] == [[ratio, "0.001", str(seed), str(step)]
                                         for ratio in ("0.5", "1.0") for seed in SEEDS
                                         for step in range(1, STEPS + 1)]
    for setting, run in zip(SETTINGS, runs):  # every cell reads back as the run file's float32
        for seed in SEEDS:
            saved = json.loads((workdir / "runs" / setting / f"seed_{seed}.json").read_text())
            assert saved["config"]["seed"] == seed and saved["metrics"] == run.history[seed]
            mine = [r for r in rows if r[0] == setting.split(",")[0].split("=")[1]
                    and r[2] == str(seed)]
            for row, step in zip(mine, saved["metrics"]):
                assert [np.float32(c) for c in row[4:]] == [np.float32(step[m]) for m in metrics]
    lines = [line for line in output.splitlines()
             if line.startswith(f"setting 2/2 {SETTINGS[1]} | ")]
    assert len(lines) == 2 + STEPS and lines[0].endswith(" | seeds 0,1 | building and compiling")
    assert " | built and compiled in " in lines[1]
    assert " | seeds 0,1 | step 2/2 | " in lines[-1]
    assert " | sweep ETA 0:00:00 | reward_mean=" in lines[-1]
    summary = (workdir / sweep_runner.SUMMARY_FILE).read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["setting", *SETTINGS]
    assert "±" in summary[1]


def test_same_command_same_csv(vmapped, tmp_path):
    _sweep(tmp_path)
    for name in (sweep_runner.RESULTS_FILE, sweep_runner.SUMMARY_FILE,
                 f"runs/{SETTINGS[1]}/seed_1.json"):
        assert (tmp_path / name).read_bytes() == (vmapped[0] / name).read_bytes(), name


def test_vmapped_equals_sequential(vmapped):
    """Not bitwise: vmapping changes how XLA orders some reductions (grad norm, entropy differ
    in the 6th-7th digit); the sampled tokens, rewards and counts stay equal."""
    run = vmapped[1][0]
    exp = cached_build(lib.setting_config(base_config(), run.setting))
    sequential = lib.run_sequential(exp, SEEDS, STEPS)
    for seed in SEEDS:
        for a, b in zip(run.history[seed], sequential[seed], strict=True):
            assert a.keys() == b.keys()
            np.testing.assert_allclose([a[k] for k in a], [b[k] for k in a], rtol=1e-4,
                                       atol=1e-5, err_msg=f"seed {seed}")
            exact = [k for k in a if k.startswith(("train/", "rollout/"))
                     and "logprob_diff" not in k]  # the trainer's forward: float rounding
            assert [a[k] for k in exact] == [b[k] for k in exact]


def test_seed_start_is_what_build_derives():
    setting = lib.settings(lib.parse_grid(GRID, base_config()))[0]
    exp = cached_build(lib.setting_config(base_config(), setting))
    state, key = lib.seed_start(exp, exp.config.seed)
    assert np.array_equal(key, exp.key)
    same = jax.tree.map(np.array_equal, state, exp.fresh_state())
    assert all(jax.tree.leaves(same))


def test_pngs(vmapped):
    from matplotlib.image import imread

    paths = sorted((vmapped[0] / "plots").iterdir())
    assert [p.stem for p in paths] == sorted(PNGS)
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = imread(path)
        assert pixels.shape == (400, 640, 4) and pixels.std() > 0, path.name


def test_resume_skips_finished_runs(vmapped, tmp_path):
    workdir = tmp_path / "resumed"
    shutil.copytree(vmapped[0], workdir)
    shutil.rmtree(workdir / "runs" / SETTINGS[1])  # as if stopped during the second setting
    (workdir / sweep_runner.RESULTS_FILE).unlink()
    built = []

    def build(config):
        built.append(config.filter.keep_ratio)
        return cached_build(config)

    _, output = _sweep(workdir, build=build)
    assert built == [1.0], "only the unfinished setting runs again"
    assert f"setting 1/2 {SETTINGS[0]}: all seeds finished earlier, skipped" in output
    assert (workdir / sweep_runner.RESULTS_FILE).read_bytes() == \
        (vmapped[0] / sweep_runner.RESULTS_FILE).read_bytes()

    path = workdir / "runs" / SETTINGS[0] / "seed_1.json"
    saved = json.loads(path.read_text())
    saved["config"]["log_every"] = 7  # output-only: the run is still reused
    path.write_text(json.dumps(saved))
    _sweep(workdir, build=build)
    assert built == [1.0]
    saved["config"]["loss"]["kl_coef"] = 0.5
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"differs in \['loss.kl_coef'\]; use another --workdir"):
        _sweep(workdir, build=build)


def _never_build(config):
    raise AssertionError("a grid mistake must be reported before anything is built")


@pytest.mark.parametrize("grid, message", [
    (["loss.kl_cof=0"], "unknown config key 'loss.kl_cof' (did you mean 'loss.kl_coef'?)"),
    (["lss.kl_coef=0"], "unknown config key 'lss.kl_coef' (did you mean 'loss'?)"),
    (["filter.keep_ratio=0.5,abc"], "'abc' is not of type float (that of config.filter."),
    (["rollout.groups=2.5"], "'2.5' is not of type int"),
    (["nothink=maybe"], "'maybe' is not of type bool"),
    (["rollout=1"], "config.rollout holds a ConfigDict, which a grid cannot set"),
    (["filter.keep_ratio=0.5,1.5"], "filter.keep_ratio = 1.5 is invalid; valid: a number in"),
    (["seed=1,2"], "'seed' cannot be swept (use --seeds)"),
    (["loss.kl_coef"], "expected KEY=VALUE[,VALUE...]"),
    (["loss.kl_coef=0", "loss.kl_coef=1"], "key 'loss.kl_coef' is given twice"),
    (["loss.kl_coef=0,0.0"], "a value is repeated"),
])
def test_grid_mistakes_are_named(grid, message, tmp_path):
    with pytest.raises(ValueError) as error:
        sweep_runner.sweep(base_config(), grid, SEEDS, tmp_path, build=_never_build)
    assert message in str(error.value)


@pytest.mark.parametrize("text, expected", [
    ("0,1,2", (0, 1, 2)), ("7", (7,)), (" 3, 1", (3, 1)),
    ("0,x", "'x' is not a seed"), ("-1", "'-1' is not a seed"), ("1,1", "seed 1 is repeated"),
])
def test_parse_seeds(text, expected):
    if isinstance(expected, tuple):
        assert lib.parse_seeds(text) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            lib.parse_seeds(text)


def test_grid_values_are_typed_and_settings_are_the_product():
    grid = lib.parse_grid(["filter.keep_ratio=0.25,1", "nothink=true,False",
                           "model.source=tiny-random", "advantage.whiten=None"], base_config())
    assert grid == [("filter.keep_ratio", (0.25, 1.0)), ("nothink", (True, False)),
                    ("model.source", ("tiny-random",)), ("advantage.whiten", (None,))]
    assert [type(v) for v in grid[0][1]] == [float, float]
    assert [lib.setting_name(s) for s in lib.settings(grid)] == [
        f"filter.keep_ratio={r},nothink={n},model.source=tiny-random,advantage.whiten=None"
        for r in (0.25, 1.0) for n in (True, False)]
    assert lib.settings([]) == [{}] and lib.setting_name({}) == "base"


@pytest.mark.parametrize("mistake, message", [
    (["--grid", "loss.kl_cof=0,0.001"],
     "error: --grid: unknown config key 'loss.kl_cof' (did you mean 'loss.kl_coef'?)"),
    (["--config.loss.kl_cof=1"], "error: unknown --config override key: "),
])
def test_command_line_names_a_mistake_before_loading(mistake, message, tmp_path):
    command = [sys.executable, str(ROOT / "experiments" / "sweep.py"), "--config",
               "bandit_grpo.py", "--seeds", "0,1", "--no-vmap", "--workdir", str(tmp_path),
               *mistake]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir()), "nothing is written"


def test_config_arg_resolution():
    configs = ROOT / "experiments" / "configs"
    assert sweep_runner.resolve_config_arg(["sweep.py", "--config", "bandit_ppo.py", "--no-vmap",
                                   "--config=sokoban_grpo.py", "--config.steps=3"]) == [
        "sweep.py", "--config", str(configs / "bandit_ppo.py"), "--novmap",
        f"--config={configs / 'sokoban_grpo.py'}", "--config.steps=3"]


def test_parse_overrides_takes_one_typed_value_per_key_and_names_the_flag():
    base = base_config()
    assert lib.parse_overrides(["filter.keep_ratio=0.5", "nothink=true"], base) == {
        "filter.keep_ratio": 0.5, "nothink": True}
    with pytest.raises(ValueError, match="--set filter.keep_ratio: one value, not 2"):
        lib.parse_overrides(["filter.keep_ratio=0.25,1.0"], base)
    with pytest.raises(ValueError, match="^--bench 'filter.keep_ratio': expected KEY=VALUE"):
        lib.parse_overrides(["filter.keep_ratio"], base, flag="--bench")
