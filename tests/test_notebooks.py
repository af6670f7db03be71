"""The notebooks in notebooks/ run top to bottom in a fresh Jupyter kernel, offline, and show
what they say: each ends by printing one `RESULT {json}` line, checked here against the games'
rules and independent numpy recomputations. The committed files carry no outputs.
analyse_a_run runs through the documented command (`jupyter execute --output`), takes its run
from STARPO_RUN, and leaves nothing behind of the tiny run it makes without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("environments", "functional_step", "analyse_a_run")
CELL_TIMEOUT = 600  # seconds per cell; a whole notebook takes about a minute on 2 cores


def execute(name: str, out_dir: Path) -> nbformat.NotebookNode:
    """Runs notebooks/<name>.ipynb in a new kernel (cwd notebooks/, this checkout first on the
    path, HF_HUB_OFFLINE=1) and returns it executed; a copy is written to out_dir."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute(env=env)
    finally:
        nbformat.write(notebook, out_dir / f"{name}.ipynb")
    return notebook


def outputs(notebook: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]


def result_of(notebook: nbformat.NotebookNode) -> dict:
    """The RESULT line of the last cell, after checking that no cell raised."""
    errors = [f"{o.ename}: {o.evalue}" for o in outputs(notebook) if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, text[-2000:]
    return json.loads(lines[0][len("RESULT "):])


def pictures(notebook: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs(notebook))


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebooks_are_stripped_and_open_with_what_they_show(name):
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in code)
    assert notebook.cells[0].cell_type == "markdown"
    assert notebook.cells[0].source.startswith("# ") and "tests/test_notebooks.py" in \
        notebook.cells[0].source


def _check_filter(rewards: np.ndarray, keep_ratio: float, mode: str, kept: list[int]) -> None:
    """The uncertainty filter's contract in numpy: K = max(1, int(keep_ratio * P)) groups,
    ascending, none of them less uncertain (in-group reward std, ddof 1) than a dropped group
    ("std"), or none more ("std_rev"); stds within 1e-6 count as ties (float32 vs float64)."""
    std = rewards.std(axis=1, ddof=1) * (1 if mode == "std" else -1)
    assert len(kept) == max(1, int(keep_ratio * len(std))) and kept == sorted(set(kept))
    dropped = [g for g in range(len(std)) if g not in kept]
    if dropped:
        assert std[kept].min() >= std[dropped].max() - 1e-6, (std, kept)


@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_environments(tmp_path):
    notebook = execute("environments", tmp_path)
    result = result_of(notebook)
    assert pictures(notebook) >= 5
    import envs_jax

    assert result["envs"] == list(envs_jax.names())
    # gym-sokoban's rules: -0.1 a step; the last push puts the box on its target: +1 + 10.
    assert [p["reward"] for p in result["played"]] == [-0.1, -0.1, -0.1, -0.1, 10.9]
    assert [p["effective"] for p in result["played"]] == [True, True, False, True, True]
    assert [p["done"] for p in result["played"]] == [False] * 4 + [True]
    # Slippery ice: the intended direction or either perpendicular one, 1/3 each (4096 draws:
    # 0.04 is over 5 standard deviations).
    slips = result["slips"]
    assert slips["Up"] == 0.0
    assert all(abs(slips[d] - 1 / 3) < 0.04 for d in ("Down", "Left", "Right")), slips
    assert result["bandit_means"]["Phoenix"] == pytest.approx(0.1)
    assert abs(result["bandit_means"]["Dragon"] - 0.25) < 0.04
    lengths = result["solution_lengths"]
    assert len(lengths) == 256 and all(isinstance(n, int) and n >= 1 for n in lengths)
    assert all(isinstance(n, int) and n >= 1 for n in result["large_solution_lengths"])
    assert set(result["throughput"]) == {"bandit", "frozen_lake", "sokoban"}
    assert all(v["steps_per_s"] > 0 and v["resets_per_s"] > 0
               for v in result["throughput"].values())


