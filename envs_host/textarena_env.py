"""TextArena's single-player games (https://github.com/LeonGuertler/TextArena) as host envs.

    env = TextArenaEnv("GuessTheNumber-v0")   # envs_host.make("textarena:GuessTheNumber-v0")
    env.reset(3)       # the game's rules and first board, as TextArena shows them to the player
    env.step("10")     # ("The target number is higher.", 0.0, False,
                       #  {"success": False, "action_is_valid": True, ...})

One instance plays one game (a TextArena env id, e.g. "Mastermind-v0"; `game_kwargs` update
the id's registered arguments; `observation_tokens` sets the room for one observation) without
TextArena's wrappers: each observation is the messages the game sent the player since the last
one (its rules and board first, then its answers, boards and warnings), the echo of the
player's own move left out, the game's closing reason ("Congratulations! ...") added when it
ends. An action is the answer as written, wrapped in square brackets if it has none
(TextArena's ActionFormattingWrapper rule: "10" -> "[10]").

Rewards, done and success are TextArena's: reward 0 until the game ends, then the player's
reward from `close()` (1 for a win; most games give the fraction completed, or -1, otherwise;
a reward that is not a number, a bug of a few games' invalid-move ending, counts as 0);
success when the game ended with reward >= 1 and not on an invalid move. A move the game
rejects (its turn counter does not advance, or the game ends as "invalid_move") has
action_is_valid = action_is_effective = False: TextArena warns once and lets the player
retry, and ends the game at the next invalid move in a row. `reset(seed)` seeds Python's
`random` (the games' only randomness) with `seed`; the calls of all instances take turns under
one lock, each with its own `random` state, so threads do not mix their games and the
process's own `random` is left as it was.

Games that cannot run here are refused when the instance is built, with one line
(`TextArenaGameError`, a ValueError): multi-player games, games that fetch data or call models
over the network (nltk downloads, the OpenRouter API), games whose module does not import. The
check reads the game's source before importing it (TextArena downloads at import time).
`offline_games()` lists the registered games that pass it. textarena is an optional
dependency (`pip install "starpo-jax[textarena]"`), imported only when an instance is built.
"""

from __future__ import annotations

import importlib
import random
import re
import threading
from pathlib import Path
from typing import Any

from envs_host.base import EnvSettings, HostEnv
from envs_host.registry import register_namespace

# Marks, in a game's module source, of data fetched or models called over the network.
_NETWORK = (
    (re.compile(r"nltk\.download\(\s*['\"]([^'\"]+)"), "downloads nltk data ({}) at import"),
    (re.compile(r"EnglishDictionary\("), "downloads the nltk 'words' corpus (EnglishDictionary)"),
    (re.compile(r"OpenRouter|openrouter\.ai"), "asks LLMs through the OpenRouter API"),
    (re.compile(r"\brequests\.(?:get|post)\(|urlopen\(|load_dataset\("), "fetches data over HTTP"),
)
_LOCK = threading.Lock()  # TextArena's games draw from the process-wide `random`
_LOCK_TIMEOUT = 60.0


class TextArenaGameError(ValueError):
    """A TextArena game that cannot run as a host env here (the message says why)."""


def _textarena():
    try:
        import textarena
    except ImportError as error:
        raise ImportError('the TextArena envs need the textarena package: pip install '
                          '"starpo-jax[textarena]" (or textarena)') from error
    return textarena


def _spec(env_id: str):
    ta = _textarena()
    spec = ta.envs.registration.ENV_REGISTRY.get(env_id)
    if spec is None:
        raise TextArenaGameError(f"unknown textarena game {env_id!r}; single-player games that "
                                 f"run offline: {', '.join(offline_games())}")
    return spec


def _source(entry_point: Any) -> tuple[str, Path]:
    """The text and path of an entry point's module ("package.module:Class"), not imported."""
    module = entry_point.split(":")[0] if isinstance(entry_point, str) else entry_point.__module__
    root = Path(_textarena().__file__).parent.parent
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    return (path.read_text(encoding="utf-8") if path.is_file() else ""), path


def game_problem(env_id: str) -> str | None:
    """Why TextArena game `env_id` cannot run here, read from its module's source without
    importing it (None: no reason found). Unknown ids raise TextArenaGameError."""
    source, path = _source(_spec(env_id).entry_point)
    where = "/".join(path.parts[-4:])
    if not source:
        return f"its module {where} is missing from the installed textarena"
    try:
        compile(source, str(path), "exec")
    except SyntaxError as error:
        return f"its module {where} does not import (SyntaxError: {error.msg}, line {error.lineno})"
    for pattern, what in _NETWORK:
        found = list(dict.fromkeys(pattern.findall(source)))
        if found:
            return (f"it {what.format(', '.join(map(repr, found)))} ({where}), which needs the "
                    "network")
    states = sorted(set(re.findall(r"\bta\.(\w+State)\(", source)))
    if states and "SinglePlayerState" not in states:
        return f"it is a multi-player game ({', '.join(states)}); only single-player games run"
    return None


