"""A user's first hour, as the README walks it, on workdirs that experiments/run.py made with
its default settings (tiny model): run -> evaluate -> export -> the export loaded by
transformers gives the checkpoint's greedy tokens -> --resume with more steps; a stop heard at
once while the main thread is inside a compiled call, a second one ending the run at once;
the cost line before step 1; a user's own env module trained by name, and a package's envs
found by entry point; Weights & Biases in offline mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing is downloaded

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from starpo_jax import api  # noqa: E402
from starpo_jax.run import export as run_export, loop as runner  # noqa: E402
from starpo_jax.models import load_pretrained  # noqa: E402
from starpo_jax.run.checkpoint import Checkpoints  # noqa: E402
from helpers.scripts import interrupt, read_until, script, stopped_before_step_1  # noqa: E402
from helpers.tiny import tiny_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# helpers.tiny's tiny config (bandit, GRPO, tiny-random, 2 x 2 rows, a checkpoint every step),
# everything else at run.py's defaults: its memory knobs are chosen and recorded. No phase
# clock (progress_after=0): a step with host callbacks is never in JAX's compilation cache,
# and the tiny steps never run long enough to print progress.
# The file also says which XLA C++ log threshold run.py set before JAX loaded (xla_log).
CONFIG = f"""
import os

from helpers.tiny import tiny_config  # tests/ is on the run's PYTHONPATH


def get_config():
    print("TF_CPP_MIN_LOG_LEVEL=" + os.environ.get("TF_CPP_MIN_LOG_LEVEL", "(unset)"))
    config = tiny_config()
    config.progress_after = 0
    return config
"""


def _env(**changes: str | None) -> dict[str, str]:
    """run.py's environment: this process's (as the test set it), with tests/ on the
    PYTHONPATH (the config file imports tests/helpers), and `changes` (None: unset)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def _run_py(config: Path, workdir: Path, *args: str, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), "--config",
                           str(config), "--workdir", str(workdir), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env or _env())


def _in_order(lines: list[str], starts: list[str]) -> list[str]:
    """The first line starting with each of `starts`, found in that order (AssertionError
    naming the first one missing)."""
    found, at = [], 0
    for start in starts:
        at = next((i for i in range(at, len(lines)) if lines[i].startswith(start)), None)
        assert at is not None, f"no line starting {start!r} after {found[-1:]}:\n" + \
            "\n".join(lines)
        found.append(lines[at])
    return found


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "tiny.py"
    path.write_text(CONFIG)
    return path


