"""TextArena's single-player games as host envs (envs_host.textarena_env), on the real library:
scripted episodes against TextArena driven by hand (same texts, rewards, ends, wins), invalid
moves, determinism of reset(seed) across instances, threads and processes, the one-line
refusals (network games, multi-player games), and, slow, training three games and the docs'
command for a step with the tiny model."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ta = pytest.importorskip("textarena")

import envs_host  # noqa: E402
from envs_host.textarena_env import (TextArenaEnv, TextArenaGameError, game_problem,  # noqa: E402
                                     offline_games)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "environments.md"
ADMIN, ACTION = ta.ObservationType.GAME_ADMIN, ta.ObservationType.PLAYER_ACTION


class Direct:
    """TextArena driven by hand (its "-raw" game, no wrappers): the reference. Its validity
    comes from TextArena's own messages (the invalid-move warning, game_info["invalid_move"]),
    not from the turn counter the adapter reads."""

    def __init__(self, env_id: str, **kwargs):
        self.game = ta.make(f"{env_id}-raw", **kwargs)

    def _text(self) -> tuple[str, bool]:
        _, messages = self.game.get_observation()
        warned = any(kind == ADMIN and "attempted an invalid move" in str(text)
                     for _, text, kind in messages)
        parts = [str(text).strip() for _, text, kind in messages if kind != ACTION]
        parts = [p for p in parts if p]
        return "\n\n".join(parts), warned

    def reset(self, seed: int) -> str:
        random.seed(seed)
        self.game.reset(num_players=1, seed=seed)
        return self._text()[0]

    def step(self, move: str):
        done, _ = self.game.step(move if "[" in move or "]" in move else f"[{move}]")
        text, warned = self._text()
        if not done:
            return text, 0.0, False, {"success": False, "action_is_valid": not warned,
                                      "action_is_effective": not warned}
        rewards, info = self.game.close()
        reward, ended_invalid = rewards[0], info[0]["invalid_move"]
        reward = float(reward) if isinstance(reward, (int, float)) else 0.0  # the documented rule
        text = f"{text}\n\n{info[0]['reason']}".strip()
        return text, reward, True, {"success": reward >= 1 and not ended_invalid,
                                    "action_is_valid": not (warned or ended_invalid),
                                    "action_is_effective": not (warned or ended_invalid)}


class _Guess:
    """Guesses "abc" (invalid), then searches 1..20 by the game's "higher" / "lower"."""

    def __init__(self):
        self.low, self.high, self.last = 1, 20, None

    def __call__(self, obs, game):
        if self.last is None:
            self.last = 0
            return "abc"
        if obs.startswith("The target number is higher"):
            self.low = self.last + 1
        elif obs.startswith("The target number is lower"):
            self.high = self.last - 1
        self.last = (self.low + self.high) // 2
        return str(self.last)


def _hanoi():
    moves = iter(["C A", "A C", "A B", "C B", "A C", "B A", "B C", "A C"])  # C A: empty tower
    return lambda obs, game: next(moves)


def _mastermind():
    """A guess of two numbers (invalid), the code reversed, then the code (read from the game)."""
    count = [0]

    def policy(obs, game):
        code = game.state.game_state["secret_code"]
        count[0] += 1
        return {1: "1 2", 2: " ".join(map(str, code[::-1]))}.get(count[0], " ".join(map(str, code)))
    return policy


def _minesweeper():
    """[2 2] twice (the second: already revealed, invalid), then every safe cell left."""
    count = [0]

    def policy(obs, game):
        count[0] += 1
        if count[0] <= 2:
            return "[2 2]"
        return next(f"[{r} {c}]" for r in range(game.rows) for c in range(game.cols)
                    if not game.revealed[r][c] and game.grid[r][c] != -1)
    return policy


SCRIPTS = {"GuessTheNumber-v0": _Guess, "TowerOfHanoi-v0": _hanoi, "Mastermind-v0": _mastermind,
           "Minesweeper-v0-small": _minesweeper}


def _play(env, reset, policy, seed: int, limit: int = 40) -> list:
    """[first observation, (move, step result), ...] until the game ends (or `limit` moves)."""
    obs = reset(seed)
    out = [obs]
    game = env._game if isinstance(env, TextArenaEnv) else env.game
    for _ in range(limit):
        move = policy(obs, game)
        result = env.step(move)
        out.append((move, result))
        obs = result[0]
        if result[2]:
            break
    return out


