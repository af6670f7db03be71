"""The suite's multi-turn machinery on the tiny multi-turn suite (tests/helpers/tiny.py's
tiny_multi_turn_suite): the SFT stage first, RL seeds starting from its checkpoint, the SFT start
as their before column, the baselines and SFT-start rows in the report, resuming."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from starpo_jax import api
from starpo_jax.analysis import reproduce
from starpo_jax.run import sft
from starpo_jax.run.checkpoint import Checkpoints
from helpers.tiny import tiny_multi_turn_suite



def _suite(workdir: Path, **options: bool) -> str:
    out = io.StringIO()
    reproduce.reproduce(tiny_multi_turn_suite(), "tiny_multi_turn", workdir, stream=out,
                        **options)
    return out.getvalue()


def _metrics(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow  # an SFT run and two RL runs of tiny-random on Sokoban: minutes of compiles
def test_tiny_multi_turn_suite_starts_from_sft_reports_baselines_and_resumes(tmp_path):
    first = _suite(tmp_path, keep_checkpoints=True)
    sft_run = tmp_path / "runs" / "sokoban_sft" / "seed_0"
    rl = [tmp_path / "runs" / "sokoban_grpo_s" / f"seed_{s}" for s in (0, 1)]
    assert first.index("[run 1/3] sokoban_sft seed 0: starting") < first.index(
        "[run 2/3] sokoban_grpo_s seed 0: starting")
    for path in rl:
        config = json.loads((path / "config.json").read_text())
        assert config["model"]["init_from"] == str(sft_run)
        assert config["eval"]["seed"] == 0
        # The before column is the SFT start's last evaluation (greedy at step 2, sampled in
        # its final evaluation), not an evaluation of its own.
        before = json.loads((path / "eval_step_0.json").read_text())
        assert before == reproduce.last_evaluation(sft_run)
        assert {"val/sokoban/greedy/success", "val/sokoban/sampled/success"} <= set(before)
        assert "val/sokoban/sampled/success" in json.loads((path / "eval_final.json").read_text())

    # RL step 0 holds the SFT run's final weights (its newest checkpoint, kept).
    setting = tiny_multi_turn_suite().experiments[0].settings[0]
    exp = api.build(reproduce.run_config(setting, 1, tmp_path))
    sft_exp = sft.build(setting.start.config(0))
    checkpoints = Checkpoints(sft_run / "checkpoints", 0, 1)
    try:
        assert checkpoints.latest_step == 2
        saved = checkpoints.restore_latest(sft_exp.state)
    finally:
        checkpoints.close()
    for got, want in zip(_leaves(exp.state.actor), _leaves(saved.actor), strict=True):
        np.testing.assert_array_equal(got, want)
    assert not all(np.array_equal(a, b) for a, b in zip(
        _leaves(saved.actor), _leaves(sft_exp.fresh_state().actor))), "SFT moved the weights"

    # Baselines on the same held-out states: the solver solves what the random policy does.
    baselines = json.loads((sft_run / "baselines.json").read_text())
    assert set(baselines) == {"random", "solver"}
    for mode in ("greedy", "sampled"):
        name = f"val/sokoban/{mode}/success"
        assert baselines["solver"][name] >= baselines["random"][name]
    text = (tmp_path / "report.md").read_text()
    for mode in ("greedy", "sampled"):
        assert f"| setting ({mode}, before -> after) |" in text
    for label in ("random policy (sokoban)", "solver (sokoban)", "SFT start (sokoban)"):
        assert text.count(f"| {label} | ") == 2, label  # greedy and sampled tables
    start = reproduce.last_evaluation(sft_run)["val/sokoban/greedy/success"]
    assert f"| SFT start (sokoban) | {start:.2f} |" in text
    assert (tmp_path / "figures" / "multi_turn_heldout_sokoban_greedy_success.png").exists()

    # Seed 1 cut short after step 1: resumed from its checkpoint with the numbers of the run
    # never stopped; the finished SFT run and seed 0 are skipped. Without --keep-checkpoints
    # the finished RL run's checkpoints go, the SFT run's stay (the start of its RL runs).
    done = _metrics(rl[1])
    final = json.loads((rl[1] / "eval_final.json").read_text())
    for name in ("done.json", "eval_final.json"):
        (rl[1] / name).unlink()
    shutil.rmtree(rl[1] / "checkpoints" / "2")
    resumed = _suite(tmp_path)
    assert "sokoban_sft seed 0: finished earlier, skipped" in resumed
    assert "sokoban_grpo_s seed 0: finished earlier" in resumed
    assert "sokoban_grpo_s seed 1: resuming" in resumed
    assert _metrics(rl[1]) == done
    assert json.loads((rl[1] / "eval_final.json").read_text()) == final
    assert not (rl[1] / "checkpoints").exists()
    assert (sft_run / "checkpoints").exists()