def test_the_readme_sequence_on_a_workdir_run_py_made(tmp_path, config_file, capsys):
    workdir = tmp_path / "runs" / "quickstart"
    done = _run_py(config_file, workdir, "--config.steps=1", env=_env(TF_CPP_MIN_LOG_LEVEL=None))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # XLA's "Very slow compile?" alarm is off (its C++ log's threshold, set before JAX loads).
    assert "TF_CPP_MIN_LOG_LEVEL=3" in lines
    # Each long phase says what it does as it starts; the cost comes before the compile.
    _in_order(lines, ["config ", "loading model tiny-random ...",
                      "building the bandit env, prompts and train state ...",
                      "estimated time on this CPU: ~", "compiling the train step with ",
                      "memory settings (unset, so chosen): ", "step 1/1 ", "done in "])
    assert any(line.startswith("memory settings (unset, so chosen): ") for line in lines)
    assert any(line.startswith("estimated time on this CPU: ~") and "for the 1 step to run"
               in line for line in lines), done.stdout
    assert any(line.startswith("done in ") and "(since this process's start)" in line
               for line in lines), done.stdout
    saved = json.loads((workdir / "config.json").read_text())
    assert set(saved["auto_memory"]["settings"]) == {
        "optim.micro_batches", "optim.remat", "rollout.cache_dtype", "rollout.chunks"}

    # The one reader every consumer uses: the run's knobs as chosen.
    config, record = api.read_run_config(workdir)
    assert record == saved["auto_memory"]
    assert config.optim.micro_batches == record["settings"]["optim.micro_batches"]
    assert config.rollout.chunks == record["settings"]["rollout.chunks"]

    # python experiments/evaluate.py --workdir runs/quickstart
    capsys.readouterr()
    step, metrics = runner.evaluate_workdir(workdir)
    assert step == 1 and "val/bandit/greedy/success" in metrics
    _in_order(capsys.readouterr().out.splitlines(), [
        "loading model tiny-random ...", f"restoring step 1 from {workdir / 'checkpoints'} ...",
        "evaluating ", f"{workdir}, step 1: "])
    assert json.loads((workdir / "eval_step_1.json").read_text())["metrics"] == metrics

    # python experiments/export.py --workdir runs/quickstart --out exported/quickstart
    out = tmp_path / "exported" / "quickstart"
    script("export")["main"](["--workdir", str(workdir), "--out", str(out)])
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o644}
    _check_greedy_tokens(workdir, out, step)

    # python experiments/run.py ... --resume with more steps
    done = _run_py(config_file, workdir, "--config.steps=2", "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(settings of the resumed run)" in done.stdout
    _in_order(done.stdout.splitlines(), ["loading model tiny-random ...", "restoring step 1 ",
                                         "estimated time on this CPU: ~",
                                         "compiling the train step ...", "step 2/2 "])
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == [1, 2]


def _check_greedy_tokens(workdir: Path, out: Path, step: int, new_tokens: int = 8) -> None:
    """transformers' greedy continuation from the export equals the greedy choice of our model
    holding the checkpoint's actor at every position of it (teacher-forced argmax)."""
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = np.random.RandomState(0).randint(0, hf.config.vocab_size, (2, 6))
    with torch.no_grad():
        full = hf.generate(torch.tensor(prompt), do_sample=False, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, pad_token_id=0).numpy()
    config, _ = api.read_run_config(workdir)
    model, _ = load_pretrained(config.model.source, config.model.dtype)
    manager, _ = run_export.checkpoint_manager(workdir)
    try:
        nnx.update(model, run_export.restore_actor(manager, step, nnx.state(model)))
    finally:
        manager.close()
    logits = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(full)))
    ours = logits[:, prompt.shape[1] - 1:-1].argmax(-1)
    np.testing.assert_array_equal(ours, full[:, prompt.shape[1]:])


def test_a_host_env_of_the_users_own_module_trains_by_name(tmp_path, config_file):
    """The README's Guess example (examples/guess_env.py), imported by run.py through
    env.module before the env is looked up, trained and evaluated."""
    done = _run_py(config_file, tmp_path / "guess", "--config.env.module=examples.guess_env",
                   "--config.env.name=guess", "--config.steps=1", "--config.eval_every=1",
                   "--config.eval.episodes=2")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "guess" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [0, 1]  # step 0: the evaluation before training
    assert "val/guess/greedy/success" in rows[0] and "train/success" not in rows[0]
    assert "val/guess/greedy/success" in rows[1] and "train/success" in rows[1]


def test_cost_lines_point_at_the_cpu_config_of_the_game():
    """The estimate as a range (speed.step_range: the timed matmul rates, the model's band)
    with the rate it was made at; a run far beyond a CPU session is pointed at the game's CPU
    config, with the SFT warm start that config requires (model.require_init_from)."""
    from starpo_jax.sizing.speed import MatmulRate, REFERENCE

    assert runner.cost_lines(12.0, 16, "bandit", rate=REFERENCE) == [
        "estimated time on this CPU: ~11-16 s a step, ~3-4 min for the 16 steps to run "
        "(autofit's step-time model at this machine's f32 matmul rate, measured now: 420 "
        "GFLOP/s; every reply at its full token budget; evaluations not included)"]
    loaded = runner.cost_lines(12.0, 16, "bandit", rate=MatmulRate(1.2e11, 0.75e11))
    assert loaded[0].startswith("estimated time on this CPU: ~8.5-20 s a step, ")
    assert "measured now: 75-120 GFLOP/s;" in loaded[0]
    long = runner.cost_lines(2046.0, 200, "sokoban", rate=REFERENCE)
    assert long[0].startswith("estimated time on this CPU: ~31-44 min a step, ~4.3-6.2 days for "
                              "the 200 steps to run")
    assert long[1] == (
        "that is far beyond a CPU session: experiments/configs/sokoban_cpu.py is the same game "
        "sized for a CPU (python experiments/sft.py --config sokoban_sft.py --workdir "
        "runs/sokoban_sft, then python experiments/run.py --config sokoban_cpu.py "
        "--config.model.init_from=runs/sokoban_sft --workdir runs/sokoban_cpu); running what "
        "was asked")
    far = runner.cost_lines(4e4, 200, "countdown", rate=REFERENCE)[1]
    assert "configs/quickstart.py is a run sized for a CPU (python experiments/run.py --config " \
        "quickstart.py --workdir runs/quickstart)" in far
    # A run on the CPU path already (an SFT run, or one naming that warm start) is not pointed
    # back at it.
    from starpo_jax.run.cli import load_config

    for own in ("coord_sokoban_sft.py", "coord_sokoban_cpu.py"):
        lines = runner.cost_lines(2046.0, 200, "coord_sokoban", rate=REFERENCE,
                                  config=load_config(own))
        assert len(lines) == 1, own
    assert len(runner.cost_lines(2046.0, 200, "coord_sokoban", rate=REFERENCE,
                                 config=load_config("coord_sokoban_ppo.py"))) == 2


