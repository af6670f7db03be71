"""OpenEnv servers as host envs (envs_host.openenv_client), against a real server of a tiny
game (tests/helpers/openenv_game.py: openenv-core's server API, uvicorn in a subprocess):
episodes equal the game played directly, concurrent rows keep to their own sessions, training
through run.py by the docs' commands and through the functional API, and the faults: a server
down at the start, one that dies mid-run (back in time, or not: a clean stop, then --resume),
a slow step, answers that are not OpenEnv's."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv")

import envs_host  # noqa: E402
from envs_host import EnvPool, HostEnv, HostEnvError, PoolConfig  # noqa: E402
from envs_host.openenv_client import OpenEnvClient, OpenEnvError  # noqa: E402
from helpers.openenv_game import GameServer, GuessAction, HiLo, free_port, read_log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."


@pytest.fixture(scope="module")
def game(tmp_path_factory):
    """The game served for this module: 16 sessions, "wait" takes 5 s, messages logged."""
    log = tmp_path_factory.mktemp("game") / "log.jsonl"
    with GameServer(None, "--sessions", "16", "--slow", "5", "--log", str(log)) as server:
        server.log = log
        yield server


def _direct(seed: int, actions: list[str]) -> list[tuple]:
    """The game played in this process: the first text, then (text, reward, done, solved)."""
    env = HiLo()
    out = [env.reset(seed=seed).text]
    for action in actions:
        o = env.step(GuessAction(message=action))
        out.append((o.text, float(o.reward), o.done, o.solved))
    return out


def _state_target(seed: int) -> int:
    env = HiLo()
    env.reset(seed=seed)
    return env.state.target


def _played(client: HostEnv, seed: int, actions: list[str]) -> list[tuple]:
    out = [client.reset(seed)]
    for action in actions:
        text, reward, done, info = client.step(action)
        out.append((text, reward, done, info["success"]))
    return out


def _scripts(seed: int) -> list[list[str]]:
    """A won episode (a non-number, a miss, the number) and a lost one (three misses)."""
    t = _state_target(seed)
    miss = [str(n) for n in range(1, 10) if n != t]
    return [["abc", miss[0], str(t)], miss[:3]]


def test_episodes_through_the_client_equal_the_game_played_directly(game):
    name = f"openenv:{game.url}"
    assert envs_host.known(name) and "openenv:<url>" in envs_host.namespaces()
    assert envs_host.factory(name, timeout=7.0)().timeout == 7.0
    plain = envs_host.make(name)  # defaults: the one string field, success at reward >= 1
    named = OpenEnvClient(game.url, action_field="message", observation_field="text",
                          success_field="solved", instructions="Guess.")
    assert plain.observation_field == "text" and named.instructions == "Guess."
    assert plain.instructions == "HiLo environment"  # the server's /metadata description
    for seed in (0, 1, 7, 123456789):
        for actions in _scripts(seed):
            want = _direct(seed, actions)
            assert _played(plain, seed, actions) == want
            assert _played(named, seed, actions) == want
    assert any(done and solved for seed in (0, 1) for *_, done, solved in
               _direct(seed, _scripts(seed)[0])[1:])  # the scripts do win
    # observation_format fills in the fields, a callable maps them; or every field a line.
    formatted = OpenEnvClient(game.url, observation_format="{text} ({guesses_left} left)")
    assert formatted.reset(3) == "Guess a number from 1 to 9. You have 3 guesses. (3 left)"
    called = OpenEnvClient(game.url, observation_field=lambda o: f"<{o['guesses_left']}>")
    assert called.reset(3) == "<3>"
    every = OpenEnvClient(game.url)
    every.observation_field = None  # as when the observation has several string fields
    assert every.reset(3) == ("text: Guess a number from 1 to 9. You have 3 guesses.\n"
                              "guesses_left: 3\nsolved: false")
    # An action the action's schema refuses (over 32 characters): invalid, nothing changes.
    seed, (won, _) = 5, _scripts(5)
    plain.reset(seed)
    assert plain.step("9" * 40) == (_direct(seed, [])[0], 0.0, False, {
        "success": False, "action_is_valid": False, "action_is_effective": False})
    assert [plain.step(a)[:3] for a in won] == [w[:3] for w in _direct(seed, won)[1:]]
    with pytest.raises(OpenEnvError, match="step after the episode ended"):
        plain.step("1")


def test_kwargs_the_server_lacks_are_named_with_the_valid_ones(game):
    for kwargs, bad in (({"action_field": "msg"}, "action_field names 'msg'"),
                        ({"observation_field": "board"}, "observation_field names 'board'"),
                        ({"observation_format": "{text} {score}"},
                         "observation_format names 'score'"),
                        ({"success_field": "won"}, "success_field names 'won'")):
        with pytest.raises(HostEnvError, match=re.escape(bad) + r".*; valid: \["):
            OpenEnvClient(game.url, **kwargs)


def test_concurrent_rows_play_their_own_episodes(game):
    """Four rows in the pool's threads, two groups of two on one seed each, each row its own
    actions: every row's episode is the game's, each on its own server session."""
    name = f"openenv:{game.url}"
    pool = EnvPool(name, envs_host.factory(name), rows=4, config=PoolConfig(workers=4))
    try:
        seeds = [11, 11, 12, 12]
        scripts = [_scripts(11)[0], _scripts(11)[1], _scripts(12)[1], _scripts(12)[0]]
        first = pool.reset(seeds)
        assert first == [_direct(s, [])[0] for s in seeds]
        played = [[] for _ in seeds]
        for i in range(3):
            due = {row: script[i] for row, script in enumerate(scripts)
                   if not (played[row] and played[row][-1][2])}
            for row, (text, reward, done, info) in pool.step(due).items():
                played[row].append((text, reward, done, info["success"]))
            if i == 0:  # one step each so far, on four sessions of the server
                states = [pool._envs[row].state() for row in range(4)]
                assert [s["step_count"] for s in states] == [1, 1, 1, 1]
                assert len({s["target"] for s in states[:2]}) == 1
        for row, seed in enumerate(seeds):
            assert played[row] == _direct(seed, scripts[row])[1:], row
        assert not pool.failures
        sessions = {e["session"] for e in read_log(game.log) if e.get("seed") in (11, 12)}
        assert len(sessions) >= 4
    finally:
        pool.close()


def test_sessions_are_released_after_a_rollout_and_a_full_server_is_named():
    """end_episodes() (a rollout's end) frees the rows' sessions for the next pool; rows
    beyond the server's sessions stop the run with the setting to change."""
    with GameServer(None, sessions=2) as server:
        name = f"openenv:{server.url}"
        factory = envs_host.factory(name, retry_seconds=1.0)
        first, second = EnvPool(name, factory, rows=2), EnvPool(name, factory, rows=2)
        try:
            first.reset([1, 1])  # both sessions held ...
            first.end_episodes()  # ... until the rollout ends
            assert second.reset([2, 2]) == [_direct(2, [])[0]] * 2 and not second.failures
            start = time.monotonic()
            with pytest.raises(HostEnvError, match=re.escape(
                    f"OpenEnv server {server.url} unreachable while reset (all 2 sessions of "
                    "the server in use: serve it with max_concurrent_envs >= the rollout's "
                    "rows)")):
                first.reset([3, 3])
            assert time.monotonic() - start < 10
        finally:
            first.close(), second.close()


# ---------------------------------------------------------------------------------- faults
def test_a_server_that_is_down_is_named_after_the_retries():
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(HostEnvError, match=re.escape(f"OpenEnv server {url} unreachable while "
                                                     "connecting (") + r".*retried for \d+ s "
                                                     r"\(retry_seconds = 1\)"):
        OpenEnvClient(url, retry_seconds=1.0)
    assert 0.9 < time.monotonic() - start < 5
    for processes in (False, True):  # a stop, not failed rows, in either backend
        pool = EnvPool("openenv:" + url, envs_host.factory("openenv:" + url,
                                                           retry_seconds=0.5),
                       rows=2, config=PoolConfig(processes=processes))
        with pytest.raises(HostEnvError, match="unreachable while connecting"):
            pool.reset([1, 1])
        pool.close()


def test_a_server_killed_mid_episode_and_restarted_is_replayed(tmp_path):
    """The server dies (SIGKILL) between two steps and comes back on its port: the step is
    retried on a new session after the episode's replay, and the episode is the game's. Not
    back within retry_seconds: HostEnvError (the run stops); a replay that differs from the
    recorded episode fails the row (OpenEnvError)."""
    log = tmp_path / "log.jsonl"
    server = GameServer(None, "--log", str(log)).start()
    try:
        client = OpenEnvClient(server.url, retry_seconds=120.0)
        seed, (won, _) = 21, _scripts(21)
        want = _direct(seed, won)
        assert client.reset(seed) == want[0]
        assert client.step(won[0])[:3] == want[1][:3]
        server.kill()
        threading.Timer(1.0, server.start).start()
        assert client.step(won[1])[:3] == want[2][:3]  # waited for the restart, replayed
        entries = read_log(log)
        assert [e["kind"] for e in entries] == ["start", "reset", "step", "start", "reset",
                                                "step", "step"]
        sessions = [e["session"] for e in entries if e["kind"] != "start"]
        assert sessions[0] == sessions[1] and sessions[2] == sessions[3] == sessions[4]
        assert client.step(won[2])[:3] == want[3][:3]
        # A replay that does not give the recorded answers: the row fails, the run goes on.
        client.reset(seed)
        client.step(won[0])
        client._first = {**client._first, "observation": {"text": "another game"}}
        client.end_episode()  # the connection lost
        with pytest.raises(OpenEnvError, match="not deterministic"):
            client.step(won[1])
        # Not back in time: the run stops, naming the server.
        client = OpenEnvClient(server.url, retry_seconds=1.0)
        client.reset(seed)
        server.kill()
        with pytest.raises(HostEnvError, match=re.escape(f"OpenEnv server {server.url} "
                                                         "unreachable while step")):
            client.step(won[0])
    finally:
        server.kill()


def test_a_slow_step_fails_its_row_and_the_others_go_on(game):
    """The message "wait" takes 5 s on the server. The client's timeout (1 s) fails the row
    with its reason; with a longer client timeout the pool's own (host.timeout) does; the
    other row's step is the game's either way, and nothing waits for the 5 s."""
    name = f"openenv:{game.url}"
    for client_timeout, pool_timeout, reason in (
            (1.0, 30.0, "no answer to step within timeout = 1 s"),
            (30.0, 1.0, "timed out after 1 s")):
        pool = EnvPool(name, envs_host.factory(name, timeout=client_timeout), rows=2,
                       config=PoolConfig(workers=2, timeout=pool_timeout))
        try:
            pool.reset([4, 4])
            start = time.monotonic()
            out = pool.step({0: "wait", 1: "abc"})
            assert time.monotonic() - start < 4.5
            assert out[0] is None and out[1][:3] == _direct(4, ["abc"])[1][:3]
            assert [f.row for f in pool.failures] == [0] and reason in pool.failures[0].reason
        finally:
            pool.close()


@pytest.mark.parametrize("kind, what", [
    ("nonjson", "answered reset with '<html>502 Bad Gateway</html>', not a JSON object"),
    ("nofields", "answered reset with data {'reward': 0.0}; expected an 'observation' object")])
def test_answers_that_are_not_openenv_s_stop_naming_the_server(kind, what):
    with GameServer(None, "--broken", kind) as server:
        client = OpenEnvClient(server.url)
        with pytest.raises(HostEnvError, match=re.escape(f"OpenEnv server {server.url} {what}")):
            client.reset(1)
        pool = EnvPool("openenv:" + server.url, envs_host.factory("openenv:" + server.url),
                       rows=2)
        with pytest.raises(HostEnvError, match=re.escape(what)):  # the run stops
            pool.reset([1, 1])
        pool.close()


class _Broken(HostEnv):
    """An env whose step says the run cannot go on (as the client does)."""

    def reset(self, seed):
        return "s"

    def step(self, action):
        if action == "stop":
            raise HostEnvError("the server is gone")
        raise RuntimeError("just this row")


def test_the_pool_stops_on_an_env_s_own_host_env_error():
    pool = EnvPool("broken", _Broken, rows=2)
    try:
        pool.reset([1, 2])
        assert pool.step({0: "go", 1: "go"}) == {0: None, 1: None}  # rows fail, the run goes on
        pool.reset([1, 2])
        with pytest.raises(HostEnvError, match="the server is gone"):
            pool.step({0: "go", 1: "stop"})
    finally:
        pool.close()


# -------------------------------------------------------------------------------- training
def _config_file(path: Path, url: str, **kwargs) -> Path:
    """A run.py config: helpers.tiny's tiny config (tiny-random, 2 x 2 rows, a checkpoint
    every step) on the OpenEnv server at `url`, 2 turns, 2 steps, no evaluation."""
    path.write_text(f"""
from helpers.tiny import tiny_config


def get_config():
    c = tiny_config()
    c.env.name = "openenv:{url}"
    c.env.kwargs = {kwargs!r}
    c.rollout.max_turns = 2
    c.steps, c.progress_after = 2, 0
    return c
""")
    return path


def _run_py(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "run.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _metrics(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _section(page: Path, title: str) -> str:
    text = page.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start: text.index("\n## ", start + 1)]


def test_the_docs_commands_serve_the_game_and_train_on_it(tmp_path):
    """docs/environments.md's OpenEnv commands as written (the server on a free port, the
    tiny model, 1 step, evaluated): the rows of a group share a seed, each on its own
    session, and the run trains and evaluates through the client."""
    from test_docs import shell_commands

    section = _section(ROOT / "docs" / "environments.md", "OpenEnv and HTTP environments")
    commands = [c for lang, text in blocks_of(section) if lang == "bash"
                for c in shell_commands(text) if not c.startswith("pip ")]
    assert [c.split()[:2] for c in commands] == [
        ["python", "tests/helpers/openenv_game.py"], ["python", "experiments/run.py"]]
    port, log, workdir = free_port(), tmp_path / "log.jsonl", tmp_path / "openenv"
    serve = shlex.split(commands[0].rstrip("&").replace("8000", str(port)))[2:]
    assert commands[0].endswith("&")
    with GameServer(port, *serve[2:], "--log", str(log)):
        run = shlex.split(commands[1])[2:]
        run[run.index("--workdir") + 1] = str(workdir)
        done = _run_py(*run, f"--config.env.name=openenv:http://127.0.0.1:{port}",
                       "--config.model.source=tiny-random", "--config.steps=1",
                       "--config.rollout.groups=2", "--config.rollout.group_size=2",
                       "--config.rollout.reply_tokens=4", "--config.eval_every=1",
                       "--config.eval.episodes=2", "--config.checkpoint_every=1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _metrics(workdir)
    assert [r["step"] for r in rows] == [1] and rows[0]["host/failed_rows"] == 0
    assert any(k.startswith("val/openenv:") and k.endswith("/greedy/success") for k in rows[0])
    resets = [e for e in read_log(log) if e["kind"] == "reset"]
    assert len(resets) == 4 + 2  # 2 groups x 2 rows, then 2 held-out episodes
    train = resets[:4]
    assert sorted({e["seed"] for e in train}) == sorted(e["seed"] for e in train)[::2]
    assert len({e["session"] for e in resets}) == 6  # a session per episode


def blocks_of(text: str) -> list[tuple[str, str]]:
    from test_docs import FENCE

    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def test_training_steps_the_server_s_env_and_scores_what_it_says(game, tmp_path):
    """The functional API on the tiny model, every reply forced to answer 5 (so the env is
    stepped): each step's rows are the server's episodes, and train/success is the share of
    rows whose hidden number was 5."""
    from helpers.tiny import tiny_config
    from starpo_jax import api
    from starpo_jax.rollout.host_text import build_host_text
    from starpo_jax.run import loop as runner

    c = tiny_config()
    c.env.name, c.env.kwargs = f"openenv:{game.url}", {"success_field": "solved"}
    c.rollout.max_turns, c.steps = 2, 2
    exp = api.build(c)
    step = exp.train_step
    step.text = build_host_text(exp.tokenizer, envs_host.make(c.env.name), exp.train.rollout,
                                forced_prefix="<answer>5</answer>", system="", intro="",
                                turn=c.prompt.turn)
    before = len(read_log(game.log))
    assert runner.train(exp, tmp_path / "run") == 2
    entries = read_log(game.log)[before:]
    rows = _metrics(tmp_path / "run")
    at = [i for i, e in enumerate(entries) if e["kind"] == "reset"]
    assert len(at) == 8  # 4 rows a step
    hits = 0
    for k, row in enumerate(rows):
        seeds = [entries[i]["seed"] for i in at[4 * k: 4 * k + 4]]
        hit = [_state_target(s) == 5 for s in seeds]
        assert row["train/success"] == pytest.approx(sum(hit) / 4), (seeds, row)
        assert row["rollout/action_is_valid"] == 1.0 and row["host/failed_rows"] == 0
        assert row["rollout/num_actions"] == pytest.approx(sum(1 if h else 2 for h in hit) / 4)
        hits += sum(hit)
    assert hits  # the run's seeds (fixed by its key) include a won game: 2 rows of step 1
    assert {e["message"] for e in entries if e["kind"] == "step"} == {"5"}


def test_a_server_down_at_the_start_is_one_line_and_leaves_nothing(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    config = _config_file(tmp_path / "down.py", url, retry_seconds=1.0)
    done = _run_py("--config", str(config), "--workdir", str(tmp_path / "run"))
    assert done.returncode == 1
    assert _one_line(done.stderr).startswith(f"error: OpenEnv server {url} unreachable while "
                                             "connecting (")
    assert not (tmp_path / "run").exists()  # as any run that fails before its first step


@pytest.mark.slow
def test_a_server_that_dies_mid_run_and_comes_back_is_waited_for(tmp_path):
    """The server exits (as if killed) in step 2's rollout and the test starts it again: the
    rows' calls are retried until it is back, and the run ends as if nothing happened."""
    log = tmp_path / "log.jsonl"
    server = GameServer(None, "--die-after", "5", "--log", str(log)).start()
    restarted, ending = threading.Event(), threading.Event()

    def restart():
        if server.process.wait() == 1 and not ending.is_set():  # its own exit, not our kill
            server.start("--sessions", "16", "--log", str(log))
            restarted.set()

    watcher = threading.Thread(target=restart, daemon=True)
    watcher.start()
    try:
        config = _config_file(tmp_path / "back.py", server.url, retry_seconds=120.0)
        done = _run_py("--config", str(config), "--workdir", str(tmp_path / "run"))
        assert done.returncode == 0, done.stderr[-3000:]
        assert restarted.is_set()
        rows = _metrics(tmp_path / "run")
        assert [r["step"] for r in rows] == [1, 2]
        assert [r["host/failed_rows"] for r in rows] == [0, 0]
        kinds = [e["kind"] for e in read_log(log)]
        # 4 resets of step 1 and the one step 2's rows have before the server dies (its answer
        # may be lost with it); step 2's 3 other rows (or 4) reset again once it is back.
        assert kinds[:6] == ["start"] + ["reset"] * 5 and kinds[6] == "start"
        assert kinds[7:] in (["reset"] * 3, ["reset"] * 4), kinds
        step_2 = [e["seed"] for e in read_log(log)[5:] if e["kind"] == "reset"]
        assert len(set(step_2)) == 2  # both groups' rows, each group on its own seed
    finally:
        ending.set()
        server.kill()
        watcher.join(150)
        server.kill()


@pytest.mark.slow
def test_a_server_that_dies_for_good_stops_the_run_cleanly_and_resume_continues(tmp_path):
    """The server exits in step 2's rollout and stays down: the run stops with one line
    naming it after retry_seconds, step 1's checkpoint and metrics whole, the lock released;
    with the server back, --resume trains step 2."""
    server = GameServer(None, "--die-after", "5").start()
    workdir = tmp_path / "run"
    try:
        config = _config_file(tmp_path / "gone.py", server.url, retry_seconds=2.0)
        done = _run_py("--config", str(config), "--workdir", str(workdir))
        assert done.returncode == 1
        assert _one_line(done.stderr).startswith(f"error: OpenEnv server {server.url} "
                                                 "unreachable while reset (")
        assert [r["step"] for r in _metrics(workdir)] == [1]  # every line whole JSON
        assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["1"]
        assert not (workdir / "run.lock").exists()
        server.kill()
        server.start("--sessions", "16")
        done = _run_py("--config", str(config), "--workdir", str(workdir), "--resume")
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r["step"] for r in _metrics(workdir)] == [1, 2]
    finally:
        server.kill()