@pytest.mark.parametrize("env_id", sorted(SCRIPTS))
def test_scripted_episode_is_textarena_s_own(env_id):
    """The adapter's episode is TextArena's, step for step; each script makes an invalid move
    (flagged, the game goes on) and then wins (reward 1, success, on the last step only)."""
    ours = TextArenaEnv(env_id)
    for seed in (0, 7):
        direct = Direct(env_id)
        got = _play(ours, ours.reset, SCRIPTS[env_id](), seed)
        want = _play(direct, direct.reset, SCRIPTS[env_id](), seed)
        assert got == want
        steps = [result for _, result in got[1:]]
        assert [r[3]["action_is_valid"] for r in steps].count(False) == 1
        assert all(not r[2] and r[1] == 0.0 and not r[3]["success"] for r in steps[:-1])
        last = steps[-1]
        assert last[1:3] == (1.0, True) and last[3]["success"] and last[3]["action_is_valid"]
        assert got[0] and "[" in got[0]  # the rules: moves are written in brackets


# Random moves in each game's own format (and some that are not), compared with TextArena's.
VOCABULARY = ["up", "down", "left", "right", "[1 2]", "[0 0]", "[3 1]", "7", "[1 1 5]", "A C",
              "[B C]", "accept", "continue", "[0]", "[2]", "Hit", "Stand", "red", "[0 1 +]",
              "nonsense", "[h 1 1]", "1 2 3 4"]
FAST = ["2048-v0-ultra-easy", "Bandit-v0", "Blackjack-v0", "Countdown-v0", "Cryptarithm-v0",
        "FifteenPuzzle-v0", "FrozenLake-v0", "LightsOut-v0", "Secretary-v0", "Slitherlink-v0",
        "Sudoku-v0-very-easy", "ThreeCardMonte-v0", "TowerOfHanoi-v0", "Minesweeper-v0"]


@pytest.mark.parametrize("env_id", FAST)
def test_random_moves_match_textarena(env_id):
    ours, direct = TextArenaEnv(env_id), Direct(env_id)
    for seed in (1, 2):
        pick = random.Random(seed)
        moves = [pick.choice(VOCABULARY) for _ in range(30)]
        script = lambda: (lambda it: (lambda obs, game: next(it)))(iter(moves))  # noqa: E731
        assert _play(ours, ours.reset, script(), seed, 30) == \
            _play(direct, direct.reset, script(), seed, 30)


def test_invalid_moves_warn_then_end_the_game():
    """TextArena's rule: one invalid move is a warning (the turn is not counted), a second in a
    row ends the game with the game's reward; both are invalid and ineffective (the rollout's
    "invalid" failure class counts effective actions), neither succeeds."""
    env = TextArenaEnv("GuessTheNumber-v0")
    env.reset(3)
    text, reward, done, info = env.step("twelve")
    assert (reward, done, info) == (0.0, False, {"success": False, "action_is_valid": False,
                                                 "action_is_effective": False})
    assert text.startswith("You attempted an invalid move.")
    assert env.step("12")[3]["action_is_valid"]  # a valid move clears the warning
    assert not env.step("[30]")[3]["action_is_valid"]  # out of range
    text, reward, done, info = env.step("[12]")  # repeated: the second invalid move in a row
    assert done and not info["success"] and not info["action_is_valid"]
    assert text.endswith("Invalid Move: Invalid move. Player 0 has already guessed the number.")
    assert 0.0 < reward < 1.0  # TextArena's fraction completed
    with pytest.raises(RuntimeError, match="step after the game ended"):
        env.step("5")