def _spin(seconds: float):
    """A compiled loop calibrated to run about `seconds` here, and its argument."""
    spin = jax.jit(lambda n: jax.lax.fori_loop(0, n, lambda i, x: x * 0.999 + 1.0,
                                               jnp.float32(0)))
    n = 100_000
    spin(n).block_until_ready()
    start = time.perf_counter()
    spin(n).block_until_ready()
    return spin, int(n * seconds / max(time.perf_counter() - start, 1e-6))


def test_a_stop_is_heard_at_once_inside_a_compiled_call(capsys):
    """The main thread blocked in XLA (as in a long train step): both signals are answered
    while the call still runs, the second by the exit call (os._exit in a real run)."""
    spin, n = _spin(6.0)
    heard, exits = [], []

    def send():
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)
        heard.append(time.perf_counter()) if stop.wait(2.0) else None
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    with runner.stop_on_signals(exit=lambda code: exits.append((code, time.perf_counter()))) \
            as stop:
        stop.step_started, stop.step_seconds = time.perf_counter(), 600.0
        sender = threading.Thread(target=send)
        sender.start()
        spin(n).block_until_ready()
        returned = time.perf_counter()
        sender.join()
    assert heard and exits, "both signals answered"
    assert exits[0][0] == 128 + signal.SIGINT
    assert exits[0][1] < returned, "the second stop ended it while the call still ran"
    out = capsys.readouterr().out
    assert ("SIGINT: stop requested: saving after this step (about 10 min left by the step-time "
            "estimate); press Ctrl-C again to stop now") in out
    assert ("SIGINT again: stopping now without saving; no checkpoint was saved yet: --resume "
            "starts again from step 0") in out


@pytest.mark.optimized  # its time is running, not compiling (conftest)
@pytest.mark.slow  # a run.py process (~45 s): the slow tier; CI keeps the handler's test above
def test_a_second_ctrl_c_ends_a_run_at_once(tmp_path, config_file):
    workdir = tmp_path / "w"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "experiments" / "run.py"), "--config", str(config_file),
         "--workdir", str(workdir), "--config.steps=100000", "--config.check_memory=False"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
    try:
        lines = []
        read_until(process, lines, "step 3/")
        process.send_signal(signal.SIGINT)
        read_until(process, lines, "SIGINT: stop requested")
        rest, _, took = interrupt(process)
    finally:
        process.kill()
    out = "".join(lines) + rest
    assert process.returncode == 128 + signal.SIGINT, out[-3000:]
    assert took < 10, f"exited {took:.1f} s after the second Ctrl-C"
    assert "SIGINT: stop requested: saving after this step" in out
    again = [line for line in out.splitlines() if line.startswith("SIGINT again")]
    assert len(again) == 1 and "is where --resume continues" in again[0], out[-3000:]
    step = int(again[0].split("checkpoint, step ")[1].split(",")[0])
    saved = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert step >= 2 and step in saved  # step 3's line is printed before its save
    assert (workdir / "run.lock").read_text().startswith("run pid "), "the next run takes it over"


