"""Faults a run survives (issue 14), each injected: a non-finite update (poisoned reward), a
failed save (the kernel refuses the write), unwritable / full / foreign / damaged workdirs, two
runs on one workdir and kill -9 at random moments (real experiments/run.py subprocesses)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from starpo_jax.run import loop as runner  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402
from starpo_jax.run.writers import JsonlWriter  # noqa: E402
from starpo_jax.run.monitor import CollapseMonitor, MonitorConfig  # noqa: E402
from starpo_jax.train.step import apply_if, make_train_step  # noqa: E402
from starpo_jax.run.workdir import RunFault, WorkdirLock, check_free_space  # noqa: E402
from helpers.tiny import tiny_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _same(a, b) -> bool:
    """Bitwise equal trees (NaN equal to NaN)."""
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(_host(a), _host(b)))


@pytest.mark.parametrize("loss, poison", [(1.0, None), (np.nan, None), (np.inf, None),
                                          (1.0, np.nan), (1.0, -np.inf)])
def test_apply_if_updates_only_when_finite(loss, poison):
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.array([0.1, -0.2, 0.3])}
    if poison is not None:
        grads["b"] = grads["b"].at[1].set(poison)
    tx = optax.adamw(0.1, weight_decay=0.01)
    state = tx.init(params)
    norm = optax.tree.norm(grads)
    new_params, new_state, skipped = jax.jit(
        lambda g, s, p, loss, n: apply_if(jnp.bool_(True), tx, g, s, p, loss, n))(
        grads, state, params, jnp.float32(loss), norm)
    if np.isfinite(loss) and poison is None:
        # Reference: AdamW's first step by hand (bias-corrected moments: m / sqrt(v) = sign(g)).
        for name in params:
            g, p = np.asarray(grads[name]), np.asarray(params[name])
            expected = p - 0.1 * (np.sign(g) * (1 - 1e-8 / (np.abs(g) + 1e-8)) + 0.01 * p)
            np.testing.assert_allclose(new_params[name], expected, rtol=1e-5)
        assert float(skipped) == 0.0
    else:
        assert float(skipped) == 1.0
        assert _same(new_params, params) and _same(new_state, state)


@pytest.fixture(scope="module")
def exp():
    return tiny_experiment()


@pytest.fixture(scope="module")
def poisoned(exp):
    """`exp` whose format penalty (every tiny-random reply is badly formatted) is NaN: every
    reward, advantage (GRPO without normalisation, whose all-equal-group guard would zero a
    NaN) and loss of a step is NaN."""
    rollout = dataclasses.replace(exp.train.rollout)
    object.__setattr__(rollout, "format_penalty", float("nan"))  # past the config's own check
    train = dataclasses.replace(
        exp.train, advantage=dataclasses.replace(exp.train.advantage, grpo_mode="none"))
    object.__setattr__(train, "rollout", rollout)
    step = make_train_step(train, exp.env, exp.codec, model=exp.model,
                           eos_id=exp.tokenizer.eos_token_id, pad_id=exp.tokenizer.pad_token_id)
    return dataclasses.replace(exp, config=exp.config.copy_and_resolve_references(),
                               train_step=step, state=exp.fresh_state())


def test_a_poisoned_step_leaves_weights_and_optimiser_untouched(poisoned):
    poisoned.state = poisoned.fresh_state()
    before = jax.tree.map(np.array, poisoned.state)
    metrics = poisoned.step()
    assert np.isnan(metrics["rollout/score_mean"]) and not np.isfinite(metrics["actor/grad_norm"])
    assert metrics["actor/skipped_updates"] == 1.0
    after = poisoned.state
    assert int(after.step) == 1
    assert _same(after.actor, before.actor) and _same(after.actor_opt, before.actor_opt)


def test_a_clean_step_counts_no_skipped_update(exp):
    exp.state = exp.fresh_state()
    assert exp.step()["actor/skipped_updates"] == 0.0


def test_skipped_steps_in_a_row_save_and_stop_the_run(poisoned, tmp_path):
    poisoned.state = poisoned.fresh_state()
    initial = jax.tree.map(np.array, poisoned.state)
    poisoned.config.steps, poisoned.config.max_skipped_steps = 5, 2
    with pytest.raises(RunFault, match=r"steps 1-2 dropped their updates.*max_skipped_steps = 2."
                                       r" The checkpoint of step 2 holds .* of step 0"):
        runner.train(poisoned, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/skipped_updates"] for r in rows] == [1.0, 1.0]
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert {"step": 1, "kind": "skipped_update", "metric": "actor/skipped_updates"}.items() <= \
        next(a for a in alerts if a["kind"] == "skipped_update").items()
    checkpoints = Checkpoints(tmp_path / "checkpoints", 1, 3)
    assert checkpoints.steps == [1, 2]
    saved = checkpoints.restore(2, like=poisoned.fresh_state())
    assert _same(saved.actor, initial.actor) and _same(saved.actor_opt, initial.actor_opt)
    checkpoints.close()


def test_a_failed_save_keeps_the_previous_checkpoint_and_stops(exp, tmp_path):
    """The kernel refuses writes past 1 MiB (RLIMIT_FSIZE, EFBIG) from step 2 on, as a full disk
    would: the save of step 2 fails inside orbax."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    compiled = exp.train_step

    def step_then_fill_the_disk(state, key):
        state, metrics = compiled(state, key)
        if int(state.step) == 2:
            resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, hard))
        return state, metrics

    exp.state, exp.train_step, exp.config.steps = exp.fresh_state(), step_then_fill_the_disk, 3
    try:
        with pytest.raises(RunFault, match=r"saving the checkpoint of step 2 in .* failed "
                                           r"\(.*File too large.*\); the newest checkpoint, "
                                           r"step 1, is kept. Free space"):
            runner.train(exp, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
        exp.train_step = compiled
    assert any(".orbax-checkpoint-tmp" in p.name for p in (tmp_path / "checkpoints").iterdir())
    assert runner.train(exp, tmp_path, resume=True) == 3, "resumes from step 1 once there is room"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1", "2", "3"]


@pytest.mark.parametrize("workdir, reason", [
    ("/sys/starpo_faults", "not writable (Operation not permitted)"),
    ("{tmp}/a_file/run", "not writable (Not a directory)"),
])
def test_an_unwritable_workdir_is_refused_before_training(exp, tmp_path, workdir, reason):
    (tmp_path / "a_file").write_text("")
    exp.state = exp.fresh_state()
    with pytest.raises(RunFault, match=re.escape(reason) + ": fix its permissions or pass "
                                                            "another --workdir"):
        runner.train(exp, Path(workdir.format(tmp=tmp_path)))
    assert exp.steps_done == 0


def test_too_little_free_space_is_refused(tmp_path):
    with pytest.raises(RunFault, match=r"MiB free, a checkpoint of this run takes about"):
        check_free_space(tmp_path, shutil.disk_usage(tmp_path).free + 2**30)


@pytest.fixture(scope="module")
def made(exp, tmp_path_factory):
    """A workdir of 2 steps (checkpoints 1 and 2)."""
    workdir = tmp_path_factory.mktemp("made")
    exp.state, exp.config.steps = exp.fresh_state(), 2
    runner.train(exp, workdir)
    return workdir


def _copy(made: Path, tmp_path: Path) -> Path:
    shutil.copytree(made, tmp_path / "w")
    return tmp_path / "w"


def _biggest_file(directory: Path) -> Path:
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def test_a_truncated_checkpoint_is_named_with_the_way_out(exp, made, tmp_path, capfd):
    workdir = _copy(made, tmp_path)
    data = _biggest_file(workdir / "checkpoints" / "2")
    os.truncate(data, data.stat().st_size // 2)
    exp.config.steps = 3
    with pytest.raises(RunFault, match=rf"checkpoint {workdir}/checkpoints/2 is damaged \(.+\): "
                                       rf"delete {workdir}/checkpoints/2 to resume from step 1"):
        runner.train(exp, workdir, resume=True)
    assert "Traceback" not in capfd.readouterr().err, "orbax's own tracebacks stay quiet"
    shutil.rmtree(workdir / "checkpoints" / "2")
    assert runner.train(exp, workdir, resume=True) == 3


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.replace('"seed": 0', '"seed": 7'),
     r"differs from .*config.json in \['seed'\]: seed: 7 there, 0 here. Resume with the config "
     r"that made the workdir"),
    (lambda c: c[:len(c) // 2], r"config.json is not a run config \(.*\): was it edited by hand "
                                r"or cut short\? Restore it, or pass another --workdir"),
    (lambda c: "[1, 2]", r"is not a run config \(a JSON list, not an object\)"),
    (None, r"config.json is missing, so the checkpoints beside it cannot be checked"),
])
def test_a_hand_edited_or_missing_config_json(exp, made, tmp_path, edit, message):
    workdir = _copy(made, tmp_path)
    path = workdir / "config.json"
    if edit is None:
        path.unlink()
    else:
        path.write_text(edit(path.read_text()))
    with pytest.raises(RunFault, match=message):
        runner.train(exp, workdir, resume=True)


