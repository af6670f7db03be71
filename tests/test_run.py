"""experiments/run.py: what a run writes, bit-exact --resume (2 + 2 steps == 4 steps),
SIGTERM saves and stops, the workdir guards, and the command line (bare config names,
config mistakes reported before anything loads)."""

from __future__ import annotations

import contextlib
import fcntl
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
from starpo_jax.run.writers import (ConsoleProgress, JsonlWriter, format_duration,  # noqa: E402
                                    open_writers, trend_line)
from starpo_jax.run.workdir import (RunFault, WorkdirLock, _is_file_of,  # noqa: E402
                                    check_workdir)
from helpers.scripts import script  # noqa: E402
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
    with pytest.raises(FileExistsError, match="pass --resume or another --workdir") as late:
        _train(tmp_path, 2)
    # The scripts' check before JAX loads reads orbax's directory as the loop does.
    with pytest.raises(FileExistsError) as early:
        check_workdir(tmp_path, resume=False)
    assert str(early.value) == str(late.value) == (
        f"{tmp_path} already holds checkpoints (newest: step 1); pass --resume or another "
        "--workdir")
    check_workdir(tmp_path, resume=True)
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
    assert lines[-1] == ("trend, step 1 -> step 3: success 0.25 -> 0.75, "
                         "action_is_valid 1 -> 1")