def test_ctrl_c_before_step_1_stops_at_once_and_leaves_nothing(tmp_path, config_file):
    """Ctrl-C while run.py compiles its first step (the setup JAX cannot interrupt) ends the
    process within a second: nothing trained, no checkpoint, no config.json, the lock released.
    A TF_CPP_MIN_LOG_LEVEL of the user's is kept."""
    workdir = tmp_path / "w"
    workdir.mkdir()  # the user's: it stays, empty
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "experiments" / "run.py"), "--config", str(config_file),
         "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env=_env(TF_CPP_MIN_LOG_LEVEL="1"))
    out, err = stopped_before_step_1(process, "compiling the train step")
    assert "TF_CPP_MIN_LOG_LEVEL=1" in out.splitlines()
    assert "Traceback" not in err
    left = {p.name: p for p in workdir.iterdir()}
    assert set(left) <= {"run.lock"}, f"left behind: {sorted(left)}"
    assert "run.lock" not in left or left["run.lock"].read_text() == "", "released"


def test_a_stop_before_the_first_step_saves_nothing(tmp_path, capsys):
    """A stop heard before step 1 (api.train's, where the process is not ended at once): no
    compile, no step, no step-0 checkpoint, nothing of a fresh run left; a resumed run's
    checkpoints and config.json as they were."""
    exp = tiny_experiment()
    exp.state = exp.fresh_state()
    stop = threading.Event()
    stop.set()
    workdir = tmp_path / "w"
    assert runner.train(exp, workdir, stop=stop) == 0
    assert "stopped before the first step: nothing was trained, nothing saved" in \
        capsys.readouterr().out
    assert not workdir.exists(), "the workdir it made, with no config.json, metrics, events"

    checkpoints = Checkpoints(workdir / "checkpoints", 1, 1)
    checkpoints.maybe_save(exp.state.replace(step=jnp.int32(1)), force=True)
    checkpoints.close()
    (workdir / "config.json").write_text(exp.config.to_json())
    assert runner.train(exp, workdir, resume=True, stop=stop) == 1
    assert "nothing was trained; the workdir's checkpoints and config.json are as they were" in \
        capsys.readouterr().out
    assert (workdir / "config.json").read_text() == exp.config.to_json()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]


def test_a_stop_before_the_start_ends_the_process_and_cleans_up(capsys):
    """run.py's StopRequests (exit_before_start): before begin() a signal runs the cleanups,
    last added first, and exits; after it, the stop saves after the current step."""
    exits, done = [], []
    stop = runner.StopRequests(exit=exits.append, exit_before_start=True)
    stop.on_exit_before_start(lambda: done.append("lock released"))
    stop.on_exit_before_start(lambda: done.append("run's files removed"))
    stop.heard(signal.SIGTERM)
    assert exits == [128 + signal.SIGTERM] and done == ["run's files removed", "lock released"]
    assert "SIGTERM before the first step: stopped; nothing was trained, nothing saved" in \
        capsys.readouterr().out

    exits.clear()
    stop = runner.StopRequests(exit=exits.append, exit_before_start=True)
    stop.begin()
    stop.heard(signal.SIGINT)  # after the setup, before step 1: ends there
    assert stop.is_set() and exits == []
    assert "SIGINT: stop requested before the first step" in capsys.readouterr().out
    stop = runner.StopRequests(exit=exits.append, exit_before_start=True)
    stop.begin()
    stop.stepped = True
    stop.heard(signal.SIGINT)
    assert "SIGINT: stop requested: saving after this step" in capsys.readouterr().out
    assert exits == []