@pytest.mark.optimized  # its time is running, not compiling (conftest)
def test_functional_step(tmp_path):
    notebook = execute("functional_step", tmp_path)
    result = result_of(notebook)
    assert pictures(notebook) >= 4
    rewards = np.array(result["group_rewards"])
    assert rewards.shape == (8, 4)
    assert (rewards.std(axis=1) > 0).sum() >= 2, "the warm start gives groups that disagree"
    for setting, kept in result["filter_kept"].items():
        ratio, mode = setting.split("/")
        _check_filter(rewards, float(ratio), mode, kept)
    assert result["prepare_kept"] == result["filter_kept"]["0.5/std"]
    assert result["advantage_error"] < 1e-4 and result["advantage_off_mask"] == 0.0
    history = result["history"]
    assert len(history) == 8 and result["params_change"] > 0
    assert all(np.isfinite(list(h.values())).all() for h in history)
    assert np.mean([h["rollout/action_is_valid"] for h in history]) > 0.5, "warm-started format"
    assert any(h["actor/grad_norm"] > 0 for h in history)


def _jupyter_execute(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The documented command, `jupyter execute notebooks/analyse_a_run.ipynb ...`, from the
    repository's root (this checkout first on the path, offline, TMPDIR under tmp_path,
    STARPO_RUN unset unless given)."""
    jupyter = Path(sys.executable).with_name("jupyter")
    if not jupyter.exists():
        pytest.skip("no jupyter launcher beside this interpreter")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    environment = {k: v for k, v in os.environ.items() if k != "STARPO_RUN"}
    environment.update(PYTHONPATH=path, HF_HUB_OFFLINE="1", TMPDIR=str(tmp_path / "tmp"), **env)
    return subprocess.run([str(jupyter), "execute", "notebooks/analyse_a_run.ipynb", *args],
                          cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=3 * CELL_TIMEOUT)


def test_analyse_a_run(tmp_path):
    """As documented (docs/evaluation-and-monitoring.md): `jupyter execute --output` keeps the
    executed notebook; with no STARPO_RUN the tiny run it makes is gone afterwards, and the
    temporary directory is as empty as before."""
    done = _jupyter_execute([f"--output={tmp_path / 'analysed'}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    notebook = nbformat.read(tmp_path / "analysed.ipynb", as_version=4)
    result = result_of(notebook)
    assert pictures(notebook) >= 1
    assert result["steps"] == [1, 2, 3, 4, 5, 6]
    assert result["replayed_alerts"] == result["alerts"]
    # The tiny model never answers in format: a notice at step 1, the alert at step 2.
    assert [(a["step"], a["kind"]) for a in result["alerts"]
            if a["kind"] == "no_valid_reply"] == [(1, "no_valid_reply"), (2, "no_valid_reply")]
    # step 0: the evaluation before training (val_before_train) writes its samples too
    assert result["sample_files"] == ["step_000000.txt", "step_000003.txt", "step_000006.txt"]
    assert result["checkpoint_step"] == 6
    assert result["eval"] and result["eval"] == result["logged_eval"]
    assert result["samples_match_run"]
    # config.json read back through api.read_run_config, its auto_memory record included
    assert set(result["memory_settings"]) == {"optim.micro_batches", "optim.remat",
                                              "rollout.cache_dtype", "rollout.chunks"}
    assert result["tiny_run_removed"]
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == [], "nothing left behind"


def test_analyse_a_run_reads_the_run_named_by_starpo_run(tmp_path, monkeypatch):
    """STARPO_RUN names the run with no edit of the notebook: its parameters cell (tagged for
    papermill) reads it, and the kernel that jupyter starts sees it (a directory that holds no
    run is refused by name)."""
    notebook = nbformat.read(NOTEBOOKS / "analyse_a_run.ipynb", as_version=4)
    [cell] = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    for value, expected in (("runs/quickstart", "runs/quickstart"), ("", None), (None, None)):
        if value is None:
            monkeypatch.delenv("STARPO_RUN", raising=False)
        else:
            monkeypatch.setenv("STARPO_RUN", value)
        scope: dict = {}
        exec(cell.source, scope)
        assert scope["RUN_DIR"] == expected, value
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    done = _jupyter_execute([], tmp_path, STARPO_RUN=str(empty))
    assert done.returncode != 0
    assert f"{empty} holds no run (no config.json)" in done.stderr, done.stderr[-3000:]