def test_a_workdir_of_another_config_names_what_differs(exp, made, tmp_path):
    workdir = _copy(made, tmp_path)
    exp.config.env.name, exp.config.rollout.group_size = "sokoban", 4
    try:
        with pytest.raises(RunFault, match=r"in \['env.name', 'rollout.group_size'\]: env.name: "
                                           r"'bandit' there, 'sokoban' here; rollout.group_size: "
                                           r"2 there, 4 here"):
            runner.train(exp, workdir, resume=True)
    finally:
        exp.config.env.name, exp.config.rollout.group_size = "bandit", 2


def test_checkpoints_of_other_shapes_are_refused_not_loaded(exp, made, tmp_path):
    """config.json agrees, the checkpoint does not (copied from a run with a bigger model)."""
    workdir = _copy(made, tmp_path)
    bigger = jax.tree.map(lambda x: jnp.zeros((x.shape[0] + 1, *x.shape[1:]), x.dtype)
                          if x.ndim == 2 else x, exp.fresh_state())
    checkpoints = Checkpoints(workdir / "checkpoints", 1, 5)
    checkpoints.maybe_save(bigger.replace(step=jnp.int32(9)), force=True)
    checkpoints.close()
    with pytest.raises(RunFault, match=r"checkpoints/9 was made by another config: actor/\S+ is "
                                       r"float32\[\d+, \d+\] in the checkpoint, float32\[\d+, \d+\]"
                                       r" in this run. Resume with the config that made it"):
        runner.train(exp, workdir, resume=True)