def test_a_resumed_run_s_trend_is_the_whole_run_s(tmp_path):
    """Resumed at step 17 of 20, the closing trend compares the thirds of all 20 steps, as the
    run never stopped prints it (not steps 17-17 -> 20-20 of this process)."""
    rows = [(s, {"train/success": s / 20, "rollout/reward_mean": s // 10, "actor/entropy": 1.0})
            for s in range(1, 21)]
    path = tmp_path / "metrics.jsonl"
    # Steps 18-19 were written after the checkpoint of step 17, then the run was killed.
    path.write_text("".join(json.dumps({"step": s, **m}) + "\n" for s, m in rows[:19]) + '{"st')
    writers = open_writers(tmp_path, total_steps=20, first_step=17)
    out = io.StringIO()
    console = next(w for w in writers._writers if isinstance(w, ConsoleProgress))
    console._stream = out
    for step, metrics in rows[17:]:
        writers.write(step, metrics)
    writers.close()
    assert out.getvalue().splitlines()[-1] == trend_line(rows) == (
        "trend, steps 1-6 -> 15-20: success 0.175 -> 0.875, reward_mean 0 -> 1.17, "
        "entropy 1 -> 1")
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [
        *range(1, 21)]


@pytest.mark.parametrize("argv, expected", [
    (["--config", "bandit_ppo.py"], ["--config", str(CONFIG_DIR / "bandit_ppo.py")]),
    (["--config=sokoban_grpo.py:x"], [f"--config={CONFIG_DIR / 'sokoban_grpo.py'}:x"]),
    (["--config=missing.py"], ["--config=missing.py"]),
    (["--config.steps=3"], ["--config.steps=3"]),
])
def test_bare_config_names_resolve(argv, expected):
    assert cli.resolve_config_arg(argv, CONFIG_DIR) == expected


def test_bare_config_names_resolve_without_py():
    for name in ("quickstart", "sokoban_sft"):
        assert cli.resolve_config_arg(["--config", name], CONFIG_DIR) == [
            "--config", str(CONFIG_DIR / f"{name}.py")]
    assert cli.resolve_config_arg(["--config=quickstart:x"], CONFIG_DIR) == [
        f"--config={CONFIG_DIR / 'quickstart.py'}:x"]
    assert cli.resolve_config_arg(["--config", "nothing"], CONFIG_DIR) == ["--config", "nothing"]


# Runs a script as `python experiments/<script>` does; prints at exit (stdout) which of the
# heavy modules were imported by then.
_AT_EXIT = ("import atexit, runpy, sys; atexit.register(lambda: print('imported:', sorted("
            "m for m in ('jax', 'jumanji', 'flax') if m in sys.modules))); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.mark.parametrize("script_name, config", [("run.py", "quickstart"),
                                                 ("sft.py", "sokoban_sft")])
def test_workdir_mistakes_are_one_line_before_jax_loads(tmp_path, script_name, config):
    """Run as scripts, run.py and sft.py check the workdir before they import JAX or load the
    config file (an SFT config imports JAX): a file, --resume of nothing (the default workdir,
    runs/<config name> under the current directory), checkpoints without --resume, a live
    run's lock. Each is one line, exit 1, with nothing written."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "old" / "checkpoints" / "12").mkdir(parents=True)
    (tmp_path / "old" / "checkpoints" / "12.orbax-checkpoint-tmp-1").mkdir()
    # A live run's workdir holds its checkpoints too: a second run hears that it is in use.
    (tmp_path / "live" / "checkpoints" / "3").mkdir(parents=True)
    holder = os.open(tmp_path / "live" / "run.lock", os.O_RDWR | os.O_CREAT)
    os.write(holder, b"run pid 4242 on elsewhere, since noon")
    fcntl.flock(holder, fcntl.LOCK_EX)
    before = sorted(tmp_path.rglob("*"))
    try:
        for argv, line in [
            (["--workdir", "file"], "error: workdir file is a file, not a directory: pass "
                                    "another --workdir"),
            (["--resume"], f"error: nothing to resume in runs/{config}; run without --resume "
                           "to start"),
            (["--workdir=old"], "error: old already holds checkpoints (newest: step 12); pass "
                                "--resume or another --workdir"),
            (["--workdir", "live"], "error: workdir live is in use by run pid 4242 on "
                                    "elsewhere, since noon: wait for that run to end, or pass "
                                    "another --workdir"),
        ]:
            done = subprocess.run([sys.executable, "-c", _AT_EXIT,
                                   str(ROOT / "experiments" / script_name), "--config", config,
                                   *argv], capture_output=True, text=True, timeout=120,
                                  cwd=tmp_path)
            assert done.returncode == 1, done.stderr[-2000:]
            assert done.stderr.strip() == line
            assert done.stdout.strip() == "imported: []", "checked before JAX loads"
    finally:
        os.close(holder)
    assert sorted(tmp_path.rglob("*")) == before, "nothing is written"


def test_without_workdir_a_run_writes_under_runs_config_name(tmp_path, monkeypatch):
    """No --workdir: runs/<config name> in the current directory, said first."""
    from absl import flags

    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "argv", ["run.py", "--config", "bandit_ppo",
                                      "--config.advantage.estimator=nope"])
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with pytest.raises(SystemExit) as exit_:
                script("run")["main"]()
    finally:
        flags.FLAGS.unparse_flags()
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)
    assert out.getvalue().splitlines()[0] == (
        "--workdir not given: the run writes under runs/bandit_ppo (the default, "
        "runs/<config name>)")
    assert "advantage.estimator = 'nope' is invalid" in str(exit_.value.code)
    assert not list(tmp_path.iterdir()), "refused before the workdir is made"


def test_a_clean_release_removes_the_lock_file(tmp_path):
    workdir, said = tmp_path / "w", []
    with WorkdirLock(workdir):
        assert (workdir / "run.lock").read_text().startswith(f"run pid {os.getpid()} on ")
        (workdir / "config.json").write_text("{}")
    assert sorted(p.name for p in workdir.iterdir()) == ["config.json"], "no empty run.lock"
    with WorkdirLock(tmp_path / "nothing_written"):
        pass
    assert not (tmp_path / "nothing_written").exists(), "a workdir the lock made, left empty"
    # A killed run's lock (its holder's name left in the file) is still taken over, and goes.
    (workdir / "run.lock").write_text("run pid 1 on gone, since noon")
    with WorkdirLock(workdir, said.append):
        pass
    assert said == [f"workdir {workdir}: taking over the lock of run pid 1 on gone, since noon, "
                    "which ended without releasing it (killed or crashed)"]
    assert not (workdir / "run.lock").exists()
    # A run that opened the lock file just before its holder released (and removed) it locks
    # a file no longer at the path: it must open the path again.
    path = tmp_path / "lock"
    path.write_text("")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _is_file_of(fd, path)
        path.unlink()
        assert not _is_file_of(fd, path)
        path.write_text("")
        assert not _is_file_of(fd, path)
    finally:
        os.close(fd)


@pytest.mark.parametrize("override, message", [
    ("--config.rollout.groups=0", "error: rollout.groups = 0 is invalid; valid: an int >= 1"),
    ("--config.loss.clip_hgh=0.3",
     "error: unknown --config override key: 'loss.clip_hgh' (did you mean 'loss.clip_high'?)"),
])
def test_command_line_rejects_config_mistakes_before_loading(tmp_path, override, message):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
                           "bandit_ppo.py", override, "--workdir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "w").exists(), "nothing is written before the config is valid"
