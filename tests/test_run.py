"""experiments/run.py: what a run writes, bit-exact --resume (2 + 2 steps == 4 steps),
SIGTERM saves and stops, the workdir guards, and the command line (bare config names,
config mistakes reported before anything loads)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from starpo_jax.run import cli, loop as runner  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.run.cli import CONFIG_DIR  # noqa: E402
from starpo_jax.run.writers import ConsoleProgress, JsonlWriter, format_duration, trend_line  # noqa: E402,E501
from starpo_jax.run.workdir import RunFault  # noqa: E402
from helpers.tiny import ISSUE_METRICS, tiny_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _metrics(workdir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock timings."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/")}
            for line in lines]


def _train(tmp: Path, steps: int, **kw) -> int:
    exp = tiny_experiment()
    exp.config.steps = steps
    return runner.train(exp, tmp, **kw)


def test_resume_repeats_an_unstopped_run(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert _train(straight, 4) == 4
    assert _train(stopped, 2) == 2
    assert _train(stopped, 4, resume=True) == 4
    assert _metrics(stopped) == _metrics(straight)
    rows = _metrics(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert set(ISSUE_METRICS) <= set(rows[0])
    assert Checkpoints(straight / "checkpoints", 1, 3).manager.all_steps() == [2, 3, 4], "keep 3"
    assert list((straight / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((straight / "config.json").read_text())["env"]["name"] == "bandit"


def test_workdir_guards(tmp_path):
    _train(tmp_path, 1)
    with pytest.raises(FileExistsError, match="pass --resume or another --workdir"):
        _train(tmp_path, 2)
    exp = tiny_experiment()
    exp.config.seed = 1
    try:
        with pytest.raises(RunFault, match=r"differs from .* in \['seed'\]: seed: 0 there, 1 here"):
            runner.train(exp, tmp_path, resume=True)
    finally:
        exp.config.seed = 0


def test_sigterm_saves_and_stops(tmp_path):
    def send_when_logging_started():
        path = tmp_path / "metrics.jsonl"
        while not (path.exists() and path.read_text().strip()):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    sender = threading.Thread(target=send_when_logging_started, daemon=True)
    sender.start()
    with runner.stop_on_signals() as stop:
        done = _train(tmp_path, 1000, stop=stop)
    sender.join(timeout=10)
    assert signal.getsignal(signal.SIGTERM) is previous, "the old handler is back"
    assert 1 <= done < 1000
    assert len(_metrics(tmp_path)) == done
    assert Checkpoints(tmp_path / "checkpoints", 1, 3).latest_step == done


def test_jsonl_resume_drops_lines_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (1, 2, 3)))
    writer = JsonlWriter(path, first_step=2)
    writer.write(3, {"x": 30.0})
    writer.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "x": 1}, {"step": 2, "x": 2}, {"step": 3, "x": 30.0}]


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (59.6, "0:01:00"), (3725, "1:02:05")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_trend_line_compares_first_and_last_thirds():
    history = [(s, {"train/success": s / 10, "rollout/reward_std": 1.0})
               for s in range(1, 8)]  # 7 steps: thirds of 2
    assert trend_line(history) == ("trend, steps 1-2 -> 6-7: success 0.15 -> 0.65, "
                                   "reward_std 1 -> 1")
    assert trend_line(history[:2]) == ""
    # A key missing from any averaged step is left out rather than averaged over fewer steps.
    history[0] = (1, {"train/success": 0.1})
    assert "reward_std" not in trend_line(history)


def test_console_progress_ends_with_the_trend():
    out = io.StringIO()
    progress = ConsoleProgress(total_steps=3, stream=out)
    for step in (1, 2, 3):
        progress.write(step, {"train/success": step / 4, "rollout/action_is_valid": 1.0})
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/3 [ 33%]") and "success=0.25 action_is_valid=1" in lines[0]
    assert lines[-1] == ("trend, steps 1-1 -> 3-3: success 0.25 -> 0.75, "
                         "action_is_valid 1 -> 1")


@pytest.mark.parametrize("argv, expected", [
    (["--config", "bandit_ppo.py"], ["--config", str(CONFIG_DIR / "bandit_ppo.py")]),
    (["--config=sokoban_grpo.py:x"], [f"--config={CONFIG_DIR / 'sokoban_grpo.py'}:x"]),
    (["--config=missing.py"], ["--config=missing.py"]),
    (["--config.steps=3"], ["--config.steps=3"]),
])
def test_bare_config_names_resolve(argv, expected):
    assert cli.resolve_config_arg(argv, CONFIG_DIR) == expected


@pytest.mark.parametrize("override, message", [
    ("--config.rollout.groups=0", "error: rollout.groups = 0 is invalid; valid: an int >= 1"),
    ("--config.loss.clip_hgh=0.3", "error: unknown --config override key: 'clip_hgh'"),
])
def test_command_line_rejects_config_mistakes_before_loading(tmp_path, override, message):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
                           "bandit_ppo.py", override, "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "w").exists(), "nothing is written before the config is valid"