def test_weights_and_biases_in_offline_mode(tmp_path, monkeypatch):
    """logging.wandb=True: the real wandb, offline (no network), gets the run's config, its
    project and name, and every step's metrics as written to metrics.jsonl."""
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    runs, logged = [], []
    init = wandb.init

    def recording_init(**kwargs):  # the real run, its log calls recorded on the way through
        runs.append(init(**kwargs))
        log = runs[-1].log
        monkeypatch.setattr(runs[-1], "log", lambda data, step: (logged.append((step, data)),
                                                                 log(data, step=step))[1])
        return runs[-1]

    monkeypatch.setattr(wandb, "init", recording_init)
    exp = tiny_experiment()
    exp.state = exp.fresh_state()
    before = exp.config.logging.to_dict()
    exp.config.steps = 2
    exp.config.logging.update(wandb=True, wandb_project="first-hour", wandb_name="tiny")
    try:
        assert runner.train(exp, tmp_path / "w") == 2
    finally:
        exp.config.logging.update(before)
        exp.config.steps = 30
    rows = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").read_text()
            .splitlines()]
    [made] = runs
    assert (made.project, made.name, made.id) == (
        "first-hour", "tiny", (tmp_path / "w" / "wandb_run_id").read_text().strip())
    assert made.config["rollout"]["groups"] == 2 and made.config["logging"]["wandb"]
    assert [(step, data) for step, data in logged] == [(r["step"], {k: v for k, v in r.items()
                                                                   if k != "step"}) for r in rows]
    [stored] = (tmp_path / "w" / "wandb").glob(f"offline-run-*-{made.id}/run-{made.id}.wandb")
    assert stored.stat().st_size > 0, "written for `wandb sync`"


def test_an_installed_package_registers_its_envs_by_entry_point(tmp_path, monkeypatch):
    """A distribution on the path whose `starpo_jax.envs` entry point names its env module:
    its env is valid by name with nothing else said (as after `pip install mypkg`)."""
    import envs_host.registry
    from starpo_jax.run import schema as run_config

    (tmp_path / "coin_envs.py").write_text(
        "import envs_host\n\n\nclass Coin(envs_host.HostEnv):\n"
        "    def reset(self, seed):\n        return 'Heads or tails?'\n\n"
        "    def step(self, action):\n        return 'Done.', 1.0, True, {'success': True}\n\n\n"
        "envs_host.register('coin', Coin)\n")
    info = tmp_path / "coin_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: coin-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[starpo_jax.envs]\ncoin = coin_envs\n")
    config = api.default_config()
    config.env.name = "coin"
    with pytest.raises(ValueError, match="config.env.name = 'coin' is invalid"):
        api.train_config(config)
    monkeypatch.syspath_prepend(str(tmp_path))
    # "coin" registered for this test only: the registry as it was comes back afterwards.
    monkeypatch.setattr(envs_host.registry, "_REGISTRY", dict(envs_host.registry._REGISTRY))
    run_config.load_env_entry_points.cache_clear()
    try:
        assert api.train_config(config).rollout.max_turns == 5  # EnvSettings' default
        assert "coin" in run_config.load_env_entry_points()
        broken = tmp_path / "broken_envs-0.1.dist-info"
        broken.mkdir()
        (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-envs\nVersion: 0.1\n")
        (broken / "entry_points.txt").write_text("[starpo_jax.envs]\nbroken = no_such_envs\n")
        run_config.load_env_entry_points.cache_clear()
        with pytest.raises(ValueError, match=r"^entry point broken = 'no_such_envs' of the group "
                           r"'starpo_jax.envs' failed: ModuleNotFoundError: No module named"):
            api.train_config(config)
    finally:
        run_config.load_env_entry_points.cache_clear()
        sys.modules.pop("coin_envs", None)


def test_a_repeated_sigterm_keeps_the_save_and_ctrl_c_still_stops_at_once(capsys):
    """`timeout` (and a kill of a process group) delivers one SIGTERM twice: the stop it asked
    for still saves; Ctrl-C after it ends the run at once."""
    exits = []
    stop = runner.StopRequests(exit=exits.append)
    stop.heard(signal.SIGTERM)
    stop.heard(signal.SIGTERM)
    assert stop.is_set() and exits == []
    stop.saved_step = 4
    stop.heard(signal.SIGINT)
    assert exits == [128 + signal.SIGINT]
    out = capsys.readouterr().out
    assert "SIGTERM again: still saving after this step (Ctrl-C stops at once)" in out
    assert "SIGINT again: stopping now without saving; the newest complete checkpoint, step 4, " \
        "is where --resume continues" in out