def offline_games() -> list[str]:
    """The registered single-player TextArena games `game_problem` finds nothing against
    (TextArena's "-raw" / "-train" variants left out: the adapter never wraps a game)."""
    registry = _textarena().envs.registration.ENV_REGISTRY
    ids = [i for i in registry if not i.endswith(("-raw", "-train"))]
    return [i for i in ids if "SinglePlayerState(" in _source(registry[i].entry_point)[0]
            and game_problem(i) is None]


class TextArenaEnv(HostEnv):
    """One single-player TextArena game (see the module docstring)."""

    instructions = ("You are playing a game; its rules come with the first observation. Each "
                    "turn, give one move between the answer tags, written as the game asks "
                    "(the square brackets around it may be left out).")
    action_names = None  # free text: the move as written
    observation_tokens = 384  # the rules and first board of the larger games
    settings = EnvSettings(max_turns=10, max_actions_per_turn=1, max_actions_per_traj=10)

    def __init__(self, env_id: str, observation_tokens: int | None = None, **game_kwargs: Any):
        spec = _spec(env_id)
        self.env_id = env_id
        if observation_tokens is not None:  # room for a larger game's first observation
            self.observation_tokens = int(observation_tokens)
        problem = game_problem(env_id)
        if problem:
            raise TextArenaGameError(f"textarena game {env_id!r} cannot run here: {problem}")
        try:
            module_name, _, class_name = spec.entry_point.partition(":")
            game_class = getattr(importlib.import_module(module_name), class_name)
        except Exception as error:  # noqa: BLE001  (a missing optional package, a broken module)
            raise TextArenaGameError(f"textarena game {env_id!r} cannot run here: its module "
                                     f"does not import ({type(error).__name__}: {error})") \
                from None
        self._game = game_class(**{**spec.kwargs, **game_kwargs})
        self._random: tuple | None = None
        self._done = True
        if "SinglePlayerState(" not in _source(spec.entry_point)[0]:
            self._single_player(0)  # a trial game where the source does not say

    def _single_player(self, seed: int) -> None:
        """Resets the game for one player; TextArenaGameError if it is not a one-player game
        (a multi-player game's state refuses one player, or is not a SinglePlayerState)."""
        try:
            self._call(random.seed, seed)  # for a game that draws before it seeds
            self._call(self._game.reset, num_players=1, seed=seed)
        except Exception as error:  # noqa: BLE001
            raise TextArenaGameError(f"textarena game {self.env_id!r} cannot run here: "
                                     f"reset(num_players=1) raised {type(error).__name__}: "
                                     f"{error}; only single-player games run") from None
        state = type(getattr(self._game, "state", None)).__name__
        if state != "SinglePlayerState":
            raise TextArenaGameError(f"textarena game {self.env_id!r} cannot run here: its "
                                     f"state is a {state}; only single-player games run")

    def _call(self, fn, *args, **kwargs):
        """fn(...) with this instance's own `random` state, one instance at a time."""
        if not _LOCK.acquire(timeout=_LOCK_TIMEOUT):
            raise RuntimeError(f"textarena {self.env_id!r}: another game's call held the lock "
                               f"for {_LOCK_TIMEOUT:.0f} s")
        outer = random.getstate()
        try:
            if self._random is not None:
                random.setstate(self._random)
            return fn(*args, **kwargs)
        finally:
            self._random = random.getstate()
            random.setstate(outer)
            _LOCK.release()

    def _messages(self) -> str:
        """The messages the game sent the player since the last call, as one text."""
        _, messages = self._call(self._game.get_observation)
        kinds = _textarena().ObservationType
        parts = [str(text).strip() for _, text, kind in messages if kind != kinds.PLAYER_ACTION]
        return "\n\n".join(p for p in parts if p)

    def reset(self, seed: int) -> str:
        self._single_player(seed)
        self._done = False
        return self._messages()

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError(f"textarena {self.env_id!r}: step after the game ended "
                               "(or before reset)")
        move = action.strip()
        if "[" not in move and "]" not in move:
            move = f"[{move}]"
        info = self._game.state.game_info[0]
        turns = info["turn_count"]
        done, _ = self._call(self._game.step, move)
        # TextArena counts a turn only for a valid move, or for the invalid one that ends it.
        valid = info["turn_count"] > turns and not info.get("invalid_move", False)
        text = self._messages()
        reward, success = 0.0, False
        if done:
            self._done = True
            rewards, game_info = self._call(self._game.close)
            ending = game_info[0]
            reward = (rewards or {}).get(0, 0.0)
            # Some games pass set_invalid_move's arguments in the wrong order: the reason as the
            # reward. Such a reward counts as 0.
            reward = float(reward) if isinstance(reward, (int, float)) else 0.0
            success = reward >= 1.0 and not ending.get("invalid_move", False)
            if ending.get("reason"):
                text = f"{text}\n\n{ending['reason']}".strip()
        return text, reward, bool(done), {"success": success, "action_is_valid": valid,
                                          "action_is_effective": valid}


register_namespace("textarena", TextArenaEnv, "env_id")