def test_reset_is_deterministic_per_seed_and_leaves_random_alone():
    for env_id in ("Sudoku-v0-very-easy", "FrozenLake-v0-random", "Mastermind-v0"):
        a, b = TextArenaEnv(env_id), TextArenaEnv(env_id)
        firsts = {a.reset(seed) for seed in range(6)}
        assert all(b.reset(seed) == a.reset(seed) for seed in range(6))
        if env_id != "Mastermind-v0":  # its first screen shows no code
            assert len(firsts) > 1, env_id
    # Mastermind's code comes from the seed: the same answers to the same guess, per seed.
    a, b = TextArenaEnv("Mastermind-v0"), TextArenaEnv("Mastermind-v0")
    answers = set()
    for seed in range(6):
        a.reset(seed), b.reset(seed)
        answer = a.step("1 2 3 4")
        assert b.step("1 2 3 4") == answer
        answers.add(repr(answer))
    assert len(answers) > 1
    random.seed(123)
    expected = [random.random() for _ in range(3)]
    random.seed(123)
    a.reset(5), a.step("4 3 2 1")
    assert [random.random() for _ in range(3)] == expected  # the process's random untouched


def test_threads_do_not_mix_their_games():
    """Minesweeper lays its mines at the first move, from the game's random state: rows reset
    together, then stepped in parallel threads move by move (as the pool steps them), play the
    games they would play alone."""
    moves = ["[2 2]", "[0 0]", "[4 4]", "[0 4]", "[4 0]", "[1 3]", "[3 1]", "[2 0]"]
    seeds = range(6)

    def play(env, out, barrier=None):
        for move in moves:
            if barrier is not None:
                barrier.wait()  # every row makes its k-th move before any makes its k+1-th
            if len(out) == 1 or not out[-1][2]:
                out.append(env.step(move))

    alone = {}
    for seed in seeds:
        env = TextArenaEnv("Minesweeper-v0-small")
        alone[seed] = [env.reset(seed)]
        play(env, alone[seed])
    envs = {seed: TextArenaEnv("Minesweeper-v0-small") for seed in seeds}
    together = {seed: [env.reset(seed)] for seed, env in envs.items()}
    barrier = threading.Barrier(len(envs))
    threads = [threading.Thread(target=play, args=(envs[seed], together[seed], barrier))
               for seed in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    assert len({repr(v[1:]) for v in alone.values()}) > 1  # the seeds differ


CROSS_PROCESS = """
import json, sys
from envs_host.textarena_env import TextArenaEnv
out = {}
for env_id in sys.argv[1:]:
    env = TextArenaEnv(env_id)
    out[env_id] = [env.reset(4)]
    for move in ("[1 2 3]", "[2 2]", "up", "[3 3]"):
        out[env_id].append(list(env.step(move)[:3]))
        if out[env_id][-1][2]:
            break
print(json.dumps(out))
"""


def test_reset_is_the_same_in_another_process():
    """Spawned pool workers hash strings with other seeds: the games must not depend on it."""
    games = ["Set-v0", "Sudoku-v0-very-easy", "Minesweeper-v0-small", "FrozenLake-v0-random",
             "RushHour-v0", "LogicPuzzle-v0", "Crosswords-v0"]
    runs = [json.loads(subprocess.run(
        [sys.executable, "-c", CROSS_PROCESS, *games], capture_output=True, text=True,
        cwd=ROOT, check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout.splitlines()[-1])
        for seed in ("1", "2")]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_pools_play_the_games_one_instance_plays(processes):
    """The rollout's pool (envs_host.EnvPool) of "textarena:" rows, threads or spawned processes:
    the same games as one instance alone, no failed rows."""
    name, seeds = "textarena:Minesweeper-v0-small", [2, 2, 5, 5]
    moves = ["[2 2]", "[0 0]", "[4 4]"]
    pool = envs_host.EnvPool(name, envs_host.factory(name), rows=4,
                             config=envs_host.PoolConfig(workers=4, processes=processes))
    try:
        got = [[obs] for obs in pool.reset(seeds)]
        for move in moves:
            for row, result in pool.step({row: move for row in range(4)}).items():
                got[row].append(result)
        assert not pool.failures
    finally:
        pool.close()
    env = envs_host.make(name)
    for row, seed in enumerate(seeds):
        assert got[row] == [env.reset(seed)] + [env.step(move) for move in moves]


def _first_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_games_that_cannot_run_are_refused_in_one_line():
    for env_id, why in [("Hangman-v0", "downloads nltk data ('words') at import "
                                       "(textarena/envs/Hangman/env.py), which needs the network"),
                        ("Wordle-v0", "nltk data ('averaged_perceptron_tagger_eng', 'words')"),
                        ("TwentyQuestions-v0", "asks LLMs through the OpenRouter API"),
                        ("TicTacToe-v0", "it is a multi-player game (TwoPlayerState)"),
                        ("Poker-v0", "it is a multi-player game (FFAMultiPlayerState)"),
                        ("Klondike-v0", "does not import (SyntaxError")]:
        with pytest.raises(TextArenaGameError) as error:
            envs_host.make(f"textarena:{env_id}")
        line = _first_line(error)
        assert line.startswith(f"textarena game {env_id!r} cannot run here: ") and why in line
        assert isinstance(error.value, ValueError)  # run.py prints it as one line
    with pytest.raises(TextArenaGameError) as error:
        TextArenaEnv("Nope-v0")
    assert "unknown textarena game 'Nope-v0'; single-player games that run offline: " \
        "2048-v0-ultra-easy," in _first_line(error)
    games = offline_games()
    assert {"GuessTheNumber-v0", "Mastermind-v0", "TowerOfHanoi-v0", "Sudoku-v0"} <= set(games)
    assert not {"Hangman-v0", "Wordle-v0", "TicTacToe-v0", "Klondike-v0"} & set(games)
    assert all(game_problem(g) is None for g in games)


def test_a_game_whose_state_is_not_single_player_is_refused(monkeypatch):
    """Where the source says nothing, a trial game for one player decides."""
    import envs_host.textarena_env as module

    real = module._source
    monkeypatch.setattr(module, "_source", lambda ep: ("", real(ep)[1])
                        if "TicTacToe" in str(ep) else real(ep))
    monkeypatch.setattr(module, "game_problem", lambda env_id: None)
    with pytest.raises(TextArenaGameError) as error:
        TextArenaEnv("TicTacToe-v0")
    assert "reset(num_players=1) raised AssertionError: The number of players has to be 2" \
        in _first_line(error)


def test_without_textarena_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(ImportError, match=r'pip install "starpo-jax\[textarena\]"'):
        envs_host.make("textarena:GuessTheNumber-v0")


def test_the_namespace_and_keyword_arguments():
    assert envs_host.known("textarena:Mastermind-v0")
    env = envs_host.make("textarena:GuessTheNumber-v0", max_number=5, observation_tokens=99)
    assert isinstance(env, TextArenaEnv) and env.env_id == "GuessTheNumber-v0"
    assert "between 1 and 5" in env.reset(0) and env.observation_tokens == 99
    assert TextArenaEnv.observation_tokens == 384 and TextArenaEnv.action_names is None
    assert TextArenaEnv.settings.max_actions_per_turn == 1


@pytest.mark.slow
def test_every_offline_game_plays():
    """Each listed game builds, resets and takes a move (some are slow to generate)."""
    for env_id in offline_games():
        env = TextArenaEnv(env_id)
        assert env.reset(0).strip(), env_id
        obs, reward, done, info = env.step("[1 1]")
        assert isinstance(obs, str) and isinstance(info["action_is_valid"], bool), env_id


# ---- training (slow: a compile per game) ----

SHORT_TURN = "Turn {turn}:\n{state}\nActions left: {actions_left}. Max {max_tokens} tokens."


@pytest.mark.slow
def test_three_games_train_a_step_each(tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from starpo_jax import api
    from starpo_jax.run import loop as runner

    for env_id in ("GuessTheNumber-v0", "TowerOfHanoi-v0", "Mastermind-v0"):
        name = f"textarena:{env_id}"
        c = api.config_for(name, "grpo", groups=2, group_size=2, reply_tokens=4, max_turns=2)
        c.model.source = "tiny-random"
        c.nothink = True
        c.host.workers = 2
        c.prompt.update(system="", intro="", turn=SHORT_TURN)
        c.steps, c.eval_every = 1, 1
        c.eval.update(episodes=2, modes="greedy")
        exp = api.build(c)
        assert runner.train(exp, tmp_path / env_id) == 1
        rows = [json.loads(x) for x in (tmp_path / env_id / "metrics.jsonl").read_text()
                .splitlines()]
        last = rows[-1]
        assert last["host/failed_rows"] == 0 and last["rollout/num_turns"] >= 1, env_id
        assert f"val/{name}/greedy/success" in last and "train/success" in last
        # The held-out games' prompts show the game's own first screen.
        evaluator = api.build_evaluator(exp)
        try:
            result = evaluator.evaluate(exp.state.actor)
            greedy = result.rollouts[name, "greedy"]
            for i, seed in enumerate(evaluator.seeds.tolist()):
                prompt = exp.tokenizer.decode(greedy.tokens[i, : int(greedy.prompt_lengths[i])])
                assert TextArenaEnv(env_id).reset(seed) in prompt
        finally:
            evaluator.close()


def _docs_section() -> str:
    text = DOCS.read_text()
    return text[text.index("## TextArena"):].split("\n## ")[0]


@pytest.mark.slow
def test_the_docs_command_trains_and_its_error_lines_are_the_adapters(tmp_path):
    """The TextArena section's run.py command, as written, with the tiny model and one step;
    the error lines its table shows are the ones a user sees, from run.py, with no traceback."""
    section = _docs_section()
    command = next(line for line in section.splitlines()
                   if line.startswith("python experiments/run.py"))
    args = command.split()[2:]
    args[args.index("--workdir") + 1] = str(tmp_path / "docs_run")
    tiny = ["--config.model.source=tiny-random", "--config.steps=1", "--config.eval_every=0",
            "--config.rollout.groups=2", "--config.rollout.group_size=2",
            "--config.rollout.reply_tokens=4", "--config.rollout.max_turns=2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "experiments/run.py", *args, *tiny], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = (tmp_path / "docs_run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(rows[-1])["step"] == 1
    shown = re.findall(r"`(error: textarena game [^`]+)`", section)
    assert len(shown) >= 2
    for line in shown:
        env_id = re.match(r"error: textarena game '([^']+)'", line).group(1)
        with pytest.raises(TextArenaGameError) as error:
            TextArenaEnv(env_id)
        assert line == f"error: {error.value}"
    args[args.index("--workdir") + 1] = str(tmp_path / "refused")
    failed = subprocess.run([sys.executable, "experiments/run.py", *args, *tiny,
                             "--config.env.name=textarena:TicTacToe-v0"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, env=env)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "error: textarena game 'TicTacToe-v0' cannot run here: it is a multi-player game" \
        in failed.stderr


def test_the_docs_table_of_games_is_the_adapters():
    """docs/environments.md's table: its first row is offline_games() (by game), each game of
    the other rows is refused for the row's reason."""
    table = _docs_section().split("| games | here |\n|---|---|\n")[1].split("\n\n")[0]
    rows = [line.split(" | ") for line in table.splitlines()]
    names = lambda cell: [n.strip() for n in re.sub(r"\(.*?\)| and the other .*", "",  # noqa
                                                     cell.strip("| ")).split(",")]
    assert set(names(rows[0][0])) == {g.split("-v0")[0] for g in offline_games()}
    reasons = ["nltk data", "OpenRouter API", "does not import", "multi-player game"]
    assert len(rows) == 1 + len(reasons)
    for (games, _), reason in zip(rows[1:], reasons):
        for name in names(games):
            with pytest.raises(TextArenaGameError, match=reason):
                TextArenaEnv(f"{name}-v0")


def test_the_baseline_script_s_random_rows():
    """The random policy draws apart from the game's seed (drawn from it, it would play
    Mastermind's code first)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import textarena_baselines as baselines
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    assert set(baselines.SAMPLERS) <= set(offline_games())
    row = baselines.random_row("Mastermind-v0", 16, 8)
    assert row["success"] < 0.5 and row["valid"] > 0.9  # a repeated guess is invalid
    hanoi = baselines.random_row("TowerOfHanoi-v0", 16, 8)
    assert 0.0 < hanoi["valid"] < 1.0 and hanoi["success"] == 0.0  # 7 moves at best


@pytest.mark.slow
def test_the_baseline_script_s_zero_shot_row():
    """The zero-shot row runs the project's evaluator (the tiny model here)."""
    done = subprocess.run(
        [sys.executable, "experiments/textarena_baselines.py", "--games", "ThreeCardMonte-v0",
         "--episodes", "8", "--zero-shot-games", "ThreeCardMonte-v0", "--zero-shot-episodes",
         "2", "--turns", "1", "--model", "tiny-random"], cwd=ROOT, capture_output=True,
        text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT),
                                     "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ThreeCardMonte")]
    assert [line.split(" | ")[1] for line in table] == ["random (n=8)",
                                                        "tiny-random zero-shot (n=2)"]