def test_the_lock_is_reentrant_and_released(tmp_path):
    with WorkdirLock(tmp_path):
        with WorkdirLock(tmp_path):
            pass
        assert (tmp_path / "run.lock").read_text().startswith(f"run pid {os.getpid()} on ")
    assert not (tmp_path / "run.lock").exists(), "released cleanly: nothing to take over"


@pytest.mark.optimized  # its time is running, not compiling (conftest)
@pytest.mark.parametrize("kills, steps, first", [
    # The slow tier (README): four to six run.py processes, ~2 minutes each case. CI keeps the
    # pieces in this process: a truncated checkpoint named, a metrics line cut short dropped,
    # the lock, and test_run's resumed run equal to an unstopped one.
    pytest.param(1, 12, "mid-save", marks=pytest.mark.slow),
    pytest.param(3, 16, "random", marks=pytest.mark.slow),
])
def test_kill_9_at_random_moments_loses_nothing(tmp_path, kills, steps, first):
    """experiments/fault_kill.py: real run.py processes, an uninterrupted run and one killed
    `kills` times (alternately mid-save and at a random moment, starting with `first`) and
    resumed; a second run started beside the first is refused at once. It exits 1 naming any
    check that failed (every relaunch resumed after the newest complete checkpoint and took
    over the lock, metrics equal to the uninterrupted run's step for step)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "fault_kill.py"), "--kills", str(kills),
         "--steps", str(steps), "--first", first, "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{kills} kills" in done.stdout and f"{steps} steps compared" in done.stdout
    assert "all equal" in done.stdout and "mid-save" in done.stdout


def test_the_monitor_alerts_once_per_run_of_skipped_updates():
    monitor = CollapseMonitor(MonitorConfig(warmup=5))
    counts = [0, 1, 2, 0, 1]  # actor/skipped_updates per step: alerts at steps 2 and 5
    fired = [[a.kind for a in monitor.update(step, {"actor/skipped_updates": n})]
             for step, n in enumerate(counts, 1)]
    assert fired == [[], ["skipped_update"], [], [], ["skipped_update"]]


def test_a_metrics_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 3, "x"')
    JsonlWriter(path, first_step=2).close()
    assert path.read_text() == '{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n'


def test_a_workdir_older_than_a_key_resumes_when_the_key_keeps_its_default(tmp_path):
    """A config.json written before a key existed lacks it: resuming with the key at its default
    (the behaviour the run had) passes; with another value it is named as a change."""
    from starpo_jax.run.schema import default_config
    from starpo_jax.run.workdir import check_config

    defaults = default_config().to_dict()
    config = default_config().to_dict()
    saved = json.loads(json.dumps(config))
    del saved["rollout"]["context_window_mode"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved))
    check_config(path, config, True, (), has_checkpoints=True, defaults=defaults)
    config["rollout"]["context_window_mode"] = "single_turn"
    with pytest.raises(RunFault, match=r"in \['rollout.context_window_mode'\]: "
                                       r"rollout.context_window_mode: '\(absent\)' there, "
                                       r"'single_turn' here"):
        check_config(path, config, True, (), has_checkpoints=True, defaults=defaults)
    with pytest.raises(RunFault, match=r"rollout.context_window_mode: '\(absent\)' there"):
        check_config(path, default_config().to_dict(), True, (), has_checkpoints=True)
